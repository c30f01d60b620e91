#include "base/base64.h"

#include <array>
#include <cerrno>
#include <cstdint>

namespace nsbox {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// Each byte's value in the alphabet, or -1. Output streams pass through here at hundreds of MB/s
// (nsbox exec), hence a table rather than a search per character.
constexpr std::array<int8_t, 256> kValues = [] {
  std::array<int8_t, 256> values{};
  values.fill(-1);
  for (int i = 0; i < 64; ++i)
    values[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  return values;
}();

Error Invalid(size_t offset) {
  return Error(EINVAL, "invalid base64 at offset " + std::to_string(offset));
}

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out((bytes.size() + 2) / 3 * 4, '=');
  const auto* in = reinterpret_cast<const unsigned char*>(bytes.data());
  char* o = out.data();
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3, o += 4) {
    const uint32_t n = uint32_t{in[i]} << 16 | uint32_t{in[i + 1]} << 8 | in[i + 2];
    o[0] = kAlphabet[n >> 18];
    o[1] = kAlphabet[n >> 12 & 63];
    o[2] = kAlphabet[n >> 6 & 63];
    o[3] = kAlphabet[n & 63];
  }
  if (const size_t left = bytes.size() - i; left > 0) {
    uint32_t n = uint32_t{in[i]} << 16;
    if (left == 2) n |= uint32_t{in[i + 1]} << 8;
    o[0] = kAlphabet[n >> 18];
    o[1] = kAlphabet[n >> 12 & 63];
    if (left == 2) o[2] = kAlphabet[n >> 6 & 63];
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  size_t len = text.size();
  size_t padding = 0;
  for (; padding < 2 && len > 0 && text[len - 1] == '='; ++padding) --len;
  const size_t rest = len % 4;  // characters after the last whole group
  const auto* in = reinterpret_cast<const unsigned char*>(text.data());
  std::string out(len / 4 * 3 + (rest > 1 ? rest - 1 : 0), '\0');
  char* o = out.data();
  uint32_t n = 0;
  for (size_t i = 0; i < len; ++i) {
    const int v = kValues[in[i]];
    if (v < 0) return Invalid(i);
    n = n << 6 | static_cast<uint32_t>(v);
    if (i % 4 == 3) {
      o[0] = static_cast<char>(n >> 16);
      o[1] = static_cast<char>(n >> 8 & 0xff);
      o[2] = static_cast<char>(n & 0xff);
      o += 3;
    }
  }
  if (rest == 1) return Invalid(len - 1);  // 6 bits: no byte ends there
  // Padding only completes a last group of 2 or 3 characters to 4.
  if (padding > 0 && (rest == 0 || rest + padding > 4)) return Invalid(len);
  if (rest > 1) {  // 2 or 3 characters: 1 or 2 bytes
    n <<= 6 * (4 - rest);
    o[0] = static_cast<char>(n >> 16);
    if (rest == 3) o[1] = static_cast<char>(n >> 8 & 0xff);
  }
  return out;
}

}  // namespace nsbox
