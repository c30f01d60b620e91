#include "isolate/seccomp.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/bpf_common.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "base/syscalls.h"
#include "base/unique_fd.h"

namespace nsbox::isolate {

namespace {

using policy::SyscallArgCmp;

// The x32 ABI shares AUDIT_ARCH_X86_64 and marks its syscall numbers with this bit
// (__X32_SYSCALL_BIT). libseccomp's x86_64 filter kills them as a bad architecture.
constexpr uint32_t kX32SyscallBit = 0x40000000;
// The kernel caps SECCOMP_RET_ERRNO's data at MAX_ERRNO.
constexpr int kMaxErrno = 4095;
constexpr unsigned kMaxArgs = 6;

// Offsets into struct seccomp_data. x86_64 is little-endian: an argument's low half comes first.
constexpr uint32_t kNrOffset = offsetof(struct seccomp_data, nr);
constexpr uint32_t kArchOffset = offsetof(struct seccomp_data, arch);
constexpr uint32_t ArgLowOffset(unsigned arg) {
  return static_cast<uint32_t>(offsetof(struct seccomp_data, args) + 8 * arg);
}
constexpr uint32_t ArgHighOffset(unsigned arg) { return ArgLowOffset(arg) + 4; }

constexpr uint32_t RetErrno(int err) {
  return SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA);
}

std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

// A tiny assembler for the preamble: jumps name labels, resolved when the code is complete
// (classic BPF jumps are relative and only forward; conditional ones reach 255 instructions).
class BpfAssembler {
 public:
  static constexpr int kNext = -1;  // a conditional jump's "fall through"

  int NewLabel() {
    labels_.push_back(-1);
    return static_cast<int>(labels_.size()) - 1;
  }
  void Bind(int label) { labels_[label] = static_cast<int>(code_.size()); }

  void Load(uint32_t offset) { code_.push_back({BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset)}); }
  void Return(uint32_t action) { code_.push_back({BPF_STMT(BPF_RET | BPF_K, action)}); }
  // if (A <op> k) goto jt; else goto jf;  with op BPF_JEQ, BPF_JGT or BPF_JGE.
  void JumpIf(uint16_t op, uint32_t k, int jt, int jf) {
    code_.push_back({BPF_JUMP(BPF_JMP | op | BPF_K, k, 0, 0), jt, jf});
  }
  void Goto(int label) { code_.push_back({BPF_STMT(BPF_JMP | BPF_JA, 0), kNext, kNext, label}); }

  Result<std::vector<struct sock_filter>> Finish() const {
    std::vector<struct sock_filter> out;
    out.reserve(code_.size());
    for (size_t i = 0; i < code_.size(); ++i) {
      struct sock_filter f = code_[i].f;
      auto offset = [&](int label) -> Result<int> {
        if (label == kNext) return 0;
        const int off = labels_[label] - static_cast<int>(i) - 1;
        if (labels_[label] < 0 || off < 0) return Error::Msg("seccomp preamble: bad jump");
        return off;
      };
      NSBOX_ASSIGN_OR_RETURN(const int jt, offset(code_[i].jt));
      NSBOX_ASSIGN_OR_RETURN(const int jf, offset(code_[i].jf));
      if (jt > 255 || jf > 255) return Error::Msg("seccomp preamble: jump beyond 255");
      f.jt = static_cast<uint8_t>(jt);
      f.jf = static_cast<uint8_t>(jf);
      if (code_[i].ja != kNext) {
        NSBOX_ASSIGN_OR_RETURN(const int k, offset(code_[i].ja));
        f.k = static_cast<uint32_t>(k);
      }
      out.push_back(f);
    }
    return out;
  }

 private:
  struct Insn {
    struct sock_filter f;
    int jt = kNext;
    int jf = kNext;
    int ja = kNext;
  };
  std::vector<Insn> code_;
  std::vector<int> labels_;
};

struct NewerDeny {
  int nr;
  int errno_value;
};
struct ArgAllowlist {
  int nr;
  const policy::SyscallArgAllowlist* rule;
};

