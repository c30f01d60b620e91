#pragma once

// The control channel between the host side (nsbox run's tests today, nsboxd next) and
// nsbox-init inside the jail: one SOCK_STREAM socketpair, binary frames, defined here once for
// both sides (Chromium's syscall_broker/ keeps its protocol in one place the same way).
//
// A frame is a 16-byte header and a payload:
//   u32 payload length | u16 type | u16 reserved (0) | u64 tag
// little-endian. The tag names the request a response belongs to; requests are answered out
// of order and many are in flight at once. File bytes travel raw (never base64); a file larger
// than kInlineFileLimit travels as an fd passed with SCM_RIGHTS beside a kFileFd or
// kWriteReady frame, so no transfer sits whole in either process's memory.
//
// Every length is bounded and checked: a payload over kMaxPayload is refused from its header
// alone (the bytes are skipped), and a payload that does not decode exactly is answered with an
// error. Nothing from the other side is trusted.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nsbox::fs::proto {

// 2: one tmpfs size in an adoption; 3: modes in stat and write; 4: a listing in ReaddirPart frames;
// 5: an adoption made ahead of its sandbox
inline constexpr uint32_t kVersion = 5;
inline constexpr size_t kHeaderSize = 16;
inline constexpr uint32_t kMaxPayload = 4u << 20;         // 4 MiB
inline constexpr uint32_t kMaxOutputChunk = 256u << 10;   // exec output per frame
inline constexpr uint64_t kInlineFileLimit = 256u << 10;  // readFile inline up to this
inline constexpr uint32_t kMaxPathBytes = 64u << 10;      // decoding bound, not PATH_MAX
inline constexpr uint32_t kMaxListEntries = 1u << 20;
// A directory's listing goes in frames of up to kReaddirPartBytes (kReaddirPart, then the last
// as kReaddirResult), its names sorted by byte value across them (the daemon passes them on as
// they come, runtime/listing.h), and all of them together carry at most kMaxReaddirBytes and
// kMaxListEntries names: beyond that nsbox-init answers E2BIG.
inline constexpr size_t kReaddirPartBytes = 1u << 20;
inline constexpr size_t kMaxReaddirBytes = 64u << 20;
inline constexpr uint32_t kMaxInputChunk = 256u << 10;  // exec input per kExecInput frame
inline constexpr uint16_t kMaxTtyDimension = 4096;      // rows and cols of a terminal, 1..this

enum class Type : uint16_t {
  // Requests: host -> init.
  kHello = 1,         // Hello: the jail's configuration, first frame, once
  kExec = 2,          // ExecRequest
  kExecKill = 3,      // ExecKill: ends a running exec (its tag)
  kExecInput = 4,     // ExecInput (own tag) -> kOk once written | kError (EPIPE: stdin closed)
  kExecResize = 5,    // ExecResize (own tag) -> kOk | kError (ENOTTY: not a terminal exec)
  kReadFile = 10,     // PathRequest -> kFileData | kFileFd | kError
  kWriteBegin = 11,   // WriteRequest -> kWriteReady (+fd) | kError
  kWriteCommit = 12,  // (empty; the kWriteBegin's tag) -> kOk | kError
  kWriteAbort = 13,   // (empty) -> kOk
  kStat = 14,         // PathRequest -> kStatResult | kError
  kReaddir = 15,      // ReaddirRequest -> kReaddirResult | kError
  kExists = 16,       // PathRequest -> kBool
  kMkdir = 17,        // MkdirRequest -> kOk | kError
  kRm = 18,           // RmRequest -> kOk | kError
  kPing = 30,         // -> kPong
  kStopAll = 31,      // ends every command (reason "stopped") -> kOk once they are gone

  // Responses: init -> host.
  kOk = 100,
  kError = 101,          // ErrorReply
  kExecStarted = 110,    // ExecStarted
  kExecOutput = 111,     // ExecOutput
  kExecExit = 112,       // ExecExit (the last frame of an exec)
  kFileData = 120,       // the whole file, raw, as the payload
  kFileFd = 121,         // U64 size; an O_RDONLY fd of the file rides along
  kWriteReady = 122,     // an O_WRONLY fd of the temp file rides along
  kStatResult = 123,     // StatReply
  kReaddirResult = 124,  // ReaddirReply: the last entries (all of them, for most directories)
  kBool = 125,           // one byte
  kReaddirPart = 126,  // ReaddirReply: some entries; more frames follow, the last a kReaddirResult
  kPong = 130,
};

