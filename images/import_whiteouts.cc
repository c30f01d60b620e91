#include "images/import_layers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/files.h"
#include "base/strings.h"
#include "images/import.h"

namespace nsbox::images::internal {

// A layer's whiteouts (the OCI image spec's "Whiteouts"): `.wh.NAME` removes NAME from the
// layers below, `.wh..wh..opq` empties its directory of them; what the layer itself wrote stays.

bool Unpacker::WrittenBelow(const std::string& rel) const {
  const std::string prefix = rel + "/";
  auto it = written_.lower_bound(prefix);
  return it != written_.end() && it->compare(0, prefix.size(), prefix) == 0;
}

Status Unpacker::RemoveLower(int parent_fd, const std::string& rel, const std::string& name) {
  if (written_.count(rel) == 0 && !WrittenBelow(rel)) {
    return RemoveTreeAt(parent_fd, name, "/" + rel);
  }
  struct stat st {};
  if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return Error::Sys("fstatat", "/" + rel, errno);
  }
  if (!S_ISDIR(st.st_mode)) return Ok();
  NSBOX_ASSIGN_OR_RETURN(UniqueFd dir, OpenAt(parent_fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW));
  return RemoveLowerIn(dir.get(), rel);
}

Status Unpacker::RemoveLowerIn(int dir_fd, const std::string& rel) {
  NSBOX_ASSIGN_OR_RETURN(UniqueFd fd, OpenAt(dir_fd, ".", O_RDONLY | O_DIRECTORY));
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::fdopendir(fd.get()), ::closedir);
  if (!dir) return Error::Sys("fdopendir", "/" + rel, errno);
  fd.release();  // the DIR owns it now
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    struct dirent* d = ::readdir(dir.get());
    if (d == nullptr) {
      if (errno != 0) return Error::Sys("readdir", "/" + rel, errno);
      break;
    }
    std::string_view n = d->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  dir.reset();  // one fd per level of the recursion, not two
  for (const std::string& n : names) NSBOX_TRY(RemoveLower(dir_fd, Child(rel, n), n));
  return Ok();
}

Status Unpacker::ApplyWhiteout(const std::string& raw, const std::vector<std::string>& parts) {
  const std::string& base = parts.back();
  std::vector<std::string> dir_parts(parts.begin(), parts.end() - 1);
  const std::string dir_rel = JoinParts(dir_parts, dir_parts.size());
  if (base != ".wh..wh..opq" && base.rfind(".wh..wh.", 0) == 0) {
    return Ok();  // aufs's own bookkeeping (.wh..wh.plnk, .wh..wh.aufs): no meaning here
  }
  NSBOX_ASSIGN_OR_RETURN(UniqueFd dir,
                         OpenDir("entry " + Quote(raw), dir_parts, dir_parts.size(), false));
  if (!dir.valid()) return Ok();  // nothing below to hide
  if (base == ".wh..wh..opq") return RemoveLowerIn(dir.get(), dir_rel);
  const std::string name = base.substr(4);
  if (name.empty() || name == "." || name == "..") {
    return BadInput("entry " + Quote(raw) + ": a whiteout of no name");
  }
  return RemoveLower(dir.get(), Child(dir_rel, name), name);
}

}  // namespace nsbox::images::internal
