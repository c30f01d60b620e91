#pragma once

// Compiles a policy::SeccompProfile into a classic BPF program (in the parent, with libseccomp)
// and loads it (in the child, between clone and execve, with one raw syscall).

#include <linux/filter.h>

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "policy/seccomp_profile.h"

namespace nsbox::isolate {

// A compiled filter: the BPF instructions and the sock_fprog that points at them, ready for
// seccomp(SECCOMP_SET_MODE_FILTER). Built once in the parent; the child only reads it.
class SeccompProgram {
 public:
  explicit SeccompProgram(std::vector<struct sock_filter> instructions);
  SeccompProgram(const SeccompProgram& other);
  SeccompProgram& operator=(const SeccompProgram& other);
  SeccompProgram(SeccompProgram&& other) noexcept;
  SeccompProgram& operator=(SeccompProgram&& other) noexcept;
  ~SeccompProgram() = default;

  const struct sock_fprog* fprog() const { return &fprog_; }
  size_t size() const { return instructions_.size(); }
  std::span<const struct sock_filter> instructions() const { return instructions_; }

 private:
  // Points fprog_ at instructions_ again after a copy or move.
  void Repoint();

  std::vector<struct sock_filter> instructions_;
  struct sock_fprog fprog_ {};
};

// The x86_64 number of a syscall: libseccomp's name table first, then
// policy::X8664SyscallNumberFallback for syscalls newer than the linked libseccomp. An error for
// a name that is neither, or that is not a syscall on x86_64 (umount, vm86).
Result<int> ResolveSyscallNumber(std::string_view name);

// Compiles `profile` for x86_64: libseccomp builds the rules (default action allow; any other
// architecture, i386 and x32 included, kills the process), and nsbox prepends a short preamble
// for what libseccomp cannot express: ENOSYS for syscalls above profile.enosys_above, and the
// argument allowlists. Uses libseccomp; call it in the parent, never after clone.
Result<SeccompProgram> CompileSeccomp(const policy::SeccompProfile& profile);

// Installs `program` on the calling thread with seccomp(SECCOMP_SET_MODE_FILTER). Returns 0 or
// an errno. Async-signal-safe (no allocation, no logging): meant for the child between clone and
// execve, after no_new_privs is set (without it the kernel answers EACCES unless the caller has
// CAP_SYS_ADMIN) and after every other set-up step, since the filter denies some of them.
// Without TSYNC: the child is single-threaded at that point.
int LoadSeccomp(const SeccompProgram& program) noexcept;

}  // namespace nsbox::isolate
