// nsbox-attacker: the adversarial tier's in-jail attack program. Static, copied into a sandbox
// through the files API and run by exec, it makes the attacks that a shell cannot make exactly
// and prints what each one got, one "key=value" line per fact: "0" for a success, the errno's
// name ("EPERM") for a failure.
//
// Every subcommand is also the control run of its case, on the host: run there (as root) it must
// succeed where the jail refuses, so that a refusal in the jail means the defence and not a
// broken probe. None of them disturbs the host: `ptrace` and `vmread` act only on a child of the
// attacker's own unless they run in a new pid namespace, `connect` only connects and reads, and
// `exchange` swaps two names it is given (the tests give it names in the sandbox's workspace);
// `prlimit` and `prlimit-scan` change only its own processes' limits on the host, and `deeptree`
// makes the directories it is told to.

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>
#include <initializer_list>
#include <string>

namespace {

// /proc/self/ns/pid of the initial pid namespace: PROC_PID_INIT_INO (include/linux/proc_ns.h).
constexpr const char* kInitialPidNs = "pid:[4026531836]";

const char* ErrName(int err) {
  if (err == 0) return "0";
  const char* name = strerrorname_np(err);
  return name != nullptr ? name : "E?";
}

const char* Outcome(long rc) { return rc < 0 ? ErrName(errno) : "0"; }

void Print(const char* key, const char* value) {
  printf("%s=%s\n", key, value);
  fflush(stdout);
}

bool InInitialPidNamespace() {
  char buf[64] = {};
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n <= 0 || strcmp(buf, kInitialPidNs) == 0;
}

// Printable form of bytes: anything outside 0x21..0x7e becomes '.'.
void Sanitize(const char* in, size_t n, char* out, size_t size) {
  size_t o = 0;
  for (size_t i = 0; i < n && o + 1 < size; ++i) {
    unsigned char c = static_cast<unsigned char>(in[i]);
    out[o++] = (c > 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
  }
  out[o] = '\0';
}

// ---- procscan: every visible process's magic links and fds --------------------------------

void ScanOne(const char* pid) {
  char path[512];
  char target[1024];
  char key[512];
  snprintf(path, sizeof path, "/proc/%s/comm", pid);
  FILE* f = fopen(path, "re");
  char comm[64] = "?";
  if (f != nullptr) {
    if (fgets(comm, sizeof comm, f) != nullptr) comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
  }
  snprintf(key, sizeof key, "pid.%s.comm", pid);
  Print(key, comm);
  for (const char* link : {"root", "cwd", "exe"}) {
    snprintf(path, sizeof path, "/proc/%s/%s", pid, link);
    ssize_t n = readlink(path, target, sizeof target - 1);
    snprintf(key, sizeof key, "pid.%s.%s", pid, link);
    if (n < 0) {
      Print(key, ErrName(errno));
    } else {
      target[n] = '\0';
      Print(key, target);
    }
  }
  // Through the root link: does it open, and whose /etc/hostname is behind it?
  snprintf(path, sizeof path, "/proc/%s/root/etc/hostname", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  snprintf(key, sizeof key, "pid.%s.root.hostname", pid);
  if (fd < 0) {
    Print(key, ErrName(errno));
  } else {
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    char clean[256];
    Sanitize(buf, n > 0 ? static_cast<size_t>(n) : 0, clean, sizeof clean);
    Print(key, clean);
    close(fd);
  }
  snprintf(path, sizeof path, "/proc/%s/fd", pid);
  DIR* d = opendir(path);
  snprintf(key, sizeof key, "pid.%s.fds", pid);
  if (d == nullptr) {
    Print(key, ErrName(errno));
    return;
  }
  Print(key, "0");
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char fdpath[1024];
    snprintf(fdpath, sizeof fdpath, "%s/%s", path, e->d_name);
    ssize_t n = readlink(fdpath, target, sizeof target - 1);
    snprintf(key, sizeof key, "pid.%s.fd.%s", pid, e->d_name);
    if (n < 0) {
      Print(key, ErrName(errno));
    } else {
      target[n] = '\0';
      Print(key, target);
    }
  }
  closedir(d);
}

int CmdProcscan() {
  DIR* d = opendir("/proc");
  if (d == nullptr) {
    Print("proc", ErrName(errno));
    return 1;
  }
  char self[32];
  snprintf(self, sizeof self, "%d", getpid());
  while (struct dirent* e = readdir(d)) {
    char* end = nullptr;
    strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    if (strcmp(e->d_name, self) == 0) continue;  // its own fds are the scan's
    ScanOne(e->d_name);
  }
  closedir(d);
  return 0;
}

// ---- ptrace / vmread: another process's memory and fds -------------------------------------

volatile unsigned long g_secret = 0x6e73626f78UL;  // "nsbox": what the control reads back

void Attacks(pid_t pid) {
  char path[64];
  // PTRACE_ATTACH and PTRACE_SEIZE; a success is undone at once.
  long rc = ptrace(PTRACE_ATTACH, pid, nullptr, nullptr);
  Print("ptrace.attach", Outcome(rc));
  if (rc == 0) {
    waitpid(pid, nullptr, __WALL);
    ptrace(PTRACE_DETACH, pid, nullptr, nullptr);
  }
  rc = ptrace(PTRACE_SEIZE, pid, nullptr, nullptr);
  Print("ptrace.seize", Outcome(rc));
  if (rc == 0) ptrace(PTRACE_DETACH, pid, nullptr, nullptr);
  // process_vm_readv of the attacker's own global in the other process (same binary layout in
  // the control's child; in the jail the filter answers before the address matters).
  unsigned long got = 0;
  struct iovec local = {&got, sizeof got};
  struct iovec remote = {const_cast<unsigned long*>(&g_secret), sizeof g_secret};
  rc = syscall(SYS_process_vm_readv, pid, &local, 1, &remote, 1, 0);
  Print("vm_readv", Outcome(rc));
  if (rc > 0) Print("vm_readv.value", got == g_secret ? "secret" : "other");
  snprintf(path, sizeof path, "/proc/%d/mem", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  Print("open.mem", Outcome(fd));
  if (fd >= 0) close(fd);
  snprintf(path, sizeof path, "/proc/%d/environ", pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  Print("open.environ", Outcome(fd));
  if (fd >= 0) close(fd);
  snprintf(path, sizeof path, "/proc/%d/fd", pid);
  DIR* d = opendir(path);
  Print("open.fd_dir", d == nullptr ? ErrName(errno) : "0");
  if (d != nullptr) closedir(d);
  // pidfd_open + pidfd_getfd: steal its fd 0.
  long pidfd = syscall(SYS_pidfd_open, pid, 0);
  Print("pidfd_open", Outcome(pidfd));
  if (pidfd >= 0) {
    long stolen = syscall(SYS_pidfd_getfd, pidfd, 0, 0);
    Print("pidfd_getfd", Outcome(stolen));
    if (stolen >= 0) close(static_cast<int>(stolen));
    close(static_cast<int>(pidfd));
  }
  // kcmp: compare its fd 0 with ours.
  Print("kcmp", Outcome(syscall(SYS_kcmp, getpid(), pid, 0 /* KCMP_FILE */, 0, 0)));
}

int CmdPtrace(const char* pid_text) {
  pid_t pid = static_cast<pid_t>(strtol(pid_text, nullptr, 10));
  if (InInitialPidNamespace()) {
    printf("refused=ptrace of a pid runs only in a jail; the control is ptrace-child\n");
    return 2;
  }
  Attacks(pid);
  return 0;
}

// The control: the same attacks on a child of the attacker's own (the host allows them to root).
int CmdPtraceChild() {
  int pipefd[2];
  if (pipe(pipefd) < 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    close(pipefd[0]);
    (void)!write(pipefd[1], "r", 1);
    for (;;) pause();
  }
  close(pipefd[1]);
  char c;
  (void)!read(pipefd[0], &c, 1);
  close(pipefd[0]);
  Attacks(child);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return 0;
}

// ---- connect: reach a service -------------------------------------------------------------

int ConnectWithTimeout(int fd, const sockaddr* addr, socklen_t len) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  if (connect(fd, addr, len) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  struct pollfd p = {fd, POLLOUT, 0};
  if (poll(&p, 1, 2000) <= 0) return ETIMEDOUT;
  int err = 0;
  socklen_t elen = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
  fcntl(fd, F_SETFL, flags);
  return err;
}

int CmdConnect(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* kind = argv[0];
  int fd = -1;
  int err = 0;
  if (strcmp(kind, "tcp") == 0 || strcmp(kind, "tcp6") == 0) {
    if (argc < 3) return 2;
    const bool v6 = strcmp(kind, "tcp6") == 0;
    fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      Print("connect", ErrName(errno));
      return 0;
    }
    const uint16_t port = static_cast<uint16_t>(strtol(argv[2], nullptr, 10));
    if (v6) {
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_port = htons(port);
      inet_pton(AF_INET6, argv[1], &a.sin6_addr);
      // SAFETY: sockaddr_in6 is the address of an AF_INET6 socket.
      err = ConnectWithTimeout(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      inet_pton(AF_INET, argv[1], &a.sin_addr);
      // SAFETY: sockaddr_in is the address of an AF_INET socket.
      err = ConnectWithTimeout(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
  } else if (strcmp(kind, "unix") == 0 || strcmp(kind, "abstract") == 0) {
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      Print("connect", ErrName(errno));
      return 0;
    }
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    socklen_t len = 0;
    const size_t n = strlen(argv[1]);
    if (n + 2 > sizeof a.sun_path) return 2;
    if (strcmp(kind, "abstract") == 0) {
      memcpy(a.sun_path + 1, argv[1], n);  // a leading NUL: the abstract namespace
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
    } else {
      memcpy(a.sun_path, argv[1], n);
      len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n + 1);
    }
    // SAFETY: sockaddr_un is the address of an AF_UNIX socket; len covers the name used.
    err = ConnectWithTimeout(fd, reinterpret_cast<sockaddr*>(&a), len);
  } else {
    return 2;
  }
  Print("connect", ErrName(err));
  if (err == 0) {
    char buf[256];
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t n = poll(&p, 1, 500) > 0 ? read(fd, buf, sizeof buf) : 0;
    char clean[256];
    Sanitize(buf, n > 0 ? static_cast<size_t>(n) : 0, clean, sizeof clean);
    Print("read", clean);
  }
  close(fd);
  return 0;
}

// ---- exchange: the directory/symlink swap racing the file verbs ----------------------------

// Swaps A and B with renameat2(RENAME_EXCHANGE) as fast as it can until STOPFILE exists or
// SECONDS pass, then prints how many swaps it made.
int CmdExchange(const char* a, const char* b, const char* stopfile, const char* seconds) {
  const long limit = strtol(seconds, nullptr, 10);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  unsigned long swaps = 0;
  unsigned long failures = 0;
  int last_err = 0;
  for (;;) {
    for (int i = 0; i < 256; ++i) {
      if (syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2 /* RENAME_EXCHANGE */) == 0) {
        ++swaps;
      } else {
        ++failures;
        last_err = errno;
      }
    }
    if (access(stopfile, F_OK) == 0) break;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= limit) break;
  }
  printf("swaps=%lu\nfailures=%lu\nlast_error=%s\n", swaps, failures, ErrName(last_err));
  fflush(stdout);
  return 0;
}

// ---- userns: nested user namespaces ---------------------------------------------------------

template <typename Fn>
const char* InChild(Fn fn) {
  pid_t pid = fork();
  if (pid < 0) return ErrName(errno);
  if (pid == 0) _exit(fn());
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrName(errno);
  }
  if (WIFSIGNALED(status)) return "signaled";
  return ErrName(WEXITSTATUS(status));
}

int CmdUserns() {
  Print("unshare_user", InChild([] { return unshare(CLONE_NEWUSER) < 0 ? errno : 0; }));
  Print("unshare_user_pid",
        InChild([] { return unshare(CLONE_NEWUSER | CLONE_NEWPID) < 0 ? errno : 0; }));
  // clone(CLONE_NEWUSER) with a real child: it exits at once where it is allowed.
  Print("clone_newuser", InChild([] {
          long rc = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
          if (rc == 0) _exit(0);
          if (rc < 0) return errno;
          waitpid(static_cast<pid_t>(rc), nullptr, 0);
          return 0;
        }));
  FILE* f = fopen("/proc/sys/user/max_user_namespaces", "re");
  char line[64] = "";
  if (f == nullptr) {
    Print("max_user_namespaces", ErrName(errno));
  } else {
    if (fgets(line, sizeof line, f) != nullptr) line[strcspn(line, "\n")] = '\0';
    fclose(f);
    Print("max_user_namespaces", line);
  }
  return 0;
}

// ---- fds: what the command holds -----------------------------------------------------------

int CmdFds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) {
    Print("fds", ErrName(errno));
    return 1;
  }
  const int own = dirfd(d);
  char list[1024] = "";
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == own) continue;
    char path[300];
    char target[512];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    char key[300];
    snprintf(key, sizeof key, "fd.%s", e->d_name);
    Print(key, target);
    if (list[0] != '\0') strncat(list, ",", sizeof list - strlen(list) - 1);
    strncat(list, e->d_name, sizeof list - strlen(list) - 1);
  }
  closedir(d);
  Print("fds", list);
  return 0;
}

