#include "runtime/cli/commands.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
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
#include "runtime/cli/client.h"

namespace nsbox::runtime::cli {

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

}  // namespace

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

}  // namespace nsbox::runtime::cli
