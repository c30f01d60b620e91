// The control channel's decoders, as both sides use them: nsbox-init decodes requests from the
// host, the daemon decodes responses from nsbox-init (which a compromised jail could forge). The
// input is a byte stream cut into frames by FrameReader (fed in pieces of a size the first byte
// picks); every payload is also tried as each message. A message that decodes must re-encode to
// bytes that decode to the same encoding.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fs/protocol.h"

namespace {

using namespace nsbox::fs::proto;  // NOLINT: a fuzzer's whole subject

template <typename M>
void RoundTrip(std::string_view payload) {
  M m;
  if (!Decode(payload, &m)) return;
  const std::string once = Encode(m);
  M again;
  if (!Decode(once, &again)) std::abort();  // what Encode makes, Decode must take
  if (Encode(again) != once) std::abort();
}

void DecodeEverything(std::string_view payload) {
  RoundTrip<Hello>(payload);
  RoundTrip<ExecRequest>(payload);
  RoundTrip<ExecKill>(payload);
  RoundTrip<ExecStarted>(payload);
  RoundTrip<ExecOutput>(payload);
  RoundTrip<ExecExit>(payload);
  RoundTrip<PathRequest>(payload);
  RoundTrip<WriteRequest>(payload);
  RoundTrip<ReaddirRequest>(payload);
  RoundTrip<MkdirRequest>(payload);
  RoundTrip<RmRequest>(payload);
  RoundTrip<ErrorReply>(payload);
  RoundTrip<StatReply>(payload);
  RoundTrip<ReaddirReply>(payload);
  // The daemon's streaming reader takes exactly what Decode takes, the same entries, and its
  // views stay inside the payload.
  ReaddirReply listing;
  const bool decoded = Decode(payload, &listing);
  ReaddirCursor cursor(payload);
  std::string_view name;
  uint8_t type = 0;
  size_t n = 0;
  while (cursor.Next(&name, &type)) {
    if (name.data() < payload.data() ||
        name.data() + name.size() > payload.data() + payload.size()) {
      std::abort();
    }
    if (decoded && (n >= listing.entries.size() || listing.entries[n].name != name ||
                    listing.entries[n].type != type)) {
      std::abort();
    }
    ++n;
  }
  if (cursor.ok() != decoded || (decoded && n != listing.entries.size())) std::abort();
  uint64_t u = 0;
  if (DecodeU64(payload, &u) && EncodeU64(u) != payload) std::abort();
  bool b = false;
  (void)DecodeBool(payload, &b);
  uint8_t stream = 0;
  std::string_view data;
  if (DecodeExecOutputView(payload, &stream, &data)) {
    if (data.data() < payload.data() ||
        data.data() + data.size() > payload.data() + payload.size()) {
      std::abort();  // the view must point into the payload
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(bytes), size);
  DecodeEverything(in);
  const size_t step = size == 0 ? 1 : static_cast<size_t>(bytes[0] % 97) + 1;
  FrameReader owned;
  FrameReader viewed;
  for (size_t off = 0; off < size; off += step) {
    const std::string_view piece = in.substr(off, step);
    owned.Feed(piece);
    while (auto f = owned.Next()) {
      (void)TypeName(f->header.type);
      (void)IsRequest(f->header.type);
      if (f->oversized && !f->payload.empty()) std::abort();
      if (!f->oversized && f->payload.size() != f->header.size) std::abort();
      DecodeEverything(f->payload);
    }
    viewed.Feed(piece);
    while (auto v = viewed.NextView()) {
      if (!v->oversized && v->payload.size() != v->header.size) std::abort();
      if (v->header.size > kMaxPayload && !v->oversized) std::abort();
    }
  }
  if (owned.buffered() != viewed.buffered()) std::abort();
  return 0;
}