// ---- sock: leaves a Unix socket file at PATH -------------------------------------------------

int CmdSock(const char* path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  // SAFETY: sockaddr_un is the address of an AF_UNIX socket.
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  Print("bind", Outcome(rc));
  if (rc == 0) listen(fd, 1);
  close(fd);
  return 0;
}

// ---- orphans: zombies for PID 1 to reap -----------------------------------------------------

// N double-forks whose grandchildren exit at once: orphans re-parented to PID 1, which must reap
// them. With `--keep-zombie` it also leaves one zombie child of its own (never waited for) and
// stays alive for SECONDS, the control that the zombie scan sees a zombie when there is one.
int CmdOrphans(int n, bool keep_zombie, int seconds) {
  for (int i = 0; i < n; ++i) {
    pid_t c = fork();
    if (c == 0) {
      if (fork() == 0) _exit(0);
      _exit(0);
    }
    if (c > 0) waitpid(c, nullptr, 0);
  }
  Print("orphans", "0");
  if (keep_zombie) {
    pid_t z = fork();
    if (z == 0) _exit(0);
    printf("zombie=%d\n", z);
    fflush(stdout);
    sleep(static_cast<unsigned>(seconds));
  }
  return 0;
}

// ---- whoami: what a (possibly setuid) copy of the attacker runs as, and what it can open ----