std::string_view TypeName(Type type);
bool IsRequest(Type type);
bool IsResponse(Type type);

struct Header {
  uint32_t size = 0;
  Type type = Type::kPing;
  uint64_t tag = 0;
};
void EncodeHeader(const Header& h, char out[kHeaderSize]);
Header DecodeHeader(const char in[kHeaderSize]);

// A frame with its header, ready to send: EncodeFrame(type, tag, payload).
std::string EncodeFrame(Type type, uint64_t tag, std::string_view payload);

// ---- Bounded little-endian encoding -------------------------------------------------------

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I32(int32_t v) { U32(static_cast<uint32_t>(v)); }
  void F64(double v);
  void Bytes(std::string_view b);  // u32 length + bytes
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Every read checks the bytes left; after the first failure every read fails and ok() is
// false. Decoders end with Done(): the payload must be consumed exactly.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U8(uint8_t* v);
  bool Bool(bool* v);
  bool U32(uint32_t* v);
  bool U64(uint64_t* v);
  bool I32(int32_t* v);
  bool F64(double* v);
  bool Bytes(std::string* v, uint32_t max);
  bool Done() const { return ok_ && in_.empty(); }
  bool ok() const { return ok_; }

 private:
  bool Take(size_t n, const char** p);
  std::string_view in_;
  bool ok_ = true;
};

// ---- Messages ------------------------------------------------------------------------------

struct Rlimit {
  uint32_t resource = 0;
  uint64_t soft = 0;
  uint64_t hard = 0;
};

// What makes a jail started ahead of its sandbox (nsboxd's pool, docs/daemon.md "The pool")
// that sandbox's. nsbox-init, still privileged in its namespaces and with no command run yet,
// attaches the two trees that come with the hello frame (SCM_RIGHTS: the workspace's clone, then
// the home's), writes the sandbox's hosts and hostname files, sets the hostname, sizes the tmpfs
// of /tmp and /dev/shm, and makes the root read-only; then it goes on as any nsbox-init.
struct Adoption {
  std::string hostname;      // 1..64 bytes
  std::string etc_hosts;     // at most kMaxEtcFile bytes
  std::string etc_hostname;  // the same
  uint64_t tmpfs_size = 0;   // /tmp and /dev/shm together, in bytes; 0: the kernel's default
  // Made ahead of the sandbox it will serve (nsboxd's spare directories; the hostname and files
  // are placeholders the daemon rewrites): what nsbox-init makes ahead for the first command
  // waits for it, however long (exec::Runner::Anticipate's hold).
  bool ahead = false;
};
inline constexpr uint32_t kMaxEtcFile = 64u << 10;

// The jail's configuration for nsbox-init, sent once as the first frame.
struct Hello {
  uint32_t version = kVersion;
  std::string init_seccomp;     // raw struct sock_filter array for init itself ("" for none)
  std::string command_seccomp;  // the same for every command
  uint64_t capabilities = 0;    // the commands' capability set (a mask)
  uint32_t last_cap = 0;        // /proc/sys/kernel/cap_last_cap of the host
  std::vector<Rlimit> rlimits;  // for commands, already clamped
  std::string shell;            // "/bin/bash" or "/bin/sh"
  // Set exactly when nsbox-init was started for the pool (--adopt 1).
  std::optional<Adoption> adoption;
};

// The size of a terminal, in character cells; each 1..kMaxTtyDimension.
struct TtySize {
  uint16_t rows = 24;
  uint16_t cols = 80;
  bool operator==(const TtySize&) const = default;
};

