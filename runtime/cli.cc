#include "runtime/cli.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/base64.h"
#include "base/files.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "images/store.h"
#include "isolate/cgroup.h"
#include "isolate/disk.h"
#include "runtime/cli/client.h"
#include "runtime/cli/commands.h"
#include "runtime/paths.h"
#include "runtime/registry.h"
#include "runtime/terminal.h"
#include "runtime/units.h"
#include "runtime/ws_exec.h"

namespace nsbox::runtime {

namespace cli {

namespace {

// What `nsbox cp` has moved, on one progress line (on a terminal only), rewritten at most every
// 100 ms: the file under way, its share when its size is known, the bytes of every file so far,
// and the rate.
class CopyProgress {
 public:
  explicit CopyProgress(bool shown) : shown_(shown) {}
  ~CopyProgress() { Done(); }

  // A file starts: its name as shown, its size when known.
  void File(std::string name, std::optional<uint64_t> size) {
    done_bytes_ += file_bytes_;
    file_bytes_ = 0;
    name_ = std::move(name);
    size_ = size;
    ++files_;
    Show(/*now=*/true);
  }
  // The current file's bytes moved so far. Its end is shown at once: an upload then waits for
  // the sandbox to make the file durable.
  void Moved(uint64_t file_bytes) {
    file_bytes_ = file_bytes;
    Show(size_ && file_bytes_ >= *size_);
  }
  void Done() { line_.Done(); }

 private:
  void Show(bool now) {
    if (!shown_) return;
    const auto t = std::chrono::steady_clock::now();
    if (!now && t - shown_at_ < std::chrono::milliseconds(100)) return;
    shown_at_ = t;
    std::string text = "copying " + name_;
    if (files_ > 1) text += " (file " + std::to_string(files_) + ")";
    text += ": " + Mebibytes(file_bytes_);
    if (size_) {
      text += " of " + Mebibytes(*size_) + " (" +
              std::to_string(*size_ == 0 ? 100
                                         : std::min<uint64_t>(file_bytes_, *size_) * 100 / *size_) +
              "%)";
    }
    const uint64_t all = done_bytes_ + file_bytes_;
    if (files_ > 1) text += "; " + Mebibytes(all) + " in all";
    const double seconds = std::chrono::duration<double>(t - start_).count();
    if (seconds >= 0.1) {
      char rate[32];
      std::snprintf(rate, sizeof rate, ", %.0f MiB/s",
                    static_cast<double>(all) / (1024.0 * 1024.0) / seconds);
      text += rate;
    }
    line_.Show(text);
  }