int CmdWhoami(int argc, char** argv) {
  printf("uid=%d\neuid=%d\n", static_cast<int>(getuid()), static_cast<int>(geteuid()));
  for (int i = 0; i < argc; ++i) {
    int fd = open(argv[i], O_RDONLY | O_CLOEXEC);
    printf("open[%s]=%s\n", argv[i], fd < 0 ? ErrName(errno) : "0");
    if (fd >= 0) close(fd);
  }
  fflush(stdout);
  return 0;
}

// ---- udp: one datagram, from a forged source address or the real one ------------------------

uint16_t Checksum(const void* data, size_t n, uint32_t sum = 0) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i + 1 < n; i += 2) sum += static_cast<uint32_t>(p[i] << 8 | p[i + 1]);
  if (n % 2 != 0) sum += static_cast<uint32_t>(p[n - 1] << 8);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// Sends MESSAGE to DST:PORT over UDP from SRC, written by hand in a raw socket's IP header
// (CAP_NET_RAW, which a sandbox's root has in its own network namespace); SRC "-" sends through
// an ordinary UDP socket, the control. Prints send=0 or the errno's name.
int CmdUdp(const char* src, const char* dst, const char* port_text, const char* message) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(strtol(port_text, nullptr, 10)));
  if (inet_pton(AF_INET, dst, &to.sin_addr) != 1) return 2;
  const size_t len = strlen(message);
  if (len > 1000) return 2;
  if (strcmp(src, "-") == 0) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    // SAFETY: sockaddr_in is the address of an AF_INET socket.
    long rc =
        fd < 0 ? -1 : sendto(fd, message, len, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
    Print("send", Outcome(rc));
    if (fd >= 0) close(fd);
    return 0;
  }
  in_addr from{};
  if (inet_pton(AF_INET, src, &from) != 1) return 2;
  uint8_t packet[1100] = {};
  const size_t total = 20 + 8 + len;
  packet[0] = 0x45;  // IPv4, 5 words of header
  packet[2] = static_cast<uint8_t>(total >> 8);
  packet[3] = static_cast<uint8_t>(total);
  packet[8] = 64;  // TTL
  packet[9] = IPPROTO_UDP;
  memcpy(packet + 12, &from, 4);
  memcpy(packet + 16, &to.sin_addr, 4);
  const uint16_t ip_sum = Checksum(packet, 20);
  packet[10] = static_cast<uint8_t>(ip_sum >> 8);
  packet[11] = static_cast<uint8_t>(ip_sum);
  uint8_t* udp = packet + 20;
  udp[0] = 0x9c;  // source port 40000
  udp[1] = 0x40;
  memcpy(udp + 2, &to.sin_port, 2);
  udp[4] = static_cast<uint8_t>((8 + len) >> 8);
  udp[5] = static_cast<uint8_t>(8 + len);
  memcpy(udp + 8, message, len);  // checksum 0: none, which IPv4 allows
  int fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
  // SAFETY: sockaddr_in is the address of an AF_INET socket.
  long rc = fd < 0 ? -1 : sendto(fd, packet, total, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  Print("send", Outcome(rc));
  if (fd >= 0) close(fd);
  return 0;
}

