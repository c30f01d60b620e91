#include "fs/protocol.h"

#include <algorithm>
#include <cstring>

namespace nsbox::fs::proto {

namespace {

// The wire is little-endian; so is every host nsbox runs on (x86_64, aarch64), but the
// conversion is spelled out so that the format does not depend on it.
void PutLe(char* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t GetLe(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  return v;
}

void PutStrings(Writer& w, const std::vector<std::string>& v) {
  w.U32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) w.Bytes(s);
}

bool GetStrings(Reader& r, std::vector<std::string>* v, uint32_t max_each) {
  uint32_t n = 0;
  if (!r.U32(&n) || n > kMaxListEntries) return false;
  v->clear();
  for (uint32_t i = 0; i < n; ++i) {
    std::string s;
    if (!r.Bytes(&s, max_each)) return false;
    v->push_back(std::move(s));
  }
  return true;
}

bool GetTtySize(Reader& r, TtySize* size) {
  uint32_t rows = 0;
  uint32_t cols = 0;
  if (!r.U32(&rows) || !r.U32(&cols) || rows == 0 || cols == 0 || rows > kMaxTtyDimension ||
      cols > kMaxTtyDimension) {
    return false;
  }
  size->rows = static_cast<uint16_t>(rows);
  size->cols = static_cast<uint16_t>(cols);
  return true;
}

}  // namespace

std::string_view TypeName(Type type) {
  switch (type) {
    case Type::kHello:
      return "hello";
    case Type::kExec:
      return "exec";
    case Type::kExecKill:
      return "exec-kill";
    case Type::kExecInput:
      return "exec-input";
    case Type::kExecResize:
      return "exec-resize";
    case Type::kReadFile:
      return "read-file";
    case Type::kWriteBegin:
      return "write-begin";
    case Type::kWriteCommit:
      return "write-commit";
    case Type::kWriteAbort:
      return "write-abort";
    case Type::kStat:
      return "stat";
    case Type::kReaddir:
      return "readdir";
    case Type::kExists:
      return "exists";
    case Type::kMkdir:
      return "mkdir";
    case Type::kRm:
      return "rm";
    case Type::kPing:
      return "ping";
    case Type::kStopAll:
      return "stop-all";
    case Type::kOk:
      return "ok";
    case Type::kError:
      return "error";
    case Type::kExecStarted:
      return "exec-started";
    case Type::kExecOutput:
      return "exec-output";
    case Type::kExecExit:
      return "exec-exit";
    case Type::kFileData:
      return "file-data";
    case Type::kFileFd:
      return "file-fd";
    case Type::kWriteReady:
      return "write-ready";
    case Type::kStatResult:
      return "stat-result";
    case Type::kReaddirResult:
      return "readdir-result";
    case Type::kBool:
      return "bool";
    case Type::kReaddirPart:
      return "readdir-part";
    case Type::kPong:
      return "pong";
  }
  return "unknown";
}

bool IsRequest(Type type) {
  switch (type) {
    case Type::kHello:
    case Type::kExec:
    case Type::kExecKill:
    case Type::kExecInput:
    case Type::kExecResize:
    case Type::kReadFile:
    case Type::kWriteBegin:
    case Type::kWriteCommit:
    case Type::kWriteAbort:
    case Type::kStat:
    case Type::kReaddir:
    case Type::kExists:
    case Type::kMkdir:
    case Type::kRm:
    case Type::kPing:
    case Type::kStopAll:
      return true;
    default:
      return false;
  }
}

bool IsResponse(Type type) { return !IsRequest(type) && TypeName(type) != "unknown"; }

void EncodeHeader(const Header& h, char out[kHeaderSize]) {
  PutLe(out, h.size, 4);
  PutLe(out + 4, static_cast<uint16_t>(h.type), 2);
  PutLe(out + 6, 0, 2);
  PutLe(out + 8, h.tag, 8);
}

Header DecodeHeader(const char in[kHeaderSize]) {
  Header h;
  h.size = static_cast<uint32_t>(GetLe(in, 4));
  h.type = static_cast<Type>(GetLe(in + 4, 2));
  h.tag = GetLe(in + 8, 8);
  return h;
}

std::string EncodeFrame(Type type, uint64_t tag, std::string_view payload) {
  std::string out(kHeaderSize + payload.size(), '\0');
  EncodeHeader({static_cast<uint32_t>(payload.size()), type, tag}, out.data());
  std::memcpy(out.data() + kHeaderSize, payload.data(), payload.size());
  return out;
}

void Writer::U32(uint32_t v) {
  char b[4];
  PutLe(b, v, 4);
  out_.append(b, 4);
}

void Writer::U64(uint64_t v) {
  char b[8];
  PutLe(b, v, 8);
  out_.append(b, 8);
}

void Writer::F64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  U64(bits);
}