  const bool shown_;
  ProgressLine line_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point shown_at_{};
  std::string name_;
  std::optional<uint64_t> size_;
  uint64_t file_bytes_ = 0;
  uint64_t done_bytes_ = 0;  // of the files before this one
  uint64_t files_ = 0;
};

// ---- cp ----

// One side of `nsbox cp`: a host path ("-" for stdin or stdout), or ID:PATH in a sandbox.
struct CpSide {
  bool remote = false;
  std::string id;
  std::string path;
};

// Like docker cp: a path that starts with "/" or "." is on the host (write "./a:b" for a host
// file with a colon); otherwise "ID:PATH" splits at the first colon.
CpSide ParseCpSide(const std::string& arg) {
  CpSide side;
  side.path = arg;
  if (arg == "-" || arg.empty() || arg[0] == '/' || arg[0] == '.') return side;
  size_t colon = arg.find(':');
  if (colon == std::string::npos || colon == 0) return side;
  side.remote = true;
  side.id = arg.substr(0, colon);
  side.path = arg.substr(colon + 1);
  if (side.path.empty()) side.path = ".";  // "box:" is the sandbox's cwd
  return side;
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return dir + std::string(name);
  return dir + "/" + std::string(name);
}

// The last component, trailing slashes ignored: "a/b/" gives "b", "/" gives "".
std::string BaseName(std::string_view path) {
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

// docker cp's rule: copying "dir/." (or ".", or "/") into an existing directory copies what is
// in it, not the directory itself.
bool ContentsOnly(std::string_view path) {
  std::string base = BaseName(path);
  return base.empty() || base == "." || base == "..";
}

bool EndsWithSlash(std::string_view path) { return !path.empty() && path.back() == '/'; }

void SetPath(json::object& body, std::string_view path) {
  if (IsValidUtf8(path)) {
    body["path"] = path;
  } else {
    body["pathBase64"] = Base64Encode(path);  // exact bytes (api.md "Paths")
  }
}

struct RemoteStat {
  bool exists = false;
  bool is_dir = false;
  bool is_file = false;
  std::optional<uint64_t> size;
  std::optional<uint32_t> mode;  // st_mode, type and permission bits (absent from older daemons)
};

Result<RemoteStat> StatRemote(ApiClient& client, const std::string& id, const std::string& path) {
  json::object body;
  SetPath(body, path);
  auto answer = client.Call(Method::kPost, SandboxTarget(id, "/fs/stat"), body);
  if (!answer.ok()) return Transport(client, std::move(answer).error());
  RemoteStat st;
  if (answer->status == 404 && answer->error().code == "ENOENT") return st;
  if (!answer->ok()) return Error::Msg(answer->error().message);
  NSBOX_ASSIGN_OR_RETURN(json::value v, answer->Json());
  const json::object* o = v.if_object();
  if (o == nullptr) return Error::Msg("the daemon's stat answer is not an object");
  auto flag = [&](std::string_view key) {
    const json::value* f = o->if_contains(key);
    return f != nullptr && f->is_bool() && f->get_bool();
  };
  st.exists = true;
  st.is_dir = flag("isDirectory");
  st.is_file = flag("isFile");
  if (const json::value* size = o->if_contains("size"); size != nullptr && size->is_uint64()) {
    st.size = size->get_uint64();
  } else if (size != nullptr && size->is_int64() && size->get_int64() >= 0) {
    st.size = static_cast<uint64_t>(size->get_int64());
  }
  const json::value* mode = o->if_contains("mode");
  if (mode != nullptr && mode->is_int64() && mode->get_int64() >= 0 &&
      mode->get_int64() <= UINT32_MAX) {
    st.mode = static_cast<uint32_t>(mode->get_int64());
  }
  return st;
}

Status MkdirRemote(ApiClient& client, const std::string& id, const std::string& path) {
  json::object body;
  SetPath(body, path);
  body["recursive"] = true;
  NSBOX_TRY(Check(client, client.Call(Method::kPost, SandboxTarget(id, "/fs/mkdir"), body)));
  return Ok();
}

struct RemoteEntry {
  std::string name;  // exact bytes
  std::string type;  // file, directory, symlink, other
};

Result<std::vector<RemoteEntry>> ReadDirRemote(ApiClient& client, const std::string& id,
                                               const std::string& path) {
  json::object body;
  SetPath(body, path);
  body["withTypes"] = true;
  NSBOX_ASSIGN_OR_RETURN(
      ApiResponse answer,
      Check(client, client.Call(Method::kPost, SandboxTarget(id, "/fs/readdir"), body)));
  NSBOX_ASSIGN_OR_RETURN(json::value v, answer.Json());
  const json::object* o = v.if_object();
  const json::value* entries = o != nullptr ? o->if_contains("entries") : nullptr;
  if (entries == nullptr || !entries->is_array()) {
    return Error::Msg("the daemon's readdir answer has no \"entries\" list");
  }
  std::vector<RemoteEntry> out;
  for (const json::value& e : entries->get_array()) {
    const json::object* eo = e.if_object();
    if (eo == nullptr) continue;
    RemoteEntry entry;
    entry.type = JsonText(*eo, "type");
    if (const json::value* b64 = eo->if_contains("nameBase64"); b64 && b64->is_string()) {
      NSBOX_ASSIGN_OR_RETURN(entry.name, Base64Decode(b64->get_string()));
    } else {
      entry.name = JsonText(*eo, "name");
    }
    out.push_back(std::move(entry));
  }
  return out;
}

// `shown` names the file on the progress line. With `keep_mode`, a regular file's permission
// bits (set-id and sticky included) go with it, as cp -p and docker cp keep them; without (for
// standard input), the sandbox gives a new file 0644 and an existing one keeps its mode.
Status PutFile(ApiClient& client, const std::string& id, const std::string& path, int fd,
               const std::string& shown, CopyProgress& progress, bool keep_mode) {
  struct stat st {};
  std::optional<uint64_t> size;
  std::string target = FilesTarget(id, path);
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    size = static_cast<uint64_t>(st.st_size);
    if (keep_mode) {
      char mode[16];
      std::snprintf(mode, sizeof mode, "&mode=%o", st.st_mode & 07777);
      target += mode;
    }
  }
  progress.File(shown, size);
  ApiClient::UploadOptions upload;
  upload.on_sent = [&](uint64_t sent) { progress.Moved(sent); };
  NSBOX_TRY(Check(client, client.Upload(Method::kPut, target, fd, upload)));
  return Ok();
}

// The mode a new host file gets for a sandbox file of st_mode `mode` (umask applies, as for
// cp): its permission bits, never set-uid, set-gid or sticky: a sandbox must not plant set-id
// files on the host. 0666 when the daemon did not say.
mode_t HostFileMode(std::optional<uint32_t> mode) {
  return mode ? static_cast<mode_t>(*mode & 0777) : 0666;
}

// Streams a sandbox file into a host file that is opened by `open_file` only once the daemon
// has answered 200, so a failed copy does not leave an empty file behind.
// `size`, when known, is shown on the progress line.
Status GetFile(ApiClient& client, const std::string& id, const std::string& path,
               std::optional<uint64_t> size, CopyProgress& progress,
               const std::function<Result<UniqueFd>()>& open_file) {
  UniqueFd out;
  auto ensure_open = [&]() -> Status {
    if (out.valid()) return Ok();
    NSBOX_ASSIGN_OR_RETURN(out, open_file());
    return Ok();
  };
  progress.File(id + ":" + path, size);
  uint64_t got = 0;
  auto on_chunk = [&](std::string_view chunk) -> Status {
    NSBOX_TRY(ensure_open());
    NSBOX_TRY(WriteAll(out.get(), chunk, "write"));
    got += chunk.size();
    progress.Moved(got);
    return Ok();
  };
  NSBOX_TRY(Check(client, client.Download(FilesTarget(id, path), on_chunk)));
  return ensure_open();
}

// GetFile into `name` in the host directory `dirfd`, replacing what is there only once the whole
// file has arrived: it is written to a temp file beside it (".nsbox-cp-<random>"), which is
// renamed over `name` at the end and removed on any failure. A copy cut short (the daemon gone,
// a full disk, Ctrl-C) leaves the old file whole; it truncated it at the first byte. An existing
// file's permission bits stay, as cp keeps them; a new one gets `mode`.
Status GetFileReplacing(ApiClient& client, const std::string& id, const std::string& path,
                        std::optional<uint64_t> size, CopyProgress& progress, int dirfd,
                        const std::string& name, const std::string& shown, mode_t mode) {
  struct stat old {};
  if (::fstatat(dirfd, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(old.st_mode)) {
    mode = old.st_mode & 0777;
  }
  const std::string temp = ".nsbox-cp-" + RandomHex(16);
  bool made = false;
  Status got = GetFile(client, id, path, size, progress, [&]() -> Result<UniqueFd> {
    NSBOX_ASSIGN_OR_RETURN(UniqueFd fd,
                           OpenAt(dirfd, temp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode));
    made = true;
    // Exactly `mode`, whatever the umask took off (cp gives an existing file's bits back too).
    if (S_ISREG(old.st_mode) && ::fchmod(fd.get(), mode) != 0) {
      return Error::Sys("fchmod", shown, errno);
    }
    return fd;
  });
  if (got.ok() && ::renameat(dirfd, temp.c_str(), dirfd, name.c_str()) != 0) {
    got = Error::Sys("rename", shown, errno);
  }
  if (!got.ok() && made) (void)::unlinkat(dirfd, temp.c_str(), 0);
  return got;
}

struct Skipped {
  std::vector<std::string> items;
  void Add(std::string what) { items.push_back(std::move(what)); }
};

// The names in the host directory `dirfd`, sorted, without "." and "..".
Result<std::vector<std::string>> ListHostDir(int dirfd, const std::string& shown) {
  int copy = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return Error::Sys("fcntl", shown, errno);
  DIR* dir = ::fdopendir(copy);
  if (dir == nullptr) {
    int err = errno;
    UniqueFd closer(copy);
    return Error::Sys("fdopendir", shown, err);
  }
  ::rewinddir(dir);
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = ::readdir(dir)) {
    std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) return Error::Sys("readdir", shown, err);
  std::sort(names.begin(), names.end());
  return names;
}

// Host directory -> sandbox: mkdir, then a PUT per file; symlinks are not followed and other
// file types not copied (they are named in `skipped`).
Status UploadTree(ApiClient& client, const std::string& id, int dirfd, const std::string& shown,
                  const std::string& remote, Skipped& skipped, CopyProgress& progress) {
  NSBOX_TRY(MkdirRemote(client, id, remote));
  NSBOX_ASSIGN_OR_RETURN(std::vector<std::string> names, ListHostDir(dirfd, shown));
  for (const std::string& name : names) {
    std::string child_shown = JoinPath(shown, name);
    std::string child_remote = JoinPath(remote, name);
    struct stat st {};
    if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return Error::Sys("stat", child_shown, errno);
    }
    if (S_ISDIR(st.st_mode)) {
      NSBOX_ASSIGN_OR_RETURN(UniqueFd sub,
                             OpenAt(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
      NSBOX_TRY(UploadTree(client, id, sub.get(), child_shown, child_remote, skipped, progress));
    } else if (S_ISREG(st.st_mode)) {
      // O_NONBLOCK: if it was swapped for a FIFO since the stat, opening it must not hang.
      NSBOX_ASSIGN_OR_RETURN(UniqueFd file,
                             OpenAt(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK));
      NSBOX_TRY_CTX(PutFile(client, id, child_remote, file.get(), child_shown, progress,
                            /*keep_mode=*/true),
                    child_shown);
    } else if (S_ISLNK(st.st_mode)) {
      skipped.Add(child_shown + " (a symlink; symlinks are not copied)");
    } else {
      skipped.Add(child_shown + " (not a regular file or directory)");
    }
  }
  return Ok();
}

bool SafeName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

Status MkdirHostAt(int parent, const std::string& name, const std::string& shown) {
  if (::mkdirat(parent, name.c_str(), 0777) == 0) return Ok();
  int err = errno;
  struct stat st {};
  if (err == EEXIST && ::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISDIR(st.st_mode)) {
    return Ok();
  }
  return Error::Sys("mkdir", shown, err);
}

// Sandbox directory -> host directory `dirfd`: readdir withTypes, then a GET per file. Names
// come from the sandbox and are not trusted: each is one component, opened without following
// symlinks below `dirfd`.
Status DownloadTree(ApiClient& client, const std::string& id, const std::string& remote, int dirfd,
                    const std::string& shown, Skipped& skipped, CopyProgress& progress) {
  NSBOX_ASSIGN_OR_RETURN(std::vector<RemoteEntry> entries, ReadDirRemote(client, id, remote));
  for (const RemoteEntry& e : entries) {
    std::string child_remote = JoinPath(remote, e.name);
    std::string child_shown = JoinPath(shown, e.name);
    if (!SafeName(e.name)) {
      skipped.Add(id + ":" + child_remote + " (a name that is not a single path component)");
    } else if (e.type == "directory") {
      NSBOX_TRY(MkdirHostAt(dirfd, e.name, child_shown));
      NSBOX_ASSIGN_OR_RETURN(UniqueFd sub,
                             OpenAt(dirfd, e.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
      NSBOX_TRY(DownloadTree(client, id, child_remote, sub.get(), child_shown, skipped, progress));
    } else if (e.type == "file") {
      // Its mode (and size, for the progress line): readdir has only the type.
      NSBOX_ASSIGN_OR_RETURN(RemoteStat st, StatRemote(client, id, child_remote));
      if (st.exists && !st.is_file) {
        // What readdir saw is not what the path is: the jail's /dev/null and its like are the
        // host's device nodes bound over placeholder files, which readdir reports as files.
        skipped.Add(id + ":" + child_remote + " (not a regular file or directory)");
        continue;
      }
      NSBOX_TRY_CTX(GetFileReplacing(client, id, child_remote, st.size, progress, dirfd, e.name,
                                     child_shown, HostFileMode(st.mode)),
                    id + ":" + child_remote);
    } else if (e.type == "symlink") {
      skipped.Add(id + ":" + child_remote + " (a symlink; symlinks are not copied)");
    } else {
      skipped.Add(id + ":" + child_remote + " (not a regular file or directory)");
    }
  }
  return Ok();
}

Status CopyToSandbox(ApiClient& client, const std::string& src, const CpSide& dst, Skipped& skipped,
                     CopyProgress& progress) {
  if (src == "-") {
    // Standard input to one file: streamed with chunked transfer-encoding.
    return PutFile(client, dst.id, dst.path, STDIN_FILENO, "standard input", progress,
                   /*keep_mode=*/false);
  }
  struct stat st {};
  if (::stat(src.c_str(), &st) != 0) return Error::Sys("stat", src, errno);
  NSBOX_ASSIGN_OR_RETURN(RemoteStat target, StatRemote(client, dst.id, dst.path));
  if (S_ISDIR(st.st_mode)) {
    std::string remote = dst.path;
    if (target.exists && !target.is_dir) {
      return Error(ENOTDIR,
                   "cannot copy directory " + src + " onto file " + dst.id + ":" + dst.path);
    }
    if (target.exists && !ContentsOnly(src)) remote = JoinPath(dst.path, BaseName(src));
    NSBOX_ASSIGN_OR_RETURN(UniqueFd dir, OpenAt(AT_FDCWD, src, O_RDONLY | O_DIRECTORY));
    return UploadTree(client, dst.id, dir.get(), src, remote, skipped, progress);
  }
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return Error(EINVAL, src + ": not a regular file, directory or FIFO");
  }
  std::string remote = dst.path;
  if (target.is_dir) {
    remote = JoinPath(dst.path, BaseName(src));
  } else if (EndsWithSlash(dst.path)) {
    // As docker cp, and as a copy to the host: a path that ends with '/' names a directory that
    // must be there.
    return target.exists ? Error(ENOTDIR, dst.id + ":" + dst.path + ": not a directory")
                         : Error(ENOENT, dst.id + ":" + dst.path + ": no such directory");
  }
  NSBOX_ASSIGN_OR_RETURN(UniqueFd file, OpenAt(AT_FDCWD, src, O_RDONLY));
  return PutFile(client, dst.id, remote, file.get(), src, progress, /*keep_mode=*/true);
}

Status CopyFromSandbox(ApiClient& client, const CpSide& src, const std::string& dst,
                       Skipped& skipped, CopyProgress& progress) {
  NSBOX_ASSIGN_OR_RETURN(RemoteStat source, StatRemote(client, src.id, src.path));
  if (!source.exists) {
    return Error(ENOENT, "no such file or directory in sandbox " + src.id + ": " + src.path);
  }
  if (dst == "-") {
    if (source.is_dir) return Error(EISDIR, "cannot write a directory to standard output");
    return GetFile(client, src.id, src.path, source.size, progress,
                   [] { return Result<UniqueFd>(UniqueFd(::dup(1))); });
  }
  struct stat st {};
  bool exists = ::stat(dst.c_str(), &st) == 0;
  if (!exists && errno != ENOENT) return Error::Sys("stat", dst, errno);
  bool is_dir = exists && S_ISDIR(st.st_mode);
  if (source.is_dir) {
    if (exists && !is_dir) {
      return Error(ENOTDIR,
                   "cannot copy directory " + src.id + ":" + src.path + " onto file " + dst);
    }
    std::string local = dst;
    if (is_dir && !ContentsOnly(src.path)) local = JoinPath(dst, BaseName(src.path));
    if (::mkdir(local.c_str(), 0777) != 0 && errno != EEXIST) {
      return Error::Sys("mkdir", local, errno);
    }
    NSBOX_ASSIGN_OR_RETURN(UniqueFd dir, OpenAt(AT_FDCWD, local, O_RDONLY | O_DIRECTORY));
    return DownloadTree(client, src.id, src.path, dir.get(), local, skipped, progress);
  }
  std::string local = dst;
  if (is_dir) {
    local = JoinPath(dst, BaseName(src.path));
  } else if (EndsWithSlash(dst)) {
    return Error(ENOENT, dst + ": no such directory");
  }
  // A symlink at the destination is written through, as cp does: the file it names is replaced.
  struct stat link {};
  if (::lstat(local.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    char* real = ::realpath(local.c_str(), nullptr);
    if (real == nullptr) return Error::Sys("realpath", local, errno);
    local = real;
    std::free(real);
  }
  const size_t slash = local.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : local.substr(0, slash);
  NSBOX_ASSIGN_OR_RETURN(UniqueFd dir, OpenAt(AT_FDCWD, parent, O_RDONLY | O_DIRECTORY));
  return GetFileReplacing(client, src.id, src.path, source.size, progress, dir.get(),
                          local.substr(slash + 1), local, HostFileMode(source.mode));
}

int Copy(const Options& o, ApiClient& client) {
  CpSide src = ParseCpSide(o.src);
  CpSide dst = ParseCpSide(o.dst);
  std::string what = "cp " + o.src + " " + o.dst;
  if (src.remote == dst.remote) {
    return Fail("cp", "exactly one of SRC and DST must be ID:PATH in a sandbox (e.g. box:/a.txt)",
                kExitUsage);
  }
  if (src.remote && o.src == "-") return Fail("cp", "'-' is not a sandbox path", kExitUsage);
  Skipped skipped;
  // On a terminal, unless the file goes to standard output on that terminal too.
  CopyProgress progress(::isatty(STDERR_FILENO) == 1 && !(o.dst == "-" && ::isatty(1) == 1));
  Status st = dst.remote ? CopyToSandbox(client, o.src, dst, skipped, progress)
                         : CopyFromSandbox(client, src, o.dst, skipped, progress);
  progress.Done();
  for (const std::string& item : skipped.items) {
    std::fprintf(stderr, "nsbox: cp: skipped %s\n", EscapeControl(item).c_str());
  }
  if (!st.ok()) return Fail(what, st.error().message());
  return 0;
}

}  // namespace

}  // namespace cli

namespace {

using Options = ClientCommands::Options;

// ---- what the parse left over ----

// Runs after the parse, before CLI11 checks what is required and what is left over, to say
// what to do where CLI11 would not: a word no command took is an unknown command (CLI11: "A
// subcommand is required"), and an option exec or shell does not know is most likely the
// command's, given without "--" before it.
void CheckLeftovers(const CLI::App& app, const Options& o, const std::vector<std::string>& stray) {
  // The innermost command given, and its name: "image " for `nsbox image bogus`.
  const CLI::App* cmd = &app;
  std::string name;
  while (!cmd->get_subcommands().empty()) {
    cmd = cmd->get_subcommands().front();
    name += cmd->get_name() + " ";
  }
  std::vector<std::string> words;
  std::copy_if(stray.begin(), stray.end(), std::back_inserter(words),
               [](const std::string& w) { return !w.empty(); });
  if (!words.empty()) {
    if (cmd->get_require_subcommand_min() > 0) {
      throw CLI::ExtrasError("unknown command '" + name + words.front() + "'",
                             CLI::ExitCodes::ExtrasError);
    }
    throw CLI::ExtrasError(words);  // extra arguments of a command: CLI11's own message
  }
  if (cmd != o.exec && cmd != o.shell) return;
  std::vector<std::string> unknown;
  for (const std::string& arg : app.remaining(/*recurse=*/true)) {
    if (arg.size() > 1 && arg[0] == '-' && arg != "--") unknown.push_back(arg);
  }
  if (unknown.empty()) return;
  std::string text;
  for (const std::string& arg : unknown) text += (text.empty() ? "'" : ", '") + arg + "'";
  // The example puts the options right after the command's name: where they were, mostly. The
  // options' own callbacks have not run yet: their values are read as given.
  const std::vector<std::string>& id = cmd->get_option("id")->results();
  const std::vector<std::string>& command = cmd->get_option("command")->results();
  std::string example = "nsbox " + cmd->get_name() + " ID -- COMMAND...";
  if (id.size() == 1 && !command.empty()) {
    std::vector<std::string> words_of = {"nsbox", cmd->get_name(), id[0], "--", command[0]};
    words_of.insert(words_of.end(), unknown.begin(), unknown.end());
    words_of.insert(words_of.end(), command.begin() + 1, command.end());
    example = ShellCommand(words_of);
  }
  throw CLI::ExtrasError(cmd->get_name() + ": unknown option" + (unknown.size() > 1 ? "s " : " ") +
                             text + " (for the command's own options, put the command after " +
                             "'--': " + example + ")",
                         CLI::ExitCodes::ExtrasError);
}

}  // namespace

// ---- the commands ----

std::string ShellCommand(const std::vector<std::string>& args) {
  if (args.size() == 1) return args[0];
  std::string out;
  for (const std::string& arg : args) {
    if (!out.empty()) out += ' ';
    bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             std::string_view("-_./:,+%@").find(c) != std::string_view::npos;
    });
    // '=' is not plain: an unquoted NAME=VALUE first word would be an assignment, not argv[0].
    if (plain) {
      out += arg;
      continue;
    }
    // Single quotes keep everything but a single quote, which is closed, escaped, reopened.
    out += '\'';
    for (char c : arg) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

ClientCommands::ClientCommands(CLI::App& app) : options_(std::make_unique<Options>()) {
  Options& o = *options_;
  const std::string group =
      "Daemon connection (for create, ls, exec, shell, cp, stop, rm, network, image, port)";
  o.socket_opt =
      app.add_option("--socket", o.socket,
                     "nsboxd's Unix socket (env NSBOX_SOCKET; default " + DefaultSocketPath() + ")")
          ->group(group);
  o.url_opt = app.add_option("--url", o.url,
                             "reach nsboxd over TCP instead, http://HOST:PORT (env NSBOX_URL)")
                  ->group(group);
  o.token_opt =
      app.add_option("--token", o.token, "bearer token for --url (env NSBOX_TOKEN)")->group(group);

  o.create = app.add_subcommand(
      "create", "Create a persistent sandbox, or find the existing one: nsbox create ID");
  o.create->add_option("id", o.id, "the sandbox's id (any UTF-8, up to 256 bytes)")->required();
  o.create->add_option("--image", o.image, "root file system (default: host)");
  o.create->add_option("--memory,-m", o.memory,
                       "memory limit, e.g. 512M, 1.5G or 2G (at least 16M)");
  o.create->add_option("--disk", o.disk,
                       "the sandbox's own disk for its workspace and home (its image's changes), "
                       "e.g. 1G or 20G (16M to 8T), reserved on the host's disk now");
  o.create->add_option("--idle-stop", o.idle_stop,
                       "stop it (ending its processes, emptying /tmp; files stay) once it has "
                       "been idle this long, e.g. 15m or 2h (1s to 30d): no request using it "
                       "and no process of its own running; never: not even by the daemon's "
                       "--idle-stop");
  o.create->add_option("--pids", o.pids, "most processes and threads at once");
  o.create->add_option("--cpus", o.cpus, "CPU time limit in CPUs, e.g. 1.5");
  // allow_extra_args(false): one value per --env, so `--env A=1 ID` leaves ID alone.
  o.create->add_option("--env,-e", o.env, "base environment, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.create->add_option("--network", o.network_mode,
                       "none (default: loopback only), open (all egress but the host, link-local "
                       "and other sandboxes) or allow (only --allow entries)");
  o.create->add_option("--allow", o.allow,
                       "reachable name, *.wildcard, IPv4 address or CIDR, with an optional :PORT "
                       "(repeatable; implies --network allow)");
  o.create->add_flag("--json", o.json, "print the API's JSON");

  o.network = app.add_subcommand("network",
                                 "Show a sandbox's network policy, or replace it (running or not): "
                                 "nsbox network ID [none|open|allow] [--allow ENTRY]...");
  o.network->add_option("id", o.id, "the sandbox's id")->required();
  o.network->add_option("mode", o.network_mode, "none, open or allow (the new policy)");
  o.network->add_option("--allow", o.allow, "reachable name, *.wildcard, IPv4 or CIDR[:PORT]");
  o.network->add_flag("--json", o.json, "print the API's JSON");

  o.ls = app.add_subcommand("ls", "List sandboxes");
  o.ls->add_flag("--json", o.json, "print the API's JSON");

  o.exec = app.add_subcommand(
      "exec", "Run a command in a sandbox, output live: nsbox exec ID [OPTIONS] -- COMMAND...");
  o.exec->add_option("id", o.id, "the sandbox's id")->required();
  o.exec->add_option("--cwd", o.cwd, "working directory, relative to the sandbox's cwd");
  o.exec->add_option("--env,-e", o.env, "set a variable, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.exec->add_option("--timeout", o.timeout,
                     "kill the command after this many milliseconds (exit code 124; 0: never)");
  o.exec->add_flag("--interactive,-i", o.interactive,
                   "stream standard input to the command until EOF (over a WebSocket)");
  o.exec->add_flag("--tty,-t", o.tty,
                   "run the command on a terminal; this terminal goes raw and its size follows");
  o.exec
      ->add_option("command", o.command,
                   "one argument: a shell command line, as is; several: the command's argv")
      ->required();

  o.shell = app.add_subcommand(
      "shell",
      "An interactive login shell in a sandbox, on a terminal: nsbox shell ID [-- COMMAND...]");
  o.shell->add_option("id", o.id, "the sandbox's id")->required();
  o.shell->add_option("--cwd", o.cwd, "working directory, relative to the sandbox's cwd");
  o.shell->add_option("--env,-e", o.env, "set a variable, NAME=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.shell->add_option("command", o.command,
                      "run this instead of a login shell (bash, else sh), on the terminal");

  o.cp = app.add_subcommand(
      "cp", "Copy files between the host and a sandbox: nsbox cp SRC DST, one side ID:PATH");
  o.cp->add_option("src", o.src, "host path, '-' for standard input, or ID:PATH")->required();
  o.cp->add_option("dst", o.dst, "host path, '-' for standard output, or ID:PATH")->required();
  o.cp->footer(
      "A file's permission bits go with it both ways: a new host file gets them less set-uid,\n"
      "set-gid and sticky (and less the umask), an existing host file keeps its own mode, and\n"
      "standard input makes a new sandbox file 0644. Directories' modes are not copied.\n"
      "Inside a copied directory, symlinks are skipped (each named on stderr); a symlink given\n"
      "as SRC is followed. ID:PATH splits at the first ':', so an id with a ':' in it cannot be\n"
      "named here (nor a host path, unless it starts with '/' or '.': ./a:b).");

  o.stop = app.add_subcommand("stop", "Stop sandboxes (their processes end; files stay)");
  o.stop->add_option("id", o.ids, "the sandboxes' ids")->required();
  o.rm = app.add_subcommand("rm", "Remove sandboxes and all their files");
  o.rm->add_option("id", o.ids, "the sandboxes' ids")->required();

  o.image_cmd = app.add_subcommand("image", "Import, list and remove images");
  o.image_cmd->require_subcommand(1);
  o.image_import = o.image_cmd->add_subcommand(
      "import",
      "Import an image: nsbox image import NAME FILE (an OCI layout, a docker save tarball or a "
      "root file system tarball; or an OCI layout directory)");
  o.image_import->add_option("name", o.image_name, "the image's name, e.g. debian-12")->required();
  o.image_import->add_option("source", o.image_source, "the tarball or OCI layout directory")
      ->required();
  o.image_import->add_flag("--replace", o.replace,
                           "replace an image of that name (its sandboxes keep the old root)");
  o.image_import->add_option("--max-bytes", o.image_max_bytes,
                             "refuse the image if its import would write more than this, e.g. "
                             "2G (the daemon's --image-max-bytes bounds it too)");
  o.image_import->add_flag("--json", o.json, "print the API's JSON");
  o.image_ls = o.image_cmd->add_subcommand("ls", "List images");
  o.image_ls->add_flag("--json", o.json, "print the API's JSON");
  o.image_inspect = o.image_cmd->add_subcommand("inspect", "Print an image's JSON");
  o.image_inspect->add_option("name", o.image_name, "the image's name")->required();
  o.image_rm = o.image_cmd->add_subcommand("rm", "Remove images no sandbox uses");
  o.image_rm->add_option("name", o.image_names, "the images' names")->required();

  o.port_cmd = app.add_subcommand("port", "Expose a sandbox's TCP ports on the host");
  o.port_cmd->require_subcommand(1);
  o.port_add = o.port_cmd->add_subcommand(
      "add", "Listen on the host for a port inside: nsbox port add ID PORT; prints its URL");
  o.port_add->add_option("id", o.id, "the sandbox's id")->required();
  o.port_add->add_option("port", o.port, "the port inside, on 127.0.0.1 (1 to 65535)")->required();
  o.port_add->add_option("--host-port", o.host_port, "the host port (default: a free one)");
  o.port_add->add_option("--address", o.address,
                         "the host address to listen on (default 127.0.0.1)");
  o.port_ls = o.port_cmd->add_subcommand("ls", "List a sandbox's exposed ports");
  o.port_ls->add_option("id", o.id, "the sandbox's id")->required();
  o.port_ls->add_flag("--json", o.json, "print the API's JSON");
  o.port_rm = o.port_cmd->add_subcommand("rm", "Close an exposed port and its connections");
  o.port_rm->add_option("id", o.id, "the sandbox's id")->required();
  o.port_rm->add_option("port", o.port, "the port inside")->required();

  // The words no command took, for CheckLeftovers: a positional of a nameless option group
  // (hidden from the usage line, which lists the app's own), whose callback force_callback runs
  // even when there are none, after the parse and before CLI11's checks of requirements and
  // extras.
  app.add_option_group("")
      ->add_option_function<std::vector<std::string>>(
          "stray",
          [&app, &o](const std::vector<std::string>& stray) { CheckLeftovers(app, o, stray); })
      ->force_callback();
}

namespace {
constexpr char kWordMark = '\x01';
}  // namespace

std::vector<std::string> ProtectWords(int argc, char** argv) {
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(argc));
  for (int i = 0; i < argc; ++i) {
    std::string word = argv[i];
    size_t at = 0;  // where a value begins: the word, or after "--name="
    if (word.starts_with("--")) {
      const size_t eq = word.find('=');
      at = eq == std::string::npos ? word.size() : eq + 1;
    }
    if (i > 0 && at < word.size() && (word[at] == '[' || word[at] == kWordMark)) {
      word.insert(at, 1, kWordMark);
    }
    out.push_back(std::move(word));
  }
  return out;
}

void UnmarkValues(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    opt->transform(
        [](const std::string& value) -> std::string {
          return value.starts_with(kWordMark) ? value.substr(1) : value;
        },
        "", "unmark");
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) UnmarkValues(*sub);
}

ClientCommands::~ClientCommands() = default;

std::string ClientCommands::GlobalSocket() const { return options_->socket; }

std::optional<int> ClientCommands::Dispatch() {
  const Options& o = *options_;
  CLI::App* chosen = nullptr;
  for (CLI::App* cmd :
       {o.create, o.ls, o.exec, o.shell, o.cp, o.stop, o.rm, o.network, o.image_import, o.image_ls,
        o.image_inspect, o.image_rm, o.port_add, o.port_ls, o.port_rm}) {
    if (cmd->parsed()) chosen = cmd;
  }
  if (chosen == nullptr) return std::nullopt;
  auto endpoint = cli::Endpoint(o);
  if (!endpoint.ok())
    return cli::Fail(chosen->get_name(), endpoint.error().message(), cli::kExitUsage);
  ApiClient client(std::move(*endpoint));
  if (chosen == o.create) return cli::Create(o, client);
  if (chosen == o.ls) return cli::List(o, client);
  if (chosen == o.exec) return cli::Exec(o, client);
  if (chosen == o.shell) return cli::Shell(o, client);
  if (chosen == o.cp) return cli::Copy(o, client);
  if (chosen == o.stop) return cli::ForEachId(o, client, "stop");
  if (chosen == o.network) return cli::Network(o, client);
  if (chosen == o.image_import) return cli::ImportImage(o, client);
  if (chosen == o.image_ls) return cli::ListImages(o, client);
  if (chosen == o.image_inspect) return cli::InspectImage(o, client);
  if (chosen == o.image_rm) return cli::RemoveImages(o, client);
  if (chosen == o.port_add) return cli::AddPort(o, client);
  if (chosen == o.port_ls) return cli::ListPorts(o, client);
  if (chosen == o.port_rm) return cli::RemovePort(o, client);
  return cli::ForEachId(o, client, "rm");
}

}  // namespace nsbox::runtime
