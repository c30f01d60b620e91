#include "base/utf8.h"

#include <cstdint>
#include <utility>

#include "base/strings.h"

namespace nsbox::utf8 {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// What a lead byte asks of the bytes after it (WHATWG Encoding, "UTF-8 decoder"): how many
// continuation bytes, and the range allowed for the first of them. The narrowed first ranges
// are what reject overlongs (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points above
// U+10FFFF (F4 90..BF); every later continuation byte is 80..BF.
struct Lead {
  int needed = 0;  // 0: not a lead byte (80..BF, C0, C1, F5..FF)
  uint8_t lower = 0x80;
  uint8_t upper = 0xBF;
};

Lead LeadOf(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  return {};
}

struct Step {
  size_t length;  // bytes taken: the whole character, or the maximal subpart to replace
  bool valid;
};

// The sequence that starts at bytes[i]: a well-formed character, or the maximal subpart of an
// ill-formed one (at least one byte), which the decoder replaces with one U+FFFD. A sequence cut
// by the end of the input is a maximal subpart of its remaining bytes.
Step StepAt(std::string_view bytes, size_t i) {
  const auto b0 = static_cast<uint8_t>(bytes[i]);
  if (b0 < 0x80) return {1, true};
  const Lead lead = LeadOf(b0);
  if (lead.needed == 0) return {1, false};
  for (int k = 1; k <= lead.needed; ++k) {
    if (i + k >= bytes.size()) return {static_cast<size_t>(k), false};
    const auto b = static_cast<uint8_t>(bytes[i + k]);
    const uint8_t lower = k == 1 ? lead.lower : 0x80;
    const uint8_t upper = k == 1 ? lead.upper : 0xBF;
    if (b < lower || b > upper) return {static_cast<size_t>(k), false};
  }
  return {static_cast<size_t>(lead.needed) + 1, true};
}

}  // namespace

std::string DecodeLossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t run_start = 0;  // start of the well-formed run not yet copied
  size_t i = 0;
  while (i < bytes.size()) {
    const Step step = StepAt(bytes, i);
    if (!step.valid) {
      out.append(bytes.substr(run_start, i - run_start));
      out.append(kReplacement);
      run_start = i + step.length;
    }
    i += step.length;
  }
  out.append(bytes.substr(run_start));
  return out;
}

bool IsValid(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const Step step = StepAt(bytes, i);
    if (!step.valid) return false;
    i += step.length;
  }
  return true;
}

size_t IncompleteTailLength(std::string_view bytes) {
  // A lead byte is never a continuation byte, so the decoder always starts a new sequence at
  // one: the last lead byte within the last 3 bytes decides. Its sequence is pending exactly when
  // every byte after it was accepted and more are needed.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t pos = n - back;
    const auto b = static_cast<uint8_t>(bytes[pos]);
    if (b >= 0x80 && b <= 0xBF) continue;
    if (LeadOf(b).needed == 0) return 0;
    const Step step = StepAt(bytes, pos);
    return !step.valid && step.length == back ? back : 0;
  }
  return 0;
}

std::string StreamDecoder::Feed(std::string_view chunk) {
  if (!pending_.empty()) {
    pending_.append(chunk);
    const std::string joined = std::move(pending_);
    pending_.clear();
    return Feed(joined);  // pending_ is empty now, so this does not recurse again
  }
  const size_t keep = IncompleteTailLength(chunk);
  pending_.assign(chunk.substr(chunk.size() - keep));
  return DecodeLossy(chunk.substr(0, chunk.size() - keep));
}

std::string StreamDecoder::Finish() {
  // Whatever is kept is an incomplete sequence: one U+FFFD, as at the end of Node's input.
  std::string out = DecodeLossy(pending_);
  pending_.clear();
  return out;
}

std::string StreamSplitter::Feed(std::string_view chunk) {
  pending_.append(chunk);
  const size_t keep = IncompleteTailLength(pending_);
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamSplitter::Finish() {
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

namespace {

// The value of 4 hex digits at `text[at]`, or -1.
int Hex4(std::string_view text, size_t at) {
  if (at + 4 > text.size()) return -1;
  int v = 0;
  for (size_t k = at; k < at + 4; ++k) {
    const int d = HexDigitValue(text[k]);
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

std::string ReplaceLoneSurrogateEscapes(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  bool in_string = false;
  size_t i = 0;
  while (i < json.size()) {
    const char c = json[i];
    if (!in_string) {
      in_string = c == '"';
      out += c;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = false;
      out += c;
      ++i;
      continue;
    }
    if (c != '\\' || i + 1 >= json.size()) {
      out += c;
      ++i;
      continue;
    }
    if (json[i + 1] != 'u') {  // \" \\ \n ...: two characters, whatever they are
      out.append(json.substr(i, 2));
      i += 2;
      continue;
    }
    const int unit = Hex4(json, i + 2);
    if (unit >= 0xD800 && unit <= 0xDBFF && i + 12 <= json.size() && json[i + 6] == '\\' &&
        json[i + 7] == 'u') {
      const int low = Hex4(json, i + 8);
      if (low >= 0xDC00 && low <= 0xDFFF) {  // a pair: kept
        out.append(json.substr(i, 12));
        i += 12;
        continue;
      }
    }
    if (unit >= 0xD800 && unit <= 0xDFFF) {
      out += "\\ufffd";
      i += 6;
      continue;
    }
    out.append(json.substr(i, 2));  // any other escape (a bad one is the parser's to refuse)
    i += 2;
  }
  return out;
}

}  // namespace nsbox::utf8
