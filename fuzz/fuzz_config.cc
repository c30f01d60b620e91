// The small parsers the daemon and its CLI apply to bytes they did not write: config.json of a
// sandbox (DecodeConfig: the state dir may have been edited), the UTF-8 decoders that turn a
// command's output and file names into JSON, the ids, and the CLI's reading of an error body.
// Invariants: a decoded config re-encodes to bytes that decode to the same encoding; the lossy
// decoder's output is valid UTF-8 and equals the streaming decoder's, however the input is cut;
// the splitter gives back the input byte for byte.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/utf8.h"
#include "runtime/api_client.h"
#include "runtime/registry.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  namespace rt = nsbox::runtime;
  const std::string_view in(reinterpret_cast<const char*>(bytes), size);

  auto config = rt::DecodeConfig(in);
  if (config.ok()) {
    const std::string once = rt::EncodeConfig(*config);
    auto again = rt::DecodeConfig(once);
    Check(again.ok());
    Check(rt::EncodeConfig(*again) == once);
  }

  namespace utf8 = nsbox::utf8;
  const std::string lossy = utf8::DecodeLossy(in);
  Check(utf8::IsValid(lossy));
  Check(!utf8::IsValid(in) || lossy == in);
  const size_t step = size == 0 ? 1 : static_cast<size_t>(bytes[0] % 7) + 1;
  utf8::StreamDecoder decoder;
  utf8::StreamSplitter splitter;
  std::string streamed;
  std::string split;
  for (size_t off = 0; off < size; off += step) {
    streamed += decoder.Feed(in.substr(off, step));
    split += splitter.Feed(in.substr(off, step));
  }
  streamed += decoder.Finish();
  split += splitter.Finish();
  Check(streamed == lossy);
  Check(split == in);
  Check(utf8::IncompleteTailLength(in) <= 3);

  (void)rt::InvalidIdReason(in);
  (void)rt::HostnameFor(in, rt::IdHash(in));
  const rt::ApiErrorBody error =
      rt::ApiErrorBody::Parse(size == 0 ? 500 : 400 + bytes[0] % 200, in);
  Check(!error.message.empty());
  return 0;
}