struct ExecRequest {
  std::string command;           // run as `shell -c command` (unless argv is given)
  std::string cwd;               // absolute
  std::vector<std::string> env;  // "K=V", final
  std::optional<std::string> stdin_data;
  uint64_t timeout_ms = 0;  // 0: none
  uint64_t output_limit = 64ull << 20;
  // When not empty: these arguments run directly, without a shell (`command` is ignored);
  // argv[0] is searched in the PATH of `env` as execvp does when it has no '/'. For
  // `nsbox exec ID -- CMD ARGS...`.
  std::vector<std::string> argv;
  // stdin stays open after stdin_data (if any) and is fed by kExecInput frames until one of
  // them closes it. Without it, stdin is stdin_data then EOF, or /dev/null.
  bool stdin_stream = false;
  // Run on a pseudo-terminal of this size (a private devpts inside the jail): the command is a
  // session leader with it as its controlling terminal; stdin, stdout and stderr are all the
  // terminal, so the output arrives as stream 1 only. Input is always streamed then.
  std::optional<TtySize> tty;
};

// Bytes for the stdin (or the terminal) of a running exec, sent with a tag of its own and
// answered kOk once the bytes are written (that answer is the sender's flow control), or kError:
// EPIPE when stdin was closed or the command's end was reported, ESRCH for an unknown exec.
// `close`: after `data`, close stdin (on a terminal: send the EOF character, VEOF).
struct ExecInput {
  uint64_t exec_tag = 0;
  std::string data;  // at most kMaxInputChunk
  bool close = false;
};

// A new window size for a terminal exec (TIOCSWINSZ: the foreground process group gets
// SIGWINCH). Answered kOk, or kError: ENOTTY for an exec without a terminal, ESRCH unknown,
// EINVAL a size out of range.
struct ExecResize {
  uint64_t exec_tag = 0;
  TtySize size;
};

struct ExecKill {
  uint8_t reason = 0;  // exec::EndReason: kCancelled or kStopped
};

struct ExecStarted {
  uint32_t pid = 0;  // inside the jail
};

struct ExecOutput {
  uint8_t stream = 1;  // 1 stdout, 2 stderr
  std::string data;
};

// What a command consumed, from its own cgroup(s) where the host has the controller; nullopt
// where it does not (never a made-up zero).
struct ExecUsage {
  std::optional<uint64_t> cpu_user_us;
  std::optional<uint64_t> cpu_system_us;
  std::optional<uint64_t> memory_peak_bytes;
  std::optional<uint64_t> pids_peak;
  std::optional<uint64_t> io_read_bytes;
  std::optional<uint64_t> io_write_bytes;
  bool operator==(const ExecUsage&) const = default;
};

struct ExecExit {
  int32_t exit_code = 0;
  int32_t signal = 0;
  uint8_t reason = 0;  // exec::EndReason
  bool timed_out = false;
  bool truncated = false;
  bool cancelled = false;
  uint64_t duration_ms = 0;
  ExecUsage usage;
};

struct PathRequest {
  std::string path;  // absolute, normalised; raw bytes
};

struct WriteRequest {
  std::string path;
  // The new file's permission bits (at most 07777), or kKeepMode: an existing file's mode is
  // kept, a new file gets 0644 (api.md).
  uint32_t mode = kKeepMode;
  static constexpr uint32_t kKeepMode = 0xffffffff;
};

struct ReaddirRequest {
  std::string path;
  bool with_types = false;
};

struct MkdirRequest {
  std::string path;
  bool recursive = false;
};

struct RmRequest {
  std::string path;
  bool recursive = false;
  bool force = false;
};

struct ErrorReply {
  int32_t err = 0;      // errno; 0 for a protocol error
  std::string syscall;  // "open", "scandir", ...
  std::string path;
  std::string message;  // Node's message
  bool err_fs_eisdir = false;
};

struct StatReply {
  bool is_file = false;
  bool is_directory = false;
  bool is_symbolic_link = false;
  uint64_t size = 0;
  double mtime_ms = 0;
  uint32_t mode = 0;  // st_mode of the target (type and permission bits), as Node's Stats.mode
};

struct ReaddirReply {
  struct Entry {
    std::string name;
    uint8_t type = 0;  // fs::EntryType
  };
  std::vector<Entry> entries;
};