// ---- bind, getcap, exec-as: what a file capability grants, and where ----------------------

// Binds a TCP socket to 0.0.0.0:PORT (below 1024 it takes CAP_NET_BIND_SERVICE in the user
// namespace that owns the network namespace); prints bind=0 or the errno's name, the uid and the
// effective capabilities.
int CmdBind(const char* port_text) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(atoi(port_text)));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  // SAFETY: sockaddr_in is the address of an AF_INET socket.
  Print("bind", Outcome(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a)));
  close(fd);
  printf("uid=%d\n", static_cast<int>(getuid()));
  FILE* f = fopen("/proc/self/status", "re");
  char line[256];
  while (f != nullptr && fgets(line, sizeof line, f) != nullptr) {
    if (strncmp(line, "CapEff:\t", 8) == 0) printf("CapEff=%s", line + 8);
  }
  if (f != nullptr) fclose(f);
  fflush(stdout);
  return 0;
}

// The security.capability xattr of PATH as the caller's user namespace sees it (the kernel shows
// a revision-3 capability whose rootid is this namespace's root as revision 2): its size,
// revision, effective flag, permitted set and rootid (revision 3).
int CmdGetcap(const char* path) {
  unsigned char v[64] = {};
  ssize_t n = getxattr(path, "security.capability", v, sizeof v);
  if (n < 0) {
    Print("cap", ErrName(errno));
    return 0;
  }
  auto le32 = [&](int at) {
    return static_cast<unsigned>(v[at]) | static_cast<unsigned>(v[at + 1]) << 8 |
           static_cast<unsigned>(v[at + 2]) << 16 | static_cast<unsigned>(v[at + 3]) << 24;
  };
  const unsigned magic = le32(0);
  printf("cap.bytes=%zd\ncap.revision=%u\ncap.effective=%u\n", n, magic >> 24, magic & 1);
  const unsigned long long high = n >= 20 ? le32(12) : 0;
  printf("cap.permitted=%016llx\n", high << 32 | le32(4));
  if (n >= 24) printf("cap.rootid=%u\n", le32(20));
  fflush(stdout);
  return 0;
}

