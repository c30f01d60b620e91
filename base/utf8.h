#pragma once

// UTF-8 the way Node decodes it, for exec output and file names in JSON (api.md "Paths", "exec":
// output is decoded like Node's Buffer.toString('utf8')). That is the WHATWG Encoding Standard's
// UTF-8 decoder with replacement, which is also Unicode's "U+FFFD substitution of maximal
// subparts" (Unicode 15, section 3.9, Table 3-8).

#include <cstddef>
#include <string>
#include <string_view>

namespace nsbox::utf8 {

// Node's Buffer.toString('utf8'): every maximal subpart of an ill-formed sequence becomes one
// U+FFFD; surrogates (ED A0..BF), overlongs (C0, C1, E0 80..9F, F0 80..8F) and code points above
// U+10FFFF (F4 90..BF, F5..FF) are invalid. Valid input is returned unchanged.
std::string DecodeLossy(std::string_view bytes);

// True when `bytes` is well-formed UTF-8 (DecodeLossy would return it unchanged).
bool IsValid(std::string_view bytes);

// The length (0 to 3) of the incomplete but so-far-valid sequence at the end of `bytes`: the
// bytes a decoder still waits on at that point. Cutting them off leaves a prefix that decodes to
// the same text as it does inside the whole input, so a stream can be sent in pieces without
// splitting a character, as text or as raw bytes (base64 streams).
size_t IncompleteTailLength(std::string_view bytes);

// For text streams cut in arbitrary places (exec output chunks). Feed returns the decoded text of
// everything but an incomplete, so-far-valid sequence at the end (at most 3 bytes), which it keeps
// for the next chunk; the concatenation of every Feed() and Finish() equals DecodeLossy(whole
// input), and no character is split across two results. Finish() flushes the kept bytes (as one
// U+FFFD, like Node at the end of input) and leaves the decoder ready for a new stream.
class StreamDecoder {
 public:
  std::string Feed(std::string_view chunk);
  std::string Finish();

 private:
  std::string pending_;
};

// The same cut for raw bytes (base64 streams): Feed returns the bytes of everything but the
// incomplete, so-far-valid tail, which it keeps for the next chunk; Finish() returns the kept
// bytes as they are. The concatenation of the results is the input, byte for byte.
class StreamSplitter {
 public:
  std::string Feed(std::string_view chunk);
  std::string Finish();

 private:
  std::string pending_;
};

// JSON text (RFC 8259) with every `\uXXXX` escape of a lone UTF-16 surrogate inside a string (a
// high one not followed at once by an escaped low one, or a low one without its high one)
// replaced by `\ufffd`: what JavaScript's JSON.stringify writes for a string cut in the middle of
// a pair, which Node then writes as U+FFFD (its UTF-8 encoder replaces lone surrogates). Returns
// the text unchanged when it has none. Only escapes are looked at; the rest is left to the parser.
std::string ReplaceLoneSurrogateEscapes(std::string_view json);

}  // namespace nsbox::utf8
