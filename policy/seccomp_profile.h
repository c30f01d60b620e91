#pragma once

// The seccomp profile as data: which syscalls a jailed process may not make, each with the errno
// it gets instead and the reason. isolate/seccomp.h compiles a profile into a BPF program; the
// rules and their reasons are summarised in docs/seccomp.md.
//
// The profile is for x86_64 only: syscall numbers below are x86_64's and every other ABI (i386,
// x32) is refused outright by the compiled filter.

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace nsbox::policy {

// One comparison on a syscall argument. All but kAnyBitSet map one to one onto libseccomp's
// struct scmp_arg_cmp; libseccomp compares the full 64-bit register.
struct SyscallArgCmp {
  enum Op {
    kEq,        // arg == mask_or_value
    kNe,        // arg != mask_or_value
    kLt,        // arg < mask_or_value
    kLe,        // arg <= mask_or_value
    kGt,        // arg > mask_or_value
    kGe,        // arg >= mask_or_value
    kMaskedEq,  // (arg & mask_or_value) == value
    // (arg & mask_or_value) != 0. libseccomp has no "not equal under a mask", so the compiler
    // turns this into one kMaskedEq rule per bit of the mask.
    kAnyBitSet,
  };
  unsigned arg;  // 0..5
  Op op;
  uint64_t mask_or_value;  // the mask for kMaskedEq and kAnyBitSet, the operand otherwise
  uint64_t value = 0;      // the operand of kMaskedEq; unused otherwise
};

// `name` fails with `errno_value` when every comparison of `when` holds; always when `when` is
// empty. libseccomp allows one comparison per argument in a rule.
struct SyscallRule {
  const char* name;
  int errno_value;
  std::vector<SyscallArgCmp> when;
  const char* reason;
};

// `name` fails with `errno_value` unless argument `arg` is exactly one of `allowed` (all 64
// bits). This is the one shape a default-allow libseccomp filter cannot express (one comparison
// per argument and rule), so the compiler emits it in its own BPF preamble.
struct SyscallArgAllowlist {
  const char* name;
  unsigned arg;
  std::vector<uint64_t> allowed;
  int errno_value;
  const char* reason;
};

// A syscall numbered above SeccompProfile::enosys_above that was reviewed and is allowed.
struct NewerSyscall {
  const char* name;
  const char* reason;
};

// A profile: every syscall is allowed except what `deny` and `arg_allowlists` refuse, and except
// the syscalls numbered above `enosys_above`, which fail with ENOSYS unless listed in
// `allow_newer`. Derive another profile (the in-jail server's will need io_uring) by copying
// DefaultSeccompProfile() and calling Allow() or adding rules.
struct SeccompProfile {
  std::vector<SyscallRule> deny;
  std::vector<SyscallArgAllowlist> arg_allowlists;
  // The last syscall number whose semantics this profile was written against. A syscall added to
  // the kernel later gets ENOSYS, which libc reads as "old kernel" and falls back from, until
  // someone reviews it and lists it in `allow_newer` (runc's patchbpf does the same).
  uint32_t enosys_above = 0;
  std::vector<NewerSyscall> allow_newer;

  // Lifts every rule on `name`: drops its deny rules and argument allowlists and, when it is
  // numbered above `enosys_above`, lists it in `allow_newer` with `reason`. Both strings must
  // outlive the profile (string literals). For deriving a looser profile, such as the in-jail
  // server's, which needs io_uring.
  void Allow(const char* name, const char* reason);
};

// The profile every command of a sandbox runs under: Docker's default profile made stricter for
// a jail whose commands hold no capability over the host (security-references.md, section 4).
SeccompProfile DefaultSeccompProfile();

// nsbox-init's own profile: the default, less what only nsbox-init needs: clone3, to start each
// command inside its cgroup (CLONE_INTO_CGROUP), and io_uring, for its event loop.
SeccompProfile InitSeccompProfile();

// What a command's own filter adds on top of nsbox-init's, which it inherits: exactly the rules
// InitSeccompProfile lifted. Filters stack and the kernel takes the stricter answer, so a command
// runs under the default profile, while loading a filter of a few instructions instead of the
// whole default one (about 60 us on this kind of machine, per command).
SeccompProfile CommandOverInitSeccompProfile();

// The x86_64 number of a syscall added after set_mempolicy_home_node (450, Linux 5.17), for
// names the linked libseccomp cannot resolve (upstream 2.5.4 stops at 450). From the kernel's
// arch/x86/entry/syscalls/syscall_64.tbl; nullopt for any other name.
std::optional<int> X8664SyscallNumberFallback(std::string_view name);

struct SyscallNumber {
  const char* name;
  int nr;
};
// The whole fallback table, for tests that cross-check it against libseccomp.
std::span<const SyscallNumber> X8664SyscallNumberFallbacks();

}  // namespace nsbox::policy
