#include "runtime/exec_events.h"

#include <utility>

#include "base/base64.h"
#include "base/utf8.h"

namespace nsbox::runtime {
namespace json = boost::json;

std::string_view StreamCut::Next(std::string_view piece) {
  std::string_view all = piece;
  if (!held_.empty()) {
    joined_ = std::move(held_);
    joined_.append(piece);
    all = joined_;
  }
  const size_t keep = base64_ ? all.size() % 3 : utf8::IncompleteTailLength(all);
  held_.assign(all.substr(all.size() - keep));
  return all.substr(0, all.size() - keep);
}

void EventEncoder::Resume(int stream, const std::vector<ExecSession::Piece>& tail) {
  if (base64_) return;
  const int i = stream == 2 ? 1 : 0;
  std::string bytes;
  for (const auto& p : tail) bytes += p.data;
  const size_t keep = utf8::IncompleteTailLength(bytes);
  if (keep == 0) return;
  // The held bytes' offsets: the tail's last `keep` bytes, wherever each piece lies in the log.
  size_t skip = bytes.size() - keep;
  bool first = true;
  for (const auto& p : tail) {
    if (skip >= p.data.size()) {
      skip -= p.data.size();
      continue;
    }
    if (first) held_offset_[i] = p.offset + skip;
    first = false;
    skip = 0;
    held_end_[i] = p.offset + p.data.size();
  }
  (void)cuts_[i].Next(bytes.substr(bytes.size() - keep));
}

std::optional<json::object> EventEncoder::Encode(const ExecSession::Piece& p) {
  const int i = p.stream == 2 ? 1 : 0;
  json::object o;
  o["type"] = i == 0 ? "stdout" : "stderr";
  if (base64_) {
    o["offset"] = p.offset;
    o["end"] = p.offset + p.data.size();
    o["dataBase64"] = Base64Encode(p.data);
    return o;
  }
  StreamCut& cut = cuts_[i];
  const uint64_t first = cut.held() > 0 ? held_offset_[i] : p.offset;
  const std::string_view bytes = cut.Next(p.data);
  const uint64_t piece_end = p.offset + p.data.size();
  // What is held now is the stream's last bytes: within this piece (the earlier held bytes went
  // with it), or, when the piece itself was all held, the earlier held bytes and this piece.
  if (cut.held() > 0 && cut.held() <= p.data.size()) {
    held_offset_[i] = piece_end - cut.held();
  }
  if (cut.held() > 0) held_end_[i] = piece_end;
  if (bytes.empty()) return std::nullopt;
  o["offset"] = first;
  o["end"] = piece_end - cut.held();
  o["data"] = utf8::DecodeLossy(bytes);
  return o;
}

std::vector<json::object> EventEncoder::Finish() {
  std::vector<json::object> out;
  for (int i = 0; i < 2; ++i) {
    const std::string held = cuts_[i].Finish();
    if (held.empty()) continue;
    json::object o;
    o["type"] = i == 0 ? "stdout" : "stderr";
    o["offset"] = held_offset_[i];
    o["end"] = held_end_[i];
    o["data"] = utf8::DecodeLossy(held);
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace nsbox::runtime
