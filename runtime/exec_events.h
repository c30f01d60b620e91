#pragma once

// How an exec's output log (runtime/exec_session.h) becomes NDJSON output events and the buffered
// answer's strings (docs/exec.md "NDJSON events carry offsets"): the cuts that keep a UTF-8
// character (text) or a group of three bytes (base64) whole, and the events' offsets.
//
// A text event carries whole characters of one stream, so the bytes of a character split by a
// chunk's end wait for the next bytes of their stream, and bytes of the other stream may come in
// between: such an event's bytes are not contiguous in the log. Its `offset` is that of its first
// byte and its `end` the offset after its last one, so a client that re-attaches at the greatest
// `end` it received continues exactly after what it has; the re-attach then starts each stream
// with the character begun before that offset, which it was not sent (Resume).

#include <boost/json.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/exec_session.h"

namespace nsbox::runtime {

// One stream's bytes given in pieces, cut where each cut encodes on its own as the whole stream
// would: an incomplete UTF-8 character (text) or the bytes short of a group of three (base64) at
// a piece's end wait for the next. The NDJSON events and the buffered answer both cut this way.
class StreamCut {
 public:
  explicit StreamCut(bool base64) : base64_(base64) {}

  // The bytes to encode now: `piece` after what was held, less what is held for the next. A view
  // of `piece` itself when nothing was held (no copy), else of a buffer of the cut's own; valid
  // until the next call.
  std::string_view Next(std::string_view piece);
  // What is still held, at the stream's end (text: U+FFFD once decoded; base64: padded).
  std::string Finish() { return std::exchange(held_, std::string()); }
  size_t held() const { return held_.size(); }

 private:
  bool base64_;
  std::string held_;
  std::string joined_;
};

// Turns the log into NDJSON output events: `offset` of the first raw byte, `end` after the last;
// text decoded as UTF-8 without splitting a character (bytes held back at a piece's end go with
// the next event of their stream), or base64 of the exact bytes.
class EventEncoder {
 public:
  explicit EventEncoder(bool base64) : base64_(base64) {}

  // Text only, before the first Encode of a reader that starts at `offset` > 0: `tail` holds the
  // last bytes (at most 3) of `stream` before that offset, each with its own offset, in order.
  // When they end with an incomplete character, it is held as if the encoder had read them, so
  // that the character goes whole, with its first byte's offset, in the stream's next event.
  void Resume(int stream, const std::vector<ExecSession::Piece>& tail);
  // nullopt when everything was held back.
  std::optional<boost::json::object> Encode(const ExecSession::Piece& p);
  // At the end of the output: what is still held (as U+FFFD), one event per stream.
  std::vector<boost::json::object> Finish();

 private:
  bool base64_;
  StreamCut cuts_[2] = {StreamCut(false), StreamCut(false)};
  uint64_t held_offset_[2] = {0, 0};  // of a stream's first held byte
  uint64_t held_end_[2] = {0, 0};     // after its last held byte
};

}  // namespace nsbox::runtime
