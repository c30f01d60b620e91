#!/usr/bin/env bash
# tests/vm/run.sh: boot one throwaway VM with a stock Debian kernel and ONLY cgroup v2 mounted,
# run one command in it as root, and pass its exit status through.
#
# Usage: tests/vm/run.sh [OPTIONS] [--] COMMAND...
#   --kernel bookworm|trixie  the guest kernel: bookworm's 6.1 (default) or trixie's 6.12; the
#                             userland is bookworm's either way (host-built binaries run)
#   --init plain|systemd      plain (default): a small PID 1 (guest/nsbox-vm-init) runs the
#                             command in the root cgroup, no systemd. systemd: the image's
#                             systemd boots and nsbox-vm-run.service runs the command (in its
#                             cgroup, /system.slice/nsbox-vm-run.service) after multi-user.target
#   --share DIR               share the host directory DIR over 9p, read-write, at the same
#                             absolute path in the guest (repeatable). Files the guest creates
#                             belong to the same uids on the host (qemu runs as root)
#   --timeout SECS            kill the VM after SECS seconds and exit 124
#   --mem SIZE                guest memory, qemu syntax (default 2G)
#   --cpus N                  virtual CPUs (default 2)
#   -v                        print the guest's console (kernel, init, systemd) on stderr, live
#   COMMAND...                bash script text: the words joined by spaces, as ssh does (quote
#                             the whole script to keep inner quoting). A single word naming a
#                             non-ELF file means that file is the script; `-` reads it from
#                             stdin. The command runs with a clean environment (PATH, HOME=/root,
#                             LANG=C.UTF-8, TERM=dumb), stdin /dev/null, in the caller's working
#                             directory if a share holds it, else in the first share, else /root.
#
# Users: the command runs as root. The image also has `tester` (uid 1000, subordinate uids and
# gids 100000-165535, passwordless sudo). A process of tester's in a logind login session, the
# way a user who logged in has one (systemd mode):
#     su -l tester -c 'COMMAND'        (or: runuser -l tester -c 'COMMAND')
# PAM's su-l (runuser-l) stack includes pam_systemd, so logind opens a session: the process is
# in 0::/user.slice/user-1000.slice/session-c1.scope (ids c1, c2...: su has no pam_loginuid,
# hence no audit session id to name the session after), XDG_RUNTIME_DIR=/run/user/1000,
# user@1000.service runs, and `sudo -n` works. `sudo -u tester` and `setpriv --reuid=1000`
# open no session (they stay in the caller's cgroup). In plain mode there is no logind: su -l
# works, in the root cgroup.
#
# Output: the command's stdout and stderr come out on run.sh's stdout and stderr, as they are
# written. Exit status: the command's; 124 on --timeout; 125 when the VM stopped without
# reporting a status (the console's tail is then printed on stderr); 2 for a usage error.
#
# Environment: NSBOX_VM_CACHE (image cache, see image.sh), NSBOX_VM_ACCEL=tcg|kvm (default:
# tcg when /dev/kvm is missing or is PVM's, which cannot run a stock kernel; else kvm),
# NSBOX_VM_BZIMAGE=1 (boot the compressed kernel the classic way, with KASLR: slower),
# NSBOX_VM_APPEND (more kernel parameters, e.g. `systemd.log_level=debug`), NSBOX_VM_CONSOLE=PATH
# (keep the guest's whole console log there).
#
# How it works: image.sh builds or finds the image. qemu boots its kernel and tiny initramfs
# with the root disk in snapshot mode (the image never changes; VMs can run side by side), no
# network (-nic none), the console (ttyS0) in a log file, and these devices:
#   * 9p share `nsbox-run`: a per-run directory holding `cmd`, `shares`, `workdir` and, at the
#     end, `rc` (the exit status);
#   * 9p shares `share0`...: the --share directories;
#   * virtio-serial ports `stdout` and `stderr`, each on a qemu `pipe` chardev: a pair of FIFOs
#     (NAME.out: guest to host; NAME.in: unused) that `cat` copies to our fd 1 and fd 2. Not a
#     `file` chardev on /proc/self/fd/1: qemu would open a second file description of it and,
#     when our stdout is a regular file, its writes and the caller's would overwrite each
#     other.
# Needs root (qemu's 9p passthrough keeps the guest's file owners).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  sed -n '/^# Usage:/,/^# Needs root/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {
  echo "nsbox-vm: $*" >&2
  exit 2
}