void Writer::Bytes(std::string_view b) {
  U32(static_cast<uint32_t>(b.size()));
  out_.append(b);
}

bool Reader::Take(size_t n, const char** p) {
  if (!ok_ || in_.size() < n) {
    ok_ = false;
    return false;
  }
  *p = in_.data();
  in_.remove_prefix(n);
  return true;
}

bool Reader::U8(uint8_t* v) {
  const char* p;
  if (!Take(1, &p)) return false;
  *v = static_cast<uint8_t>(*p);
  return true;
}

bool Reader::Bool(bool* v) {
  uint8_t b;
  if (!U8(&b)) return false;
  if (b > 1) return ok_ = false;
  *v = b == 1;
  return true;
}

bool Reader::U32(uint32_t* v) {
  const char* p;
  if (!Take(4, &p)) return false;
  *v = static_cast<uint32_t>(GetLe(p, 4));
  return true;
}

bool Reader::U64(uint64_t* v) {
  const char* p;
  if (!Take(8, &p)) return false;
  *v = GetLe(p, 8);
  return true;
}

bool Reader::I32(int32_t* v) {
  uint32_t u;
  if (!U32(&u)) return false;
  *v = static_cast<int32_t>(u);
  return true;
}

bool Reader::F64(double* v) {
  uint64_t bits;
  if (!U64(&bits)) return false;
  std::memcpy(v, &bits, sizeof bits);
  return true;
}

bool Reader::Bytes(std::string* v, uint32_t max) {
  uint32_t n;
  if (!U32(&n)) return false;
  if (n > max) return ok_ = false;
  const char* p;
  if (!Take(n, &p)) return false;
  v->assign(p, n);
  return true;
}

// ---- Messages ------------------------------------------------------------------------------

std::string Encode(const Hello& m) {
  Writer w;
  w.U32(m.version);
  w.Bytes(m.init_seccomp);
  w.Bytes(m.command_seccomp);
  w.U64(m.capabilities);
  w.U32(m.last_cap);
  w.U32(static_cast<uint32_t>(m.rlimits.size()));
  for (const auto& r : m.rlimits) {
    w.U32(r.resource);
    w.U64(r.soft);
    w.U64(r.hard);
  }
  w.Bytes(m.shell);
  w.U8(m.adoption.has_value() ? 1 : 0);
  if (m.adoption) {
    w.Bytes(m.adoption->hostname);
    w.Bytes(m.adoption->etc_hosts);
    w.Bytes(m.adoption->etc_hostname);
    w.U64(m.adoption->tmpfs_size);
    w.U8(m.adoption->ahead ? 1 : 0);
  }
  return w.Take();
}