std::string Encode(const Hello& m);
std::string Encode(const ExecRequest& m);
std::string Encode(const ExecKill& m);
std::string Encode(const ExecInput& m);
std::string Encode(const ExecResize& m);
std::string Encode(const ExecStarted& m);
std::string Encode(const ExecOutput& m);
std::string Encode(const ExecExit& m);
std::string Encode(const PathRequest& m);
std::string Encode(const WriteRequest& m);
std::string Encode(const ReaddirRequest& m);
std::string Encode(const MkdirRequest& m);
std::string Encode(const RmRequest& m);
std::string Encode(const ErrorReply& m);
std::string Encode(const StatReply& m);
std::string Encode(const ReaddirReply& m);
std::string EncodeU64(uint64_t v);
std::string EncodeBool(bool v);

// Each returns false unless `payload` is exactly one well-formed message.
bool Decode(std::string_view payload, Hello* m);
bool Decode(std::string_view payload, ExecRequest* m);
bool Decode(std::string_view payload, ExecKill* m);
bool Decode(std::string_view payload, ExecInput* m);
bool Decode(std::string_view payload, ExecResize* m);
bool Decode(std::string_view payload, ExecStarted* m);
bool Decode(std::string_view payload, ExecOutput* m);
bool Decode(std::string_view payload, ExecExit* m);
bool Decode(std::string_view payload, PathRequest* m);
bool Decode(std::string_view payload, WriteRequest* m);
bool Decode(std::string_view payload, ReaddirRequest* m);
bool Decode(std::string_view payload, MkdirRequest* m);
bool Decode(std::string_view payload, RmRequest* m);
bool Decode(std::string_view payload, ErrorReply* m);
bool Decode(std::string_view payload, StatReply* m);
bool Decode(std::string_view payload, ReaddirReply* m);

// A directory's listing as the payloads of the frames that carry it, each a ReaddirReply of at
// most kReaddirPartBytes: the last is sent as kReaddirResult, the others before it as
// kReaddirPart. Empty when the listing is over kMaxReaddirBytes or kMaxListEntries names.
std::vector<std::string> EncodeReaddirParts(std::vector<ReaddirReply::Entry> entries);

// Gathers a listing from the payloads of its frames, in order, within the same bounds: Add is
// false for a payload that does not decode or that takes the listing over them.
class ReaddirGatherer {
 public:
  bool Add(std::string_view payload);
  ReaddirReply Take() { return std::move(listing_); }

 private:
  ReaddirReply listing_;
  size_t bytes_ = 0;
};
// One frame's listing read entry by entry without copying (nsboxd passes a listing on as it
// comes, a few entries at a time): the same checks as Decode. `payload` must outlive the cursor.
class ReaddirCursor {
 public:
  explicit ReaddirCursor(std::string_view payload);
  // The next entry (views into the payload); false at the end or at a malformed entry: then
  // ok() says which (a cursor that stopped at the end of a well-formed listing is ok).
  bool Next(std::string_view* name, uint8_t* type);
  bool ok() const { return ok_; }

 private:
  std::string_view in_;
  uint32_t left_ = 0;
  bool ok_ = true;
};

bool DecodeU64(std::string_view payload, uint64_t* v);
// ExecOutput without copying its data: `data` points into `payload`.
bool DecodeExecOutputView(std::string_view payload, uint8_t* stream, std::string_view* data);
// A whole kExecOutput frame built with one copy of `data` (the capture path's hot spot).
std::string EncodeExecOutputFrame(uint64_t tag, uint8_t stream, std::string_view data);
bool DecodeBool(std::string_view payload, bool* v);

// ---- Stream framing ------------------------------------------------------------------------

// Cuts a byte stream into frames. Feed it what arrives; Next() yields complete frames. A header
// announcing more than kMaxPayload yields a Frame with `oversized` set (its payload is skipped as
// it arrives), so the receiver can answer that tag with an error and go on.
class FrameReader {
 public:
  struct Frame {
    Header header;
    std::string payload;
    bool oversized = false;
  };
  // A frame whose payload points into the reader's buffer: valid until the next Feed.
  struct FrameView {
    Header header;
    std::string_view payload;
    bool oversized = false;
  };
  void Feed(std::string_view bytes);
  std::optional<Frame> Next();
  std::optional<FrameView> NextView();
  // Bytes buffered but not yet a whole frame.
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  uint64_t skip_ = 0;  // bytes of an oversized payload still to drop
};

}  // namespace nsbox::fs::proto
