#pragma once

// Thin wrappers for the syscalls glibc 2.36 has no wrapper for. Each returns what the syscall
// returns (-1 and errno on failure) and is async-signal-safe, so it may run between clone and
// execve.

#include <linux/mount.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace nsbox::sys {

// SAFETY: every wrapper below passes its arguments to the kernel unchanged; the kernel checks
// them and reports errors through errno. None of them touches memory beyond what it is given.

inline long Clone3(struct clone_args* args, size_t size) {
  return ::syscall(SYS_clone3, args, size);
}

inline int PidfdOpen(pid_t pid, unsigned int flags) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, flags));
}

inline int PidfdSendSignal(int pidfd, int sig, siginfo_t* info, unsigned int flags) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, info, flags));
}

inline int PivotRoot(const char* new_root, const char* put_old) {
  return static_cast<int>(::syscall(SYS_pivot_root, new_root, put_old));
}

inline int OpenTree(int dirfd, const char* path, unsigned int flags) {
  return static_cast<int>(::syscall(SYS_open_tree, dirfd, path, flags));
}

inline int MoveMount(int from_dirfd, const char* from_path, int to_dirfd, const char* to_path,
                     unsigned int flags) {
  return static_cast<int>(
      ::syscall(SYS_move_mount, from_dirfd, from_path, to_dirfd, to_path, flags));
}

inline int MountSetattr(int dirfd, const char* path, unsigned int flags, struct mount_attr* attr,
                        size_t size) {
  return static_cast<int>(::syscall(SYS_mount_setattr, dirfd, path, flags, attr, size));
}

// ioprio_set(2) (Linux 2.6.13): `which` IOPRIO_WHO_PROCESS with a thread id sets that thread's
// I/O priority alone.
inline int IoprioSet(int which, int who, int ioprio) {
  return static_cast<int>(::syscall(SYS_ioprio_set, which, who, ioprio));
}

// The new mount API (Linux 5.2): a file system configured through an fd and mounted detached.
inline int FsOpen(const char* fs_name, unsigned int flags) {
  return static_cast<int>(::syscall(SYS_fsopen, fs_name, flags));
}

inline int FsConfig(int fd, unsigned int cmd, const char* key, const void* value, int aux) {
  return static_cast<int>(::syscall(SYS_fsconfig, fd, cmd, key, value, aux));
}

inline int FsMount(int fd, unsigned int flags, unsigned int attr_flags) {
  return static_cast<int>(::syscall(SYS_fsmount, fd, flags, attr_flags));
}

// A reconfiguration context of the file system mounted at `path` (its superblock's options).
inline int FsPick(int dirfd, const char* path, unsigned int flags) {
  return static_cast<int>(::syscall(SYS_fspick, dirfd, path, flags));
}

inline int Openat2(int dirfd, const char* path, struct open_how* how, size_t size) {
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path, how, size));
}

inline int CloseRange(unsigned int first, unsigned int last, unsigned int flags) {
  return static_cast<int>(::syscall(SYS_close_range, first, last, flags));
}

inline int Seccomp(unsigned int op, unsigned int flags, void* args) {
  return static_cast<int>(::syscall(SYS_seccomp, op, flags, args));
}

// Room for one fd passed with SCM_RIGHTS.
struct FdControl {
  alignas(struct cmsghdr) char buf[CMSG_SPACE(sizeof(int))] = {};
};

// Makes `msg` carry `fd` beside its bytes (SCM_RIGHTS), using `control` for the ancillary data.
// Async-signal-safe: the jail's PID 1 passes its terminal with it before it execs anything.
inline void AttachFd(struct msghdr* msg, FdControl* control, int fd) {
  msg->msg_control = control->buf;
  msg->msg_controllen = sizeof control->buf;
  struct cmsghdr* c = CMSG_FIRSTHDR(msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
}

}  // namespace nsbox::sys