bool Decode(std::string_view payload, Hello* m) {
  Reader r(payload);
  uint32_t n = 0;
  if (!r.U32(&m->version) || !r.Bytes(&m->init_seccomp, 1u << 20) ||
      !r.Bytes(&m->command_seccomp, 1u << 20) || !r.U64(&m->capabilities) || !r.U32(&m->last_cap) ||
      !r.U32(&n) || n > 64) {
    return false;
  }
  m->rlimits.resize(n);
  for (auto& rl : m->rlimits) {
    if (!r.U32(&rl.resource) || !r.U64(&rl.soft) || !r.U64(&rl.hard)) return false;
  }
  bool adopt = false;
  if (!r.Bytes(&m->shell, 4096) || !r.Bool(&adopt)) return false;
  m->adoption.reset();
  if (adopt) {
    Adoption& a = m->adoption.emplace();
    if (!r.Bytes(&a.hostname, 64) || a.hostname.empty() || !r.Bytes(&a.etc_hosts, kMaxEtcFile) ||
        !r.Bytes(&a.etc_hostname, kMaxEtcFile) || !r.U64(&a.tmpfs_size) || !r.Bool(&a.ahead)) {
      return false;
    }
  }
  return r.Done();
}

std::string Encode(const ExecRequest& m) {
  Writer w;
  w.Bytes(m.command);
  w.Bytes(m.cwd);
  PutStrings(w, m.env);
  w.U8(m.stdin_data.has_value() ? 1 : 0);
  if (m.stdin_data) w.Bytes(*m.stdin_data);
  w.U64(m.timeout_ms);
  w.U64(m.output_limit);
  PutStrings(w, m.argv);
  w.U8(m.stdin_stream ? 1 : 0);
  w.U8(m.tty.has_value() ? 1 : 0);
  if (m.tty) {
    w.U32(m.tty->rows);
    w.U32(m.tty->cols);
  }
  return w.Take();
}

bool Decode(std::string_view payload, ExecRequest* m) {
  Reader r(payload);
  bool has_stdin = false;
  // cwd: any length the frame holds; one of PATH_MAX bytes or more fails in chdir, as api.md
  // says of a cwd that cannot be entered (exit code 1, the reason on stderr).
  if (!r.Bytes(&m->command, kMaxPayload) || !r.Bytes(&m->cwd, kMaxPayload) ||
      !GetStrings(r, &m->env, kMaxPayload) || !r.Bool(&has_stdin)) {
    return false;
  }
  m->stdin_data.reset();
  if (has_stdin) {
    std::string data;
    if (!r.Bytes(&data, kMaxPayload)) return false;
    m->stdin_data = std::move(data);
  }
  bool has_tty = false;
  if (!r.U64(&m->timeout_ms) || !r.U64(&m->output_limit) || !GetStrings(r, &m->argv, kMaxPayload) ||
      !r.Bool(&m->stdin_stream) || !r.Bool(&has_tty)) {
    return false;
  }
  m->tty.reset();
  if (has_tty) {
    TtySize size;
    if (!GetTtySize(r, &size)) return false;
    m->tty = size;
  }
  return r.Done();
}

std::string Encode(const ExecInput& m) {
  Writer w;
  w.U64(m.exec_tag);
  w.Bytes(m.data);
  w.U8(m.close ? 1 : 0);
  return w.Take();
}

bool Decode(std::string_view payload, ExecInput* m) {
  Reader r(payload);
  return r.U64(&m->exec_tag) && r.Bytes(&m->data, kMaxInputChunk) && r.Bool(&m->close) && r.Done();
}

std::string Encode(const ExecResize& m) {
  Writer w;
  w.U64(m.exec_tag);
  w.U32(m.size.rows);
  w.U32(m.size.cols);
  return w.Take();
}

bool Decode(std::string_view payload, ExecResize* m) {
  Reader r(payload);
  return r.U64(&m->exec_tag) && GetTtySize(r, &m->size) && r.Done();
}

std::string Encode(const ExecKill& m) {
  Writer w;
  w.U8(m.reason);
  return w.Take();
}

bool Decode(std::string_view payload, ExecKill* m) {
  Reader r(payload);
  return r.U8(&m->reason) && r.Done();
}

std::string Encode(const ExecStarted& m) {
  Writer w;
  w.U32(m.pid);
  return w.Take();
}

bool Decode(std::string_view payload, ExecStarted* m) {
  Reader r(payload);
  return r.U32(&m->pid) && r.Done();
}

