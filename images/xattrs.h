#pragma once

// Internal to images/: what the importer does with the xattrs of an image's entry, decided as
// plain values (unit-tested without privileges) before import_layers.cc applies them with
// fsetxattr.
//
//   user.*                 kept as they are: data of the image's own programs;
//   security.capability    rewritten as a version-3 file capability bound to the sandboxes' root
//                          (its rootid the host uid of root inside), as the kernel itself writes
//                          one set from inside a user namespace: on the host, where that uid is
//                          nobody's root, it grants nothing;
//   system.posix_acl_*     dropped with a note, like the ACLs libarchive parses: their entries
//                          name uids and gids of the image, which are not shifted;
//   anything else          dropped with a note (trusted.* and security.* are the host's: SELinux
//                          labels, IMA, overlayfs's own; other system.* names are not data).
//
// Bounds (docs/images.md "Limits"): what Linux keeps on one file, so that no honest image meets
// them and a hostile one cannot make the importer hold or set more.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "isolate/idmap.h"

namespace nsbox::images::internal {

inline constexpr size_t kMaxXattrNameBytes = 255;     // XATTR_NAME_MAX
inline constexpr size_t kMaxXattrValueBytes = 65536;  // XATTR_SIZE_MAX
inline constexpr size_t kMaxXattrListBytes = 65536;   // XATTR_LIST_MAX: the names, NUL-terminated
inline constexpr size_t kMaxXattrs = 128;

// One xattr as the archive gives it.
using Xattr = std::pair<std::string, std::string>;

struct XattrPlan {
  std::vector<Xattr> apply;         // in order, to set with fsetxattr (values rewritten)
  std::vector<std::string> acls;    // names of the POSIX ACL xattrs dropped
  std::vector<std::string> others;  // names of the other xattrs dropped
};

// The plan for the xattrs of one entry, `what` naming it in errors. A name that appears twice
// keeps its first value (libarchive's pax writer stores each xattr twice, as SCHILY.xattr.* and
// LIBARCHIVE.xattr.*, and its reader hands both back). Beyond the bounds, or a
// security.capability that is no file capability or whose rootid is outside `uids`: EINVAL.
Result<XattrPlan> PlanXattrs(const std::vector<Xattr>& xattrs, const isolate::IdRange& uids,
                             const std::string& what);

// `value`, a security.capability xattr of revision 1, 2 or 3 (linux/capability.h), as a revision
// 3 one whose rootid is the host uid of its root: image uid 0 for revisions 1 and 2 (which mean
// "the root of the file system's own namespace"), the rootid it names for revision 3; that id
// shifted into `uids` as owners are.
Result<std::string> RebindFileCapability(std::string_view value, const isolate::IdRange& uids,
                                         const std::string& what);

}  // namespace nsbox::images::internal