// ---- prlimit: another process's resource limits ---------------------------------------------

int ResourceOf(const char* name) {
  if (strcmp(name, "nofile") == 0) return RLIMIT_NOFILE;
  if (strcmp(name, "cpu") == 0) return RLIMIT_CPU;
  if (strcmp(name, "fsize") == 0) return RLIMIT_FSIZE;
  if (strcmp(name, "core") == 0) return RLIMIT_CORE;
  return -1;
}

// prlimit64(PID, RESOURCE, {SOFT, HARD}): PID as a whole 64-bit register (4294967297 is pid 1
// with a high bit set, which the kernel truncates to a pid_t). Prints prlimit=0 or the errno.
int CmdPrlimit(const char* pid_text, const char* resource, const char* soft, const char* hard) {
  const int res = ResourceOf(resource);
  if (res < 0) return 2;
  const struct rlimit value = {strtoull(soft, nullptr, 10), strtoull(hard, nullptr, 10)};
  const unsigned long long pid = strtoull(pid_text, nullptr, 10);
  // Never another process of the host's: only in a jail's pid namespace.
  if (InInitialPidNamespace()) {
    Print("prlimit", "not-run-on-the-host");
    return 0;
  }
  // SAFETY: prlimit64 reads `value`; the old limits are not asked for.
  Print("prlimit", Outcome(syscall(SYS_prlimit64, pid, res, &value, nullptr)));
  return 0;
}