std::string Encode(const ExecOutput& m) {
  Writer w;
  w.U8(m.stream);
  w.Bytes(m.data);
  return w.Take();
}

bool Decode(std::string_view payload, ExecOutput* m) {
  Reader r(payload);
  return r.U8(&m->stream) && (m->stream == 1 || m->stream == 2) && r.Bytes(&m->data, kMaxPayload) &&
         r.Done();
}

std::string Encode(const ExecExit& m) {
  Writer w;
  w.I32(m.exit_code);
  w.I32(m.signal);
  w.U8(m.reason);
  w.U8(m.timed_out);
  w.U8(m.truncated);
  w.U8(m.cancelled);
  w.U64(m.duration_ms);
  const std::optional<uint64_t>* fields[] = {&m.usage.cpu_user_us,       &m.usage.cpu_system_us,
                                             &m.usage.memory_peak_bytes, &m.usage.pids_peak,
                                             &m.usage.io_read_bytes,     &m.usage.io_write_bytes};
  uint8_t mask = 0;
  for (size_t i = 0; i < std::size(fields); ++i) {
    if (fields[i]->has_value()) mask |= static_cast<uint8_t>(1u << i);
  }
  w.U8(mask);
  for (const auto* f : fields) {
    if (f->has_value()) w.U64(**f);
  }
  return w.Take();
}

bool Decode(std::string_view payload, ExecExit* m) {
  Reader r(payload);
  uint8_t mask = 0;
  if (!r.I32(&m->exit_code) || !r.I32(&m->signal) || !r.U8(&m->reason) || !r.Bool(&m->timed_out) ||
      !r.Bool(&m->truncated) || !r.Bool(&m->cancelled) || !r.U64(&m->duration_ms) || !r.U8(&mask) ||
      mask >= (1u << 6)) {
    return false;
  }
  std::optional<uint64_t>* fields[] = {&m->usage.cpu_user_us,       &m->usage.cpu_system_us,
                                       &m->usage.memory_peak_bytes, &m->usage.pids_peak,
                                       &m->usage.io_read_bytes,     &m->usage.io_write_bytes};
  for (size_t i = 0; i < std::size(fields); ++i) {
    fields[i]->reset();
    if ((mask & (1u << i)) == 0) continue;
    uint64_t v = 0;
    if (!r.U64(&v)) return false;
    *fields[i] = v;
  }
  return r.Done();
}

std::string Encode(const PathRequest& m) {
  Writer w;
  w.Bytes(m.path);
  return w.Take();
}

bool Decode(std::string_view payload, PathRequest* m) {
  Reader r(payload);
  return r.Bytes(&m->path, kMaxPathBytes) && r.Done();
}

std::string Encode(const WriteRequest& m) {
  Writer w;
  w.Bytes(m.path);
  w.U32(m.mode);
  return w.Take();
}

bool Decode(std::string_view payload, WriteRequest* m) {
  Reader r(payload);
  return r.Bytes(&m->path, kMaxPathBytes) && r.U32(&m->mode) &&
         (m->mode <= 07777 || m->mode == WriteRequest::kKeepMode) && r.Done();
}

std::string Encode(const ReaddirRequest& m) {
  Writer w;
  w.Bytes(m.path);
  w.U8(m.with_types);
  return w.Take();
}

bool Decode(std::string_view payload, ReaddirRequest* m) {
  Reader r(payload);
  return r.Bytes(&m->path, kMaxPathBytes) && r.Bool(&m->with_types) && r.Done();
}

std::string Encode(const MkdirRequest& m) {
  Writer w;
  w.Bytes(m.path);
  w.U8(m.recursive);
  return w.Take();
}

bool Decode(std::string_view payload, MkdirRequest* m) {
  Reader r(payload);
  return r.Bytes(&m->path, kMaxPathBytes) && r.Bool(&m->recursive) && r.Done();
}

std::string Encode(const RmRequest& m) {
  Writer w;
  w.Bytes(m.path);
  w.U8(m.recursive);
  w.U8(m.force);
  return w.Take();
}

