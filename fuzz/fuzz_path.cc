// Path normalisation (fs::ResolvePath, Node's path.posix.resolve) and in-root resolution
// (fs::OpenInRoot) on a tree made once in a temp dir: links to "/", to "../..", a loop, a link out
// of the tree to a directory beside it. Whatever the path, whichever resolver (openat2 or the
// O_NOFOLLOW walk), what is opened is inside the tree.

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/unique_fd.h"
#include "fs/path.h"
#include "fs/resolve.h"

namespace {

std::string g_root;  // the tree
int g_root_fd = -1;

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckNormal(const std::string& p) {
  Check(!p.empty() && p[0] == '/');
  Check(p == "/" || p.back() != '/');
  Check(p.find("//") == std::string::npos);
  Check(p.find("/./") == std::string::npos && p.find("/../") == std::string::npos);
  Check(!(p.size() >= 2 && p.compare(p.size() - 2, 2, "/.") == 0));
  Check(!(p.size() >= 3 && p.compare(p.size() - 3, 3, "/..") == 0));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/nsbox-fuzz-path-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) std::abort();
  const std::string top = tmpl;
  static std::string remove_at_exit = top;
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(remove_at_exit, ec);
  });
  g_root = top + "/root";
  mkdir(g_root.c_str(), 0755);
  mkdir((top + "/outside").c_str(), 0755);
  for (const char* d : {"/a", "/a/b", "/a/b/c", "/proc"}) mkdir((g_root + d).c_str(), 0755);
  FILE* f = fopen((g_root + "/a/file").c_str(), "w");
  if (f != nullptr) fclose(f);
  struct Link {
    const char* target;
    const char* name;
  };
  for (const Link& l : {Link{"/", "/l-root"}, Link{"../../..", "/a/b/l-up"}, Link{"/a/b", "/l-abs"},
                        Link{"loop2", "/loop1"}, Link{"loop1", "/loop2"},
                        Link{"../outside", "/l-out"}, Link{"/../outside", "/l-out-abs"},
                        Link{"/proc/self/root", "/l-magic"}, Link{"file", "/a/l-file"}}) {
    (void)!symlink(l.target, (g_root + l.name).c_str());
  }
  g_root_fd = open(g_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  return g_root_fd < 0 ? 1 : 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size == 0 || size > 5000) return 0;
  const std::string_view in(reinterpret_cast<const char*>(bytes) + 1, size - 1);
  static const char* const kBases[] = {"/", "/workspace", "/a/b", "/workspace/../x/.."};
  const std::string base = nsbox::fs::ResolvePath("/", kBases[bytes[0] % 4]);
  const std::string resolved = nsbox::fs::ResolvePath(base, in);
  CheckNormal(resolved);
  Check(nsbox::fs::ResolvePath("/", resolved) == resolved);   // idempotent
  Check(nsbox::fs::ResolvePath(base, resolved) == resolved);  // absolute ignores base
  if (in.find('\0') != std::string_view::npos) return 0;
  for (bool openat2 : {true, false}) {
    nsbox::fs::SetUseOpenat2(openat2);
    for (int flags : {O_PATH, O_PATH | O_NOFOLLOW, O_RDONLY | O_DIRECTORY}) {
      nsbox::UniqueFd fd;
      if (nsbox::fs::OpenInRoot(g_root_fd, in, flags, fd) != 0) continue;
      char link[64];
      char where[4096];
      snprintf(link, sizeof link, "/proc/self/fd/%d", fd.get());
      ssize_t n = readlink(link, where, sizeof where - 1);
      Check(n > 0);
      const std::string got(where, static_cast<size_t>(n));
      Check(got == g_root || got.rfind(g_root + "/", 0) == 0);  // never outside the tree
    }
  }
  nsbox::fs::SetUseOpenat2(true);
  return 0;
}