// The instructions that run before libseccomp's program (the "body"). Other architectures and x32
// numbers go straight to the body, which kills them. For native x86_64 syscalls:
//   nr > enosys_above: allow_newer continue to the body, denied newer calls get their errno, the
//     rest ENOSYS;
//   nr == an argument allowlist's syscall: continue to the body when the argument is listed,
//     else the list's errno.
// The body then decides as usual (for a syscall it has no rule for: allow).
Result<std::vector<struct sock_filter>> BuildPreamble(uint32_t enosys_above,
                                                      const std::vector<int>& allow_newer,
                                                      const std::vector<NewerDeny>& deny_newer,
                                                      const std::vector<ArgAllowlist>& lists) {
  BpfAssembler a;
  const int body = a.NewLabel();
  const int known = a.NewLabel();

  a.Load(kArchOffset);
  a.JumpIf(BPF_JEQ, AUDIT_ARCH_X86_64, BpfAssembler::kNext, body);
  a.Load(kNrOffset);
  a.JumpIf(BPF_JGE, kX32SyscallBit, body, BpfAssembler::kNext);
  a.JumpIf(BPF_JGT, enosys_above, BpfAssembler::kNext, known);

  // Newer than the profile.
  for (int nr : allow_newer) {
    a.JumpIf(BPF_JEQ, static_cast<uint32_t>(nr), body, BpfAssembler::kNext);
  }
  std::map<int, int> errno_labels;
  for (const NewerDeny& d : deny_newer) {
    if (d.errno_value == ENOSYS) continue;  // what the fall-through below answers anyway
    auto [it, inserted] = errno_labels.try_emplace(d.errno_value, 0);
    if (inserted) it->second = a.NewLabel();
    a.JumpIf(BPF_JEQ, static_cast<uint32_t>(d.nr), it->second, BpfAssembler::kNext);
  }
  a.Return(RetErrno(ENOSYS));
  for (const auto& [err, label] : errno_labels) {
    a.Bind(label);
    a.Return(RetErrno(err));
  }

  // Known to the profile: the argument allowlists.
  a.Bind(known);
  std::vector<int> blocks;
  for (const ArgAllowlist& list : lists) {
    blocks.push_back(a.NewLabel());
    a.JumpIf(BPF_JEQ, static_cast<uint32_t>(list.nr), blocks.back(), BpfAssembler::kNext);
  }
  if (!lists.empty()) a.Goto(body);
  for (size_t i = 0; i < lists.size(); ++i) {
    const policy::SyscallArgAllowlist& rule = *lists[i].rule;
    a.Bind(blocks[i]);
    for (uint64_t value : rule.allowed) {
      // Both halves must match: garbage in the high half of an int argument is refused too.
      const int next_value = a.NewLabel();
      a.Load(ArgHighOffset(rule.arg));
      a.JumpIf(BPF_JEQ, static_cast<uint32_t>(value >> 32), BpfAssembler::kNext, next_value);
      a.Load(ArgLowOffset(rule.arg));
      a.JumpIf(BPF_JEQ, static_cast<uint32_t>(value), body, BpfAssembler::kNext);
      a.Bind(next_value);
    }
    a.Return(RetErrno(rule.errno_value));
  }
  a.Bind(body);
  return a.Finish();
}

Result<scmp_compare> ScmpOp(SyscallArgCmp::Op op) {
  switch (op) {
    case SyscallArgCmp::kEq:
      return SCMP_CMP_EQ;
    case SyscallArgCmp::kNe:
      return SCMP_CMP_NE;
    case SyscallArgCmp::kLt:
      return SCMP_CMP_LT;
    case SyscallArgCmp::kLe:
      return SCMP_CMP_LE;
    case SyscallArgCmp::kGt:
      return SCMP_CMP_GT;
    case SyscallArgCmp::kGe:
      return SCMP_CMP_GE;
    case SyscallArgCmp::kMaskedEq:
    case SyscallArgCmp::kAnyBitSet:
      return SCMP_CMP_MASKED_EQ;
  }
  return Error::Msg("unknown comparison");
}

// Adds one deny rule to libseccomp. A kAnyBitSet comparison becomes one rule per bit of its mask
// (the rules of a syscall are OR-ed), each with the rule's other comparisons.
Status AddRule(scmp_filter_ctx ctx, int nr, const policy::SyscallRule& rule) {
  std::vector<struct scmp_arg_cmp> cmps;
  std::optional<size_t> any_bit;
  bool seen[kMaxArgs] = {};
  for (const SyscallArgCmp& c : rule.when) {
    if (c.arg >= kMaxArgs) return Error::Msg("argument " + std::to_string(c.arg) + " out of range");
    if (seen[c.arg]) return Error::Msg("two comparisons on one argument (libseccomp allows one)");
    seen[c.arg] = true;
    NSBOX_ASSIGN_OR_RETURN(const scmp_compare op, ScmpOp(c.op));
    const bool masked = c.op == SyscallArgCmp::kMaskedEq;
    if (c.op == SyscallArgCmp::kAnyBitSet) {
      if (c.mask_or_value == 0) return Error::Msg("kAnyBitSet with an empty mask");
      any_bit = cmps.size();
    }
    cmps.push_back({c.arg, op, c.mask_or_value, masked ? c.value : 0});
  }
  auto add = [&]() -> Status {
    // _exact: the rule is compiled as written, with no rewriting for multiplexed syscalls.
    const int rc = seccomp_rule_add_exact_array(ctx, SCMP_ACT_ERRNO(rule.errno_value), nr,
                                                static_cast<unsigned>(cmps.size()), cmps.data());
    if (rc < 0) return Error::Sys("seccomp_rule_add_exact_array", rule.name, -rc);
    return Ok();
  };
  if (!any_bit.has_value()) return add();
  const uint64_t mask = cmps[*any_bit].datum_a;
  for (unsigned bit = 0; bit < 64; ++bit) {
    const uint64_t b = uint64_t{1} << bit;
    if ((mask & b) == 0) continue;
    cmps[*any_bit].datum_a = b;
    cmps[*any_bit].datum_b = b;
    NSBOX_TRY(add());
  }
  return Ok();
}