bool Decode(std::string_view payload, RmRequest* m) {
  Reader r(payload);
  return r.Bytes(&m->path, kMaxPathBytes) && r.Bool(&m->recursive) && r.Bool(&m->force) && r.Done();
}

std::string Encode(const ErrorReply& m) {
  Writer w;
  w.I32(m.err);
  w.Bytes(m.syscall);
  w.Bytes(m.path);
  w.Bytes(m.message);
  w.U8(m.err_fs_eisdir);
  return w.Take();
}

bool Decode(std::string_view payload, ErrorReply* m) {
  Reader r(payload);
  return r.I32(&m->err) && r.Bytes(&m->syscall, 64) && r.Bytes(&m->path, kMaxPathBytes) &&
         r.Bytes(&m->message, kMaxPathBytes + 4096) && r.Bool(&m->err_fs_eisdir) && r.Done();
}

std::string Encode(const StatReply& m) {
  Writer w;
  w.U8(static_cast<uint8_t>((m.is_file ? 1 : 0) | (m.is_directory ? 2 : 0) |
                            (m.is_symbolic_link ? 4 : 0)));
  w.U64(m.size);
  w.F64(m.mtime_ms);
  w.U32(m.mode);
  return w.Take();
}

bool Decode(std::string_view payload, StatReply* m) {
  Reader r(payload);
  uint8_t flags = 0;
  if (!r.U8(&flags) || flags > 7 || !r.U64(&m->size) || !r.F64(&m->mtime_ms) || !r.U32(&m->mode) ||
      !r.Done()) {
    return false;
  }
  m->is_file = flags & 1;
  m->is_directory = flags & 2;
  m->is_symbolic_link = flags & 4;
  return true;
}

std::string Encode(const ReaddirReply& m) {
  Writer w;
  w.U32(static_cast<uint32_t>(m.entries.size()));
  for (const auto& e : m.entries) {
    w.Bytes(e.name);
    w.U8(e.type);
  }
  return w.Take();
}

bool Decode(std::string_view payload, ReaddirReply* m) {
  Reader r(payload);
  uint32_t n = 0;
  if (!r.U32(&n) || n > kMaxListEntries) return false;
  m->entries.clear();
  for (uint32_t i = 0; i < n; ++i) {
    ReaddirReply::Entry e;
    if (!r.Bytes(&e.name, 255) || !r.U8(&e.type) || e.type > 3) return false;
    // What no directory holds: from a compromised nsbox-init, a way to list more than it could.
    if (e.name.empty() || e.name == "." || e.name == ".." ||
        e.name.find_first_of(std::string_view("/\0", 2)) != std::string::npos) {
      return false;
    }
    m->entries.push_back(std::move(e));
  }
  return r.Done();
}

std::vector<std::string> EncodeReaddirParts(std::vector<ReaddirReply::Entry> entries) {
  if (entries.size() > kMaxListEntries) return {};
  std::vector<std::string> parts;
  ReaddirReply part;
  size_t part_bytes = 4, total = 0;  // as Encode writes them: a count, then the entries
  for (auto& e : entries) {
    const size_t entry_bytes = 4 + e.name.size() + 1;
    total += entry_bytes;
    if (total > kMaxReaddirBytes) return {};
    if (part_bytes + entry_bytes > kReaddirPartBytes) {
      parts.push_back(Encode(part));
      part.entries.clear();
      part_bytes = 4;
    }
    part.entries.push_back(std::move(e));
    part_bytes += entry_bytes;
  }
  parts.push_back(Encode(part));
  return parts;
}

ReaddirCursor::ReaddirCursor(std::string_view payload) : in_(payload) {
  ok_ = in_.size() >= 4;
  if (ok_) {
    left_ = static_cast<uint32_t>(GetLe(in_.data(), 4));
    in_.remove_prefix(4);
    ok_ = left_ <= kMaxListEntries;
  }
  if (ok_ && left_ == 0) ok_ = in_.empty();
}