// Lowers RLIMIT_CORE to 0 (harmless: nothing here dumps core) of every pid from 1 to MAX that
// exists, with a child of its own alive (the control: its own processes are in its reach).
// Prints self, child, and the pids reached and refused.
int CmdPrlimitScan(long max) {
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  const struct rlimit zero = {0, 0};
  std::string reached;
  std::string refused;
  std::string other;
  // On the host (the initial pid namespace) only its own two processes: the host's others are
  // not its to change.
  const bool host = InInitialPidNamespace();
  for (long pid = 1; pid <= max; ++pid) {
    if (host && pid != getpid() && pid != child) continue;
    // SAFETY: prlimit64 reads `zero`; the old limits are not asked for.
    const long rc = syscall(SYS_prlimit64, pid, RLIMIT_CORE, &zero, nullptr);
    if (rc != 0 && errno == ESRCH) continue;
    std::string& list = rc == 0 ? reached : errno == EPERM ? refused : other;
    list += (list.empty() ? "" : ",") + std::to_string(pid);
  }
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  printf("self=%d\nchild=%d\nreached=%s\nrefused=%s\nother=%s\n", static_cast<int>(getpid()),
         static_cast<int>(child), reached.c_str(), refused.c_str(), other.c_str());
  fflush(stdout);
  return 0;
}