Status CheckErrno(const char* name, int err) {
  if (err <= 0 || err > kMaxErrno) {
    return Error::Msg("errno " + std::to_string(err) + " of " + name + " is out of range");
  }
  return Ok();
}

// libseccomp's exported program, read back from a memfd (libseccomp 2.5 exports only to an fd).
Result<std::vector<struct sock_filter>> ExportBpf(scmp_filter_ctx ctx) {
  UniqueFd fd(memfd_create("nsbox-seccomp-bpf", MFD_CLOEXEC));
  if (!fd.valid()) return Error::Sys("memfd_create", "nsbox-seccomp-bpf", errno);
  const int rc = seccomp_export_bpf(ctx, fd.get());
  if (rc < 0) return Error::Sys("seccomp_export_bpf", "", -rc);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Error::Sys("fstat", "nsbox-seccomp-bpf", errno);
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes == 0 || bytes % sizeof(struct sock_filter) != 0) {
    return Error::Msg("seccomp_export_bpf wrote " + std::to_string(bytes) + " bytes");
  }
  std::vector<struct sock_filter> insns(bytes / sizeof(struct sock_filter));
  // SAFETY: sock_filter is a plain struct of integers; the bytes libseccomp wrote are an array of
  // it, and `insns` holds exactly `bytes` of them.
  auto* out = reinterpret_cast<char*>(insns.data());
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = pread(fd.get(), out + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::Sys("pread", "nsbox-seccomp-bpf", errno);
    if (n == 0) return Error::Msg("seccomp_export_bpf: short read");
    done += static_cast<size_t>(n);
  }
  return insns;
}

Result<int> ResolveFor(const char* name, const std::string& what) {
  auto nr = ResolveSyscallNumber(name);
  if (!nr.ok()) return std::move(nr).error().Context(what);
  return *nr;
}

struct FilterCtxDeleter {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};

}  // namespace

SeccompProgram::SeccompProgram(std::vector<struct sock_filter> instructions)
    : instructions_(std::move(instructions)) {
  Repoint();
}
SeccompProgram::SeccompProgram(const SeccompProgram& other) : instructions_(other.instructions_) {
  Repoint();
}
SeccompProgram& SeccompProgram::operator=(const SeccompProgram& other) {
  instructions_ = other.instructions_;
  Repoint();
  return *this;
}
SeccompProgram::SeccompProgram(SeccompProgram&& other) noexcept
    : instructions_(std::move(other.instructions_)) {
  Repoint();
  other.Repoint();
}
SeccompProgram& SeccompProgram::operator=(SeccompProgram&& other) noexcept {
  instructions_ = std::move(other.instructions_);
  Repoint();
  other.Repoint();
  return *this;
}
void SeccompProgram::Repoint() {
  // A program longer than the kernel takes gets length 0, which the kernel refuses (EINVAL),
  // rather than a length truncated to 16 bits, which would load a prefix of the filter.
  const size_t n = instructions_.size();
  fprog_.len = n <= BPF_MAXINSNS ? static_cast<unsigned short>(n) : 0;
  fprog_.filter = instructions_.data();
}

Result<int> ResolveSyscallNumber(std::string_view name) {
  const std::string n(name);
  const int nr = seccomp_syscall_resolve_name_arch(SCMP_ARCH_X86_64, n.c_str());
  if (nr >= 0) return nr;
  if (nr == __NR_SCMP_ERROR) {
    // Newer than the linked libseccomp (upstream 2.5.4 stops at 450): the profile's own table.
    if (std::optional<int> fallback = policy::X8664SyscallNumberFallback(name)) return *fallback;
    return Error::Msg("unknown syscall " + Quoted(name));
  }
  // libseccomp's negative pseudo-numbers name syscalls of other architectures.
  return Error::Msg(Quoted(name) + " is not a syscall on x86_64");
}