bool ReaddirCursor::Next(std::string_view* name, uint8_t* type) {
  if (!ok_ || left_ == 0) return false;
  ok_ = false;  // until the entry is read whole
  if (in_.size() < 4) return false;
  const size_t n = static_cast<size_t>(GetLe(in_.data(), 4));
  if (n > 255 || in_.size() < 4 + n + 1) return false;
  *name = in_.substr(4, n);
  *type = static_cast<uint8_t>(in_[4 + n]);
  // As Decode: nothing a directory could hold.
  if (*type > 3 || name->empty() || *name == "." || *name == ".." ||
      name->find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
    return false;
  }
  in_.remove_prefix(4 + n + 1);
  --left_;
  ok_ = left_ > 0 || in_.empty();
  return ok_;
}

bool ReaddirGatherer::Add(std::string_view payload) {
  bytes_ += payload.size();
  ReaddirReply part;
  if (bytes_ > kMaxReaddirBytes || !Decode(payload, &part) ||
      listing_.entries.size() + part.entries.size() > kMaxListEntries) {
    return false;
  }
  for (auto& e : part.entries) listing_.entries.push_back(std::move(e));
  return true;
}

bool DecodeExecOutputView(std::string_view payload, uint8_t* stream, std::string_view* data) {
  Reader r(payload);
  uint32_t n = 0;
  if (!r.U8(stream) || (*stream != 1 && *stream != 2) || !r.U32(&n)) return false;
  if (payload.size() != 5u + n) return false;
  *data = payload.substr(5);
  return true;
}

std::string EncodeExecOutputFrame(uint64_t tag, uint8_t stream, std::string_view data) {
  std::string out(kHeaderSize + 5 + data.size(), '\0');
  EncodeHeader({static_cast<uint32_t>(5 + data.size()), Type::kExecOutput, tag}, out.data());
  out[kHeaderSize] = static_cast<char>(stream);
  PutLe(out.data() + kHeaderSize + 1, data.size(), 4);
  std::memcpy(out.data() + kHeaderSize + 5, data.data(), data.size());
  return out;
}

std::string EncodeU64(uint64_t v) {
  Writer w;
  w.U64(v);
  return w.Take();
}

bool DecodeU64(std::string_view payload, uint64_t* v) {
  Reader r(payload);
  return r.U64(v) && r.Done();
}

std::string EncodeBool(bool v) {
  Writer w;
  w.U8(v);
  return w.Take();
}

bool DecodeBool(std::string_view payload, bool* v) {
  Reader r(payload);
  return r.Bool(v) && r.Done();
}

// ---- Stream framing ------------------------------------------------------------------------

void FrameReader::Feed(std::string_view bytes) {
  if (skip_ > 0) {
    size_t drop = static_cast<size_t>(std::min<uint64_t>(skip_, bytes.size()));
    skip_ -= drop;
    bytes.remove_prefix(drop);
  }
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (64u << 10) && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);  // keep the buffer from growing with consumed bytes
    pos_ = 0;
  }
  buf_.append(bytes);
}

std::optional<FrameReader::FrameView> FrameReader::NextView() {
  if (skip_ > 0 || buf_.size() - pos_ < kHeaderSize) return std::nullopt;
  Header h = DecodeHeader(buf_.data() + pos_);
  if (h.size > kMaxPayload) {
    pos_ += kHeaderSize;
    size_t have = buf_.size() - pos_;
    size_t drop = static_cast<size_t>(std::min<uint64_t>(h.size, have));
    pos_ += drop;
    skip_ = h.size - drop;
    return FrameView{h, std::string_view(), true};
  }
  if (buf_.size() - pos_ - kHeaderSize < h.size) return std::nullopt;
  FrameView f{h, std::string_view(buf_.data() + pos_ + kHeaderSize, h.size), false};
  pos_ += kHeaderSize + h.size;
  return f;
}

std::optional<FrameReader::Frame> FrameReader::Next() {
  auto view = NextView();
  if (!view) return std::nullopt;
  return Frame{view->header, std::string(view->payload), view->oversized};
}

}  // namespace nsbox::fs::proto