// exec-as [--netns] [--userns BASE] UID PATH ARGS...: runs PATH as UID (and gid UID, no
// supplementary groups), after unsharing a network namespace (--netns) and, with --userns, in a
// new user namespace whose root is host uid BASE (uid_map and gid_map "0 BASE 65536", as a
// jail's), that network namespace then its own. PATH is opened first, as the caller, and executed
// by its fd: the child need not be able to reach it. Prints exec=ERRNO when the exec fails.
int CmdExecAs(int argc, char** argv) {
  bool netns = false;
  long base = -1;
  int i = 0;
  for (; i < argc && argv[i][0] == '-'; ++i) {
    if (strcmp(argv[i], "--netns") == 0) {
      netns = true;
    } else if (strcmp(argv[i], "--userns") == 0 && i + 1 < argc) {
      base = atol(argv[++i]);
    } else {
      return 2;
    }
  }
  if (argc - i < 2) return 2;
  const uid_t uid = static_cast<uid_t>(atoi(argv[i]));
  char** exec_argv = argv + i + 1;
  int fd = open(exec_argv[0], O_PATH | O_CLOEXEC);
  if (fd < 0) {
    Print("open", ErrName(errno));
    return 1;
  }
  int ready[2];
  int go[2];
  if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) return 1;
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    char c = 0;
    if (base >= 0 && unshare(CLONE_NEWUSER) != 0) {
      Print("unshare_user", ErrName(errno));
      _exit(1);
    }
    (void)!write(ready[1], "r", 1);
    if (read(go[0], &c, 1) != 1) _exit(1);
    if (netns && unshare(CLONE_NEWNET) != 0) {
      Print("unshare_net", ErrName(errno));
      _exit(1);
    }
    if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      Print("setuid", ErrName(errno));
      _exit(1);
    }
    // SAFETY: execveat(2) with AT_EMPTY_PATH runs the file `fd` refers to; the argument vector
    // is NULL-terminated (main's argv) and environ is the process's own.
    syscall(SYS_execveat, fd, "", exec_argv, environ, AT_EMPTY_PATH);
    Print("exec", ErrName(errno));
    _exit(1);
  }
  char c = 0;
  if (read(ready[0], &c, 1) != 1) return 1;
  if (base >= 0) {
    char map[64];
    snprintf(map, sizeof map, "0 %ld 65536\n", base);
    for (const char* file : {"uid_map", "gid_map"}) {
      char path[64];
      snprintf(path, sizeof path, "/proc/%d/%s", static_cast<int>(child), file);
      int m = open(path, O_WRONLY | O_CLOEXEC);
      if (m < 0 || write(m, map, strlen(map)) < 0) {
        Print(file, ErrName(errno));
        kill(child, SIGKILL);
      }
      if (m >= 0) close(m);
    }
  }
  (void)!write(go[1], "g", 1);
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// ---- deeptree: a chain of directories deeper than anyone's fd limit ---------------------------

// Makes DIR and DEPTH directories "d" in a chain under it, each made and entered by fd (no path
// is longer than one name), and a file at the bottom. Prints the depth made.
int CmdDeepTree(const char* dir, long depth) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    Print("deeptree", ErrName(errno));
    return 1;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  long made = 0;
  while (fd >= 0 && made < depth) {
    if (mkdirat(fd, "d", 0755) != 0) break;
    const int next = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    close(fd);
    fd = next;
    if (fd >= 0) ++made;
  }
  if (fd >= 0) {
    const int file = openat(fd, "bottom", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (file >= 0) close(file);
    close(fd);
  }
  printf("made=%ld\n", made);
  fflush(stdout);
  return made == depth ? 0 : 1;
}

// Watches each PATH with inotify (what it reports about accesses: open, read, close, write,
// attributes) until STOPFILE exists (at most 120 s), starting after DELAY ms (the command that
// started it in the background has ended by then): "watch.I=0" or the errno's name for each
// watch placed, "ready=1" once all are, then "events.I=N", the events each got. Run in the
// background with its output to a file, which the test reads.
int CmdWatch(int delay_ms, const char* stopfile, int count, char** paths) {
  usleep(static_cast<useconds_t>(delay_ms) * 1000);
  int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) {
    Print("inotify_init", ErrName(errno));
    return 1;
  }
  constexpr uint32_t kMask =
      IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE | IN_CLOSE_WRITE | IN_MODIFY | IN_ATTRIB;
  int wd[64];
  long events[64] = {};
  if (count > 64) return 2;
  for (int i = 0; i < count; ++i) {
    wd[i] = inotify_add_watch(fd, paths[i], kMask);
    char key[32];
    snprintf(key, sizeof key, "watch.%d", i);
    Print(key, Outcome(wd[i]));
  }
  Print("ready", "1");
  alignas(inotify_event) char buf[65536];
  for (int round = 0; round < 6000; ++round) {
    for (;;) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      for (ssize_t at = 0; at < n;) {
        // SAFETY: the kernel writes whole inotify_event records, each aligned, into buf.
        const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
        for (int i = 0; i < count; ++i) {
          if (e->wd == wd[i]) ++events[i];
        }
        at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      }
    }
    if (access(stopfile, F_OK) == 0) break;
    usleep(20000);
  }
  for (int i = 0; i < count; ++i) {
    char key[32], value[32];
    snprintf(key, sizeof key, "events.%d", i);
    snprintf(value, sizeof value, "%ld", events[i]);
    Print(key, value);
  }
  close(fd);
  return 0;
}