Result<SeccompProgram> CompileSeccomp(const policy::SeccompProfile& profile) {
  if (seccomp_arch_native() != SCMP_ARCH_X86_64) {
    return Error::Msg("seccomp: nsbox's profiles are written for x86_64 only");
  }
  std::unique_ptr<void, FilterCtxDeleter> ctx(seccomp_init(SCMP_ACT_ALLOW));
  if (ctx == nullptr) return Error::Msg("seccomp_init failed");
  // Only the native ABI: i386 (int 0x80) and x32 would reach the same kernel code under other
  // numbers, and socketcall would hide socket's family from BPF.
  int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  if (rc < 0) return Error::Sys("seccomp_attr_set", "SCMP_FLTATR_ACT_BADARCH", -rc);
  // A binary tree over syscall numbers rather than a linear list: every syscall passes through.
  rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2);
  if (rc < 0) return Error::Sys("seccomp_attr_set", "SCMP_FLTATR_CTL_OPTIMIZE", -rc);

  std::vector<NewerDeny> deny_newer;
  for (const policy::SyscallRule& rule : profile.deny) {
    const std::string what = "seccomp rule " + Quoted(rule.name);
    NSBOX_ASSIGN_OR_RETURN(const int nr, ResolveFor(rule.name, what));
    NSBOX_TRY_CTX(CheckErrno(rule.name, rule.errno_value), what);
    if (static_cast<uint32_t>(nr) > profile.enosys_above) {
      if (!rule.when.empty()) {
        return Error::Msg(what + ": a syscall above enosys_above takes no argument conditions");
      }
      deny_newer.push_back({nr, rule.errno_value});
      continue;
    }
    NSBOX_TRY_CTX(AddRule(ctx.get(), nr, rule), what);
  }

  std::vector<ArgAllowlist> lists;
  for (const policy::SyscallArgAllowlist& list : profile.arg_allowlists) {
    const std::string what = "seccomp argument allowlist " + Quoted(list.name);
    NSBOX_ASSIGN_OR_RETURN(const int nr, ResolveFor(list.name, what));
    NSBOX_TRY_CTX(CheckErrno(list.name, list.errno_value), what);
    if (list.arg >= kMaxArgs) return Error::Msg(what + ": argument out of range");
    if (static_cast<uint32_t>(nr) > profile.enosys_above) {
      return Error::Msg(what + ": the syscall is above enosys_above");
    }
    for (const ArgAllowlist& other : lists) {
      if (other.nr == nr) return Error::Msg(what + ": listed twice");
    }
    lists.push_back({nr, &list});
  }

  std::vector<int> allow_newer;
  for (const policy::NewerSyscall& s : profile.allow_newer) {
    const std::string what = "seccomp allow_newer " + Quoted(s.name);
    NSBOX_ASSIGN_OR_RETURN(const int nr, ResolveFor(s.name, what));
    if (static_cast<uint32_t>(nr) <= profile.enosys_above) {
      return Error::Msg(what + ": not above enosys_above, so allowed already");
    }
    for (const NewerDeny& d : deny_newer) {
      if (d.nr == nr) return Error::Msg(what + ": also denied");
    }
    allow_newer.push_back(nr);
  }

  NSBOX_ASSIGN_OR_RETURN(std::vector<struct sock_filter> body, ExportBpf(ctx.get()));
  NSBOX_ASSIGN_OR_RETURN(std::vector<struct sock_filter> program,
                         BuildPreamble(profile.enosys_above, allow_newer, deny_newer, lists));
  program.insert(program.end(), body.begin(), body.end());
  if (program.size() > BPF_MAXINSNS) {
    return Error::Msg("seccomp program has " + std::to_string(program.size()) +
                      " instructions, more than the kernel's " + std::to_string(BPF_MAXINSNS));
  }
  return SeccompProgram(std::move(program));
}

int LoadSeccomp(const SeccompProgram& program) noexcept {
  // A copy on the stack: the kernel takes a non-const pointer, but only reads the program.
  struct sock_fprog prog = *program.fprog();
  // SAFETY: prog points at the program's instructions, which outlive this call; the kernel copies
  // them before returning and verifies them (bad programs fail with EINVAL, not undefined
  // behaviour). No allocation or locking here, so it is safe between clone and execve.
  if (sys::Seccomp(SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) return errno;
  return 0;
}

}  // namespace nsbox::isolate
