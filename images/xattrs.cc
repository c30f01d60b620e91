#include "images/xattrs.h"

#include <errno.h>

#include <set>

#include "base/strings.h"

namespace nsbox::images::internal {

namespace {

// linux/capability.h, spelled out: the header's struct names differ between kernel versions, and
// these numbers are ABI (the xattr's layout on disk).
constexpr uint32_t kCapRevisionMask = 0xff000000;
constexpr uint32_t kCapRevision1 = 0x01000000;
constexpr uint32_t kCapRevision2 = 0x02000000;
constexpr uint32_t kCapRevision3 = 0x03000000;
constexpr uint32_t kCapFlagsEffective = 0x000001;
constexpr size_t kCapSize1 = 4 + 8;          // magic_etc, one (permitted, inheritable) pair
constexpr size_t kCapSize2 = 4 + 2 * 8;      // two pairs: capabilities 0-63
constexpr size_t kCapSize3 = kCapSize2 + 4;  // and the rootid

uint32_t Le32(std::string_view bytes, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i)
    v |= uint32_t{static_cast<unsigned char>(bytes[at + i])} << (8 * i);
  return v;
}

void PutLe32(std::string& out, uint32_t v) {
  for (size_t i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

Error Bad(const std::string& what, const std::string& message) {
  return Error(EINVAL, what + ": " + message);
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

Result<std::string> RebindFileCapability(std::string_view value, const isolate::IdRange& uids,
                                         const std::string& what) {
  const std::string cap = "its security.capability";
  if (value.size() < 4) {
    return Bad(what,
               cap + " has " + std::to_string(value.size()) + " bytes: not a file capability");
  }
  const uint32_t magic = Le32(value, 0);
  const uint32_t revision = magic & kCapRevisionMask;
  const size_t want = revision == kCapRevision1   ? kCapSize1
                      : revision == kCapRevision2 ? kCapSize2
                      : revision == kCapRevision3 ? kCapSize3
                                                  : 0;
  if (want == 0 || value.size() != want) {
    return Bad(what, cap + " (" + std::to_string(value.size()) + " bytes, magic " +
                         std::to_string(magic >> 24) +
                         ") is not a revision 1, 2 or 3 file capability");
  }
  // The image's uid of the capability's root: the file system's own root for revisions 1 and 2.
  const uint64_t image_root = revision == kCapRevision3 ? Le32(value, kCapSize2) : 0;
  if (image_root < uids.inside || image_root - uids.inside >= uids.count) {
    return Bad(what, cap + " is bound to uid " + std::to_string(image_root) +
                         ", outside the sandbox's " + std::to_string(uids.count) + " ids");
  }
  const auto host_root = static_cast<uint32_t>(uids.outside + (image_root - uids.inside));
  std::string out;
  out.reserve(kCapSize3);
  PutLe32(out, kCapRevision3 | (magic & kCapFlagsEffective));
  out.append(value.substr(4, 8));  // capabilities 0-31: permitted, inheritable
  if (revision == kCapRevision1) {
    out.append(8, '\0');  // revision 1 has no capabilities 32-63
  } else {
    out.append(value.substr(12, 8));
  }
  PutLe32(out, host_root);
  return out;
}

Result<XattrPlan> PlanXattrs(const std::vector<Xattr>& xattrs, const isolate::IdRange& uids,
                             const std::string& what) {
  XattrPlan plan;
  std::set<std::string_view> seen;
  size_t list_bytes = 0;
  for (const auto& [name, value] : xattrs) {
    if (!seen.insert(name).second) continue;
    if (name.empty() || name.size() > kMaxXattrNameBytes) {
      return Bad(what, "an xattr name of " + std::to_string(name.size()) +
                           " bytes (Linux takes 1 to " + std::to_string(kMaxXattrNameBytes) + ")");
    }
    if (value.size() > kMaxXattrValueBytes) {
      return Bad(what, "the xattr " + Quote(name) + " has " + std::to_string(value.size()) +
                           " bytes, more than the " + std::to_string(kMaxXattrValueBytes) +
                           " Linux keeps");
    }
    list_bytes += name.size() + 1;
    if (seen.size() > kMaxXattrs || list_bytes > kMaxXattrListBytes) {
      return Bad(what, "more than " + std::to_string(kMaxXattrs) + " xattrs or " +
                           std::to_string(kMaxXattrListBytes) + " bytes of their names");
    }
    if (StartsWith(name, "user.")) {
      plan.apply.emplace_back(name, value);
    } else if (name == "security.capability") {
      NSBOX_ASSIGN_OR_RETURN(std::string rebound, RebindFileCapability(value, uids, what));
      plan.apply.emplace_back(name, std::move(rebound));
    } else if (name == "system.posix_acl_access" || name == "system.posix_acl_default") {
      plan.acls.push_back(name);
    } else {
      plan.others.push_back(name);
    }
  }
  return plan;
}

}  // namespace nsbox::images::internal