int Usage() {
  fprintf(stderr,
          "usage: nsbox-attacker procscan | ptrace PID | ptrace-child | connect tcp|tcp6 HOST "
          "PORT\n       | connect unix PATH | connect abstract NAME | exchange A B STOPFILE "
          "SECONDS\n       | userns | fds | sock PATH | orphans N [--keep-zombie SECONDS]\n"
          "       | whoami [FILE...] | udp SRC|- DST PORT MESSAGE | bind PORT | getcap PATH\n"
          "       | exec-as [--netns] [--userns BASE] UID PATH ARGS...\n"
          "       | prlimit PID nofile|cpu|fsize|core SOFT HARD | prlimit-scan MAX\n"
          "       | deeptree DIR DEPTH | watch DELAY STOPFILE PATH...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const char* cmd = argv[1];
  if (strcmp(cmd, "procscan") == 0) return CmdProcscan();
  if (strcmp(cmd, "ptrace-child") == 0) return CmdPtraceChild();
  // On the host the nested namespaces are made in children that exit at once: harmless.
  if (strcmp(cmd, "userns") == 0) return CmdUserns();
  if (strcmp(cmd, "fds") == 0) return CmdFds();
  if (strcmp(cmd, "whoami") == 0) return CmdWhoami(argc - 2, argv + 2);
  if (strcmp(cmd, "ptrace") == 0 && argc == 3) return CmdPtrace(argv[2]);
  if (strcmp(cmd, "connect") == 0) return CmdConnect(argc - 2, argv + 2);
  if (strcmp(cmd, "exchange") == 0 && argc == 6) {
    return CmdExchange(argv[2], argv[3], argv[4], argv[5]);
  }
  if (strcmp(cmd, "sock") == 0 && argc == 3) return CmdSock(argv[2]);
  if (strcmp(cmd, "udp") == 0 && argc == 6) return CmdUdp(argv[2], argv[3], argv[4], argv[5]);
  if (strcmp(cmd, "bind") == 0 && argc == 3) return CmdBind(argv[2]);
  if (strcmp(cmd, "getcap") == 0 && argc == 3) return CmdGetcap(argv[2]);
  // On the host: namespaces made in a child, the program it runs binds in its own namespace.
  if (strcmp(cmd, "exec-as") == 0) return CmdExecAs(argc - 2, argv + 2);
  if (strcmp(cmd, "prlimit") == 0 && argc == 6) {
    return CmdPrlimit(argv[2], argv[3], argv[4], argv[5]);
  }
  if (strcmp(cmd, "prlimit-scan") == 0 && argc == 3) return CmdPrlimitScan(atol(argv[2]));
  if (strcmp(cmd, "deeptree") == 0 && argc == 4) return CmdDeepTree(argv[2], atol(argv[3]));
  if (strcmp(cmd, "watch") == 0 && argc >= 5) {
    return CmdWatch(atoi(argv[2]), argv[3], argc - 4, argv + 4);
  }
  if (strcmp(cmd, "orphans") == 0 && argc >= 3) {
    const bool keep = argc >= 5 && strcmp(argv[3], "--keep-zombie") == 0;
    return CmdOrphans(atoi(argv[2]), keep, keep ? atoi(argv[4]) : 0);
  }
  return Usage();
}