kernel=bookworm
init=plain
shares=()
timeout=
mem=2G
cpus=2
verbose=
while (($# > 0)); do
  case $1 in
    --kernel) kernel=${2:?--kernel needs bookworm or trixie} && shift 2 ;;
    --init) init=${2:?--init needs plain or systemd} && shift 2 ;;
    --share) shares+=("${2:?--share needs a directory}") && shift 2 ;;
    --timeout) timeout=${2:?--timeout needs seconds} && shift 2 ;;
    --mem) mem=${2:?--mem needs a size} && shift 2 ;;
    --cpus) cpus=${2:?--cpus needs a number} && shift 2 ;;
    -v) verbose=1 && shift ;;
    -h | --help) usage ;;
    --) shift && break ;;
    -) break ;;
    -*) die "unknown option '$1' (--help)" ;;
    *) break ;;
  esac
done
(($# > 0)) || die "no command (--help)"
[[ $kernel == bookworm || $kernel == trixie ]] || die "--kernel: bookworm or trixie, not '$kernel'"
[[ $init == plain || $init == systemd ]] || die "--init: plain or systemd, not '$init'"
[[ -z $timeout || $timeout =~ ^[0-9]+$ ]] || die "--timeout: whole seconds, not '$timeout'"
[[ $cpus =~ ^[0-9]+$ ]] || die "--cpus: a number, not '$cpus'"
[[ $(id -u) -eq 0 ]] || die "run as root (qemu's 9p passthrough must keep the guest's file owners)"

image=$("$HERE/image.sh")

# The per-run directory: the 9p share `nsbox-run` (mode 0755 so that any guest user can read
# the script) and, outside it, the FIFOs and the console log.
work=$(mktemp -d "${TMPDIR:-/tmp}/nsbox-vm.XXXXXX")
mkdir -m 0755 "$work/run"
qemu_pid=
timer_pid=
# On any exit: stop what is still running (qemu when we are interrupted, the --timeout timer)
# and reap it, then remove the per-run directory.
# shellcheck disable=SC2317 # (called by the trap)
cleanup() {
  local pid
  for pid in $qemu_pid $timer_pid; do
    { kill "$pid" && wait "$pid"; } 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The script.
if [[ $# -eq 1 && $1 == - ]]; then
  cat >"$work/run/cmd"
elif [[ $# -eq 1 && -f $1 && $(head -c 4 "$1" | od -An -tx1 | tr -d ' ') != 7f454c46 ]]; then
  cp "$1" "$work/run/cmd"
else
  printf '%s\n' "$*" >"$work/run/cmd"
fi
chmod 0644 "$work/run/cmd"

# The shares, by absolute path (symlinks resolved: the guest has none of the host's).
for i in "${!shares[@]}"; do
  [[ -d ${shares[i]} ]] || die "--share: no directory '${shares[i]}'"
  shares[i]=$(realpath "${shares[i]}")
  [[ ${shares[i]} != / ]] || die "--share: not the root directory"
done
# The working directory: the caller's if a share holds it, else the first share, else /root.
workdir=/root
((${#shares[@]} == 0)) || workdir=${shares[0]}
here=$(pwd -P)
for dir in "${shares[@]}"; do
  [[ $here/ == "$dir"/* ]] && workdir=$here && break
done
# For the guest (guest/nsbox-vm-run): one share per line, in tag order, and the directory.
for dir in "${shares[@]}"; do
  [[ $dir != *$'\n'* && $dir != *,* ]] || die "--share: no newline or comma in the path, please: '$dir'"
  echo "$dir"
done >"$work/run/shares"
echo "$workdir" >"$work/run/workdir"

# Accelerator: KVM only where it can run a stock kernel.
accel=${NSBOX_VM_ACCEL:-}
if [[ -z $accel ]]; then
  if [[ -w /dev/kvm && ! -e /sys/module/kvm_pvm ]]; then accel=kvm; else accel=tcg; fi
fi
case $accel in
  kvm) accel_args=(-accel kvm -cpu host) ;;
  tcg) accel_args=(-accel "tcg,thread=multi,tb-size=256" -cpu max) ;;
  *) die "NSBOX_VM_ACCEL: kvm or tcg, not '$accel'" ;;
esac

# The kernel: the uncompressed ELF file, booted through its PVH entry point (no decompression
# under TCG: seconds faster, but no KASLR), or with NSBOX_VM_BZIMAGE=1 the bzImage as a boot
# loader would start it.
kernel_file=$image/vmlinux-$kernel
[[ -z ${NSBOX_VM_BZIMAGE:-} ]] || kernel_file=$image/vmlinuz-$kernel

# The kernel command line. panic=-1: a panic reboots, which -no-reboot turns into qemu's exit.
# cryptomgr.notests: no self-tests of the crypto algorithms at boot (half a second under TCG).
# quiet unless -v: only warnings and errors on the console (its tail is printed on failure).
cmdline="console=ttyS0 panic=-1 cryptomgr.notests nsbox.init=$init"
[[ -n $verbose ]] || cmdline+=" quiet"
if [[ $init == systemd ]]; then
  # Pure cgroup v2 (bookworm's systemd defaults to it; say so anyway). Masked: units that only
  # slow a throwaway VM's boot (the root's e2scrub, maintenance timers) and login prompts on
  # the consoles (ttyS0 is the console log).
  cmdline+=" systemd.unified_cgroup_hierarchy=1"
  for unit in e2scrub_reap.service e2scrub_all.timer apt-daily.timer apt-daily-upgrade.timer \
    fstrim.timer dpkg-db-backup.timer serial-getty@ttyS0.service getty@tty1.service; do
    cmdline+=" systemd.mask=$unit"
  done
fi
cmdline+=${NSBOX_VM_APPEND:+ $NSBOX_VM_APPEND}

qemu=(
  qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot -machine q35
  "${accel_args[@]}" -m "$mem" -smp "$cpus"
  -kernel "$kernel_file" -initrd "$image/initrd-$kernel.img" -append "$cmdline"
  -drive "file=$image/root.img,if=virtio,format=raw,snapshot=on"
  -nic none
  -chardev "file,id=console,path=$work/console.log" -serial chardev:console
  -device virtio-serial-pci
  -fsdev "local,id=nsbox-run,path=$work/run,security_model=passthrough"
  -device "virtio-9p-pci,fsdev=nsbox-run,mount_tag=nsbox-run"
)
for name in stdout stderr; do
  mkfifo "$work/$name.in" "$work/$name.out"
  qemu+=(-chardev "pipe,id=$name,path=$work/$name" -device "virtserialport,chardev=$name,name=$name")
done
for i in "${!shares[@]}"; do
  qemu+=(-fsdev "local,id=share$i,path=${shares[i]},security_model=passthrough"
    -device "virtio-9p-pci,fsdev=share$i,mount_tag=share$i")
done

# The copiers: they block in open() until qemu opens the FIFOs, and see end-of-file when qemu
# exits (qemu opens them read-write, so not before).
cat "$work/stdout.out" &
out_pid=$!
cat "$work/stderr.out" >&2 &
err_pid=$!

: >"$work/console.log"
start=$SECONDS
# qemu's own messages go to a log of their own, printed when the VM fails (or live with -v).
"${qemu[@]}" 2>"$work/qemu.log" &
qemu_pid=$!
[[ -z $verbose ]] || tail -q -n +1 -F --pid="$qemu_pid" "$work/console.log" "$work/qemu.log" >&2 2>/dev/null &
timed_out=
if [[ -n $timeout ]]; then
  # Whichever ends first: qemu, or the timer (then qemu is killed).
  sleep "$timeout" &
  timer_pid=$!
  wait -n -p first "$qemu_pid" "$timer_pid" || true
  if [[ ${first:-} == "$timer_pid" ]]; then
    timed_out=1
    kill "$qemu_pid" 2>/dev/null || true
  else
    kill "$timer_pid" 2>/dev/null || true
  fi
  wait "$timer_pid" 2>/dev/null || true
  timer_pid=
fi
qemu_status=0
wait "$qemu_pid" || qemu_status=$?
qemu_pid=

# If qemu never opened a FIFO (it failed to start), its `cat` still waits in open(): a
# read-write open of our own (which never blocks) lets it through to end-of-file.
for name in stdout stderr; do
  exec {fd}<>"$work/$name.out"
  exec {fd}>&-
done
wait "$out_pid" "$err_pid" || true
[[ -z $verbose ]] || echo "nsbox-vm: qemu ran $((SECONDS - start)) s" >&2

# The whole console (kernel, init, systemd), kept where NSBOX_VM_CONSOLE names: a guest that
# died (a kernel oops) says why at its start, long before the tail.
if [[ -n ${NSBOX_VM_CONSOLE:-} ]]; then
  cp "$work/console.log" "$NSBOX_VM_CONSOLE" || echo "nsbox-vm: cannot keep the console in $NSBOX_VM_CONSOLE" >&2
fi

# console_tail N: the console's last N lines and qemu's messages, on stderr.
console_tail() {
  tail -n "$1" "$work/console.log" >&2
  [[ ! -s $work/qemu.log || -n $verbose ]] || sed 's/^/qemu: /' "$work/qemu.log" >&2
}
if [[ -n $timed_out ]]; then
  echo "nsbox-vm: timed out after $timeout s; the console's last lines:" >&2
  console_tail 20
  exit 124
fi
if [[ -s $work/run/rc ]]; then
  exit "$(cat "$work/run/rc")"
fi
echo "nsbox-vm: the VM stopped without a status (qemu exit status $qemu_status); the console's last lines:" >&2
console_tail 40
exit 125
