#!/usr/bin/env bash
# tests/vm/selftest.sh: check the VM harness itself, on both kernels and in both init modes,
# and print how long each boot took. Run as root; builds the image first if needed.
#
# Usage: tests/vm/selftest.sh [--kernel bookworm|trixie] [--init plain|systemd]
#   (default: all four combinations)
#
# Checked in every VM: the kernel is the one asked for; ONLY cgroup2 is mounted, at
# /sys/fs/cgroup with systemd's options; the exit status and both output streams come back;
# the repository is shared at its own path and the host-built `nsbox doctor` runs (when
# build/runtime/nsbox exists).
# Plain mode: the command is in the root cgroup and the root enables cpu io memory pids.
# systemd mode: `systemctl is-system-running` says running (or degraded), the command is in
# nsbox-vm-run.service, `su -l tester` gets a logind session scope
# (user.slice/user-1000.slice/session-*.scope) and `sudo -n true` works for tester.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
kernels=(bookworm trixie)
inits=(plain systemd)
while (($# > 0)); do
  case $1 in
    --kernel) kernels=("$2") && shift 2 ;;
    --init) inits=("$2") && shift 2 ;;
    *) echo "usage: $0 [--kernel bookworm|trixie] [--init plain|systemd]" >&2 && exit 2 ;;
  esac
done

"$HERE/image.sh" >/dev/null
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

for kernel in "${kernels[@]}"; do
  kver=$(cat "$("$HERE/image.sh")/kver-$kernel")
  for init in "${inits[@]}"; do
    echo "== $kernel ($kver), init $init"
    # The guest's half: facts on stdout as KEY=VALUE lines, a marker on stderr, status 42.
    script=$(
      cat <<'EOF'
echo "uptime=$(cut -d' ' -f1 /proc/uptime)"
echo "kernel=$(uname -r)"
echo "cgroup=$(cat /proc/self/cgroup)"
echo "mounts=$(grep -c -e cgroup /proc/mounts)"
echo "cgroup2=$(awk '$3 == "cgroup2" { print $2, $4 }' /proc/mounts)"
echo "subtree=$(cat /sys/fs/cgroup/cgroup.subtree_control)"
if [[ -x build/runtime/nsbox ]]; then
  build/runtime/nsbox doctor >/tmp/doctor 2>&1
  echo "doctor=$? $(tail -n1 /tmp/doctor)"
fi
if [[ -d /run/systemd/system ]]; then
  echo "running=$(systemctl is-system-running)"
  echo "session=$(su -l tester -c 'cat /proc/self/cgroup')"
  echo "sudo=$(su -l tester -c 'sudo -n true && echo ok')"
fi
echo to-stderr >&2
exit 42
EOF
    )
    start=$(date +%s.%N)
    status=0
    out=$(cd "$REPO" && "$HERE/run.sh" --kernel "$kernel" --init "$init" --share "$REPO" --timeout 300 \
      "$script" 2>"${TMPDIR:-/tmp}/nsbox-vm-selftest.err") || status=$?
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    err=$(cat "${TMPDIR:-/tmp}/nsbox-vm-selftest.err")
    rm -f "${TMPDIR:-/tmp}/nsbox-vm-selftest.err"
    get() { sed -n "s/^$1=//p" <<<"$out"; }

    [[ $status == 42 ]] || fail "exit status $status, not 42; stderr: $err"
    [[ $err == to-stderr ]] || fail "stderr is '$err', not 'to-stderr'"
    [[ $(get kernel) == "$kver" ]] || fail "kernel $(get kernel), not $kver"
    [[ $(get mounts) == 1 ]] || fail "$(get mounts) cgroup mounts, not 1"
    [[ $(get cgroup2) == "/sys/fs/cgroup rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot" ]] ||
      fail "cgroup2 mount: $(get cgroup2)"
    if [[ $init == plain ]]; then
      [[ $(get cgroup) == 0::/ ]] || fail "plain: cgroup $(get cgroup), not the root"
      [[ $(get subtree) == "cpu io memory pids" ]] || fail "plain: subtree_control '$(get subtree)'"
    else
      [[ $(get cgroup) == 0::/system.slice/nsbox-vm-run.service ]] || fail "systemd: cgroup $(get cgroup)"
      [[ $(get running) == running || $(get running) == degraded ]] || fail "systemd: is-system-running says $(get running)"
      [[ $(get session) =~ ^0::/user.slice/user-1000.slice/session-[^/]*\.scope$ ]] ||
        fail "systemd: su -l tester is in '$(get session)', not a session scope"
      [[ $(get sudo) == ok ]] || fail "systemd: sudo -n true failed for tester"
    fi
    if [[ -x $REPO/build/runtime/nsbox ]]; then
      [[ $(get doctor) == 0* ]] || fail "nsbox doctor: $(get doctor)"
    fi
    printf '   command started at guest uptime %s s; run.sh took %.1f s\n' "$(get uptime)" "$wall"
    [[ -z $(get doctor) ]] || echo "   nsbox doctor: $(get doctor | cut -d' ' -f2-)"
    [[ $init == plain ]] || echo "   su -l tester: $(get session)"
  done
done

if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all checks passed"
