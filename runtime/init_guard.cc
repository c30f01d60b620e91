#include "runtime/init_guard.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "base/files.h"
#include "base/strings.h"

namespace nsbox::runtime {

namespace {

// The overflow id (/proc/sys/kernel/overflowuid): "nobody", which owns nothing in a sandbox.
constexpr uint32_t kOverflowId = 65534;

struct MapLine {
  uint64_t inside;
  uint64_t count;
};

std::vector<MapLine> ParseMap(std::string_view text) {
  std::vector<MapLine> out;
  for (std::string_view line : Split(text, '\n')) {
    const std::vector<std::string> words = Words(line);
    if (words.size() != 3) continue;
    MapLine m{};
    uint64_t outside = 0;
    auto parse = [](const std::string& w, uint64_t* v) {
      auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), *v);
      return ec == std::errc() && end == w.data() + w.size();
    };
    if (!parse(words[0], &m.inside) || !parse(words[1], &outside) || !parse(words[2], &m.count)) {
      continue;
    }
    if (m.count > 0) out.push_back(m);
  }
  return out;
}

Result<std::optional<uint32_t>> OtherIdOf(const char* map_path, uint32_t except) {
  NSBOX_ASSIGN_OR_RETURN(std::string text, ReadFile(map_path));
  return AnotherMappedId(text, except);
}

}  // namespace

std::optional<uint32_t> AnotherMappedId(std::string_view map_text, uint32_t except) {
  const std::vector<MapLine> lines = ParseMap(map_text);
  auto mapped = [&](uint64_t id) {
    return std::any_of(lines.begin(), lines.end(), [id](const MapLine& m) {
      return id >= m.inside && id - m.inside < m.count;
    });
  };
  if (except != kOverflowId && mapped(kOverflowId)) return kOverflowId;
  std::optional<uint64_t> lowest;
  for (const MapLine& m : lines) {
    // The lowest id of this line that is not `except`.
    uint64_t id = m.inside;
    if (id == except) {
      if (m.count < 2) continue;
      ++id;
    }
    if (id > UINT32_MAX - 1) continue;  // (uid_t)-1 means "unchanged" to setresuid
    if (!lowest || id < *lowest) lowest = id;
  }
  if (!lowest) return std::nullopt;
  return static_cast<uint32_t>(*lowest);
}

Result<SavedIds> GuardSavedIds() {
  SavedIds out;
  uid_t ruid, euid, suid;
  gid_t rgid, egid, sgid;
  if (::getresuid(&ruid, &euid, &suid) != 0) return Error::Sys("getresuid", "nsbox-init", errno);
  if (::getresgid(&rgid, &egid, &sgid) != 0) return Error::Sys("getresgid", "nsbox-init", errno);
  // The saved id must differ from the real one and from the effective one (0 and 0 here: the
  // jail made us root of its namespace).
  NSBOX_ASSIGN_OR_RETURN(std::optional<uint32_t> uid, OtherIdOf("/proc/self/uid_map", ruid));
  if (uid && *uid == euid) uid.reset();
  NSBOX_ASSIGN_OR_RETURN(std::optional<uint32_t> gid, OtherIdOf("/proc/self/gid_map", rgid));
  if (gid && *gid == egid) gid.reset();
  // glibc's wrappers, not raw syscalls: they change every thread of the process (there is one
  // now; its later threads copy the calling thread's credentials anyway).
  if (uid && ::setresuid(static_cast<uid_t>(-1), static_cast<uid_t>(-1), *uid) != 0) {
    return Error::Sys("setresuid", "the saved uid " + std::to_string(*uid), errno);
  }
  if (gid && ::setresgid(static_cast<gid_t>(-1), static_cast<gid_t>(-1), *gid) != 0) {
    return Error::Sys("setresgid", "the saved gid " + std::to_string(*gid), errno);
  }
  out.uid = uid;
  out.gid = gid;
  return out;
}

Result<std::vector<fs::proto::Rlimit>> ReadOwnLimits() {
  std::vector<fs::proto::Rlimit> out;
  for (int resource = 0; resource < RLIM_NLIMITS; ++resource) {
    struct rlimit value {};
    if (::getrlimit(static_cast<__rlimit_resource>(resource), &value) != 0) {
      return Error::Sys("getrlimit", "resource " + std::to_string(resource), errno);
    }
    out.push_back({static_cast<uint32_t>(resource), value.rlim_cur, value.rlim_max});
  }
  return out;
}

std::vector<fs::proto::Rlimit> CommandRlimits(const std::vector<fs::proto::Rlimit>& configured,
                                              const std::vector<fs::proto::Rlimit>& own_at_start) {
  std::vector<fs::proto::Rlimit> out = configured;
  for (const fs::proto::Rlimit& own : own_at_start) {
    const bool named =
        std::any_of(configured.begin(), configured.end(),
                    [&](const fs::proto::Rlimit& c) { return c.resource == own.resource; });
    if (!named) out.push_back(own);
  }
  return out;
}

void RaiseOwnSoftLimits() {
  for (int resource : {RLIMIT_CPU, RLIMIT_FSIZE}) {
    struct rlimit value {};
    if (::getrlimit(static_cast<__rlimit_resource>(resource), &value) != 0) continue;
    if (value.rlim_cur == value.rlim_max) continue;
    value.rlim_cur = value.rlim_max;
    (void)::setrlimit(static_cast<__rlimit_resource>(resource), &value);
  }
}

}  // namespace nsbox::runtime
