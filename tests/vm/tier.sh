#!/usr/bin/env bash
# tests/vm/tier.sh: the VM tier (ctest label `vm`). Boots stock Debian kernels with only cgroup v2
# mounted (tests/vm/run.sh) and, in each, runs the named subset of the e2e suite
# (tests/vm/e2e_subset.txt) with nsboxd placed as users place it:
#
#   root-cgroup    no systemd (run.sh --init plain): the harness's own child, in the root cgroup
#   container      `nsbox run` alone in a cgroup namespace of its own, as in a container
#   cgroupfs       `nsbox run` in a cgroup that is not its own, without systemd
#   systemd-unit   a real systemd as PID 1 running deploy/nsboxd.service (NSBOX_E2E_PLACEMENT)
#   sudo-session   `sudo scripts/start` from user tester's login session under that systemd
#   normal-user    `nsbox serve` and `nsbox run` as tester: refused at start, saying why
#   service-as-is  deploy/nsboxd.service unchanged (ExecStart=/usr/local/bin/nsbox serve):
#                  enable --now, a sandbox with a memory limit, stop
#   package        the Debian package of the build (BUILD/nsbox_*_amd64.deb, `cpack -G DEB`:
#                  scripts/test makes it) installed, used from tester's login session, upgraded
#                  over a running sandbox, upgraded with dpkg interrupted, removed, purged, and
#                  installed on a host with user namespaces disabled (tests/vm/package_row.sh).
#                  In the systemd boot of bookworm only (NSBOX_VM_PACKAGE_KERNELS): what it
#                  tests is dpkg, systemd 252 and the maintainer scripts, the same userland
#                  under either kernel
#
# Usage: tests/vm/tier.sh [--kernels "bookworm trixie"] [--boots "plain systemd"] [--build DIR]
#                         [--logs DIR]
# Every run's whole output goes to LOGS/<kernel>-<boot>.log (default build/vm-logs); a failed
# placement prints its log's tail. The last lines are a table, one row per kernel and placement,
# with PASS or FAIL, then "N passed, N failed". Exit status 0 when every row passed.
#
# The build must exist (scripts/test builds it first); nothing here builds. The guests share the
# repository at its own path, so the build's absolute paths hold inside.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
kernels="bookworm trixie"
boots="plain systemd"
build="$ROOT/build"
logs=
while (($# > 0)); do
  case $1 in
    --kernels) kernels=${2:?} && shift 2 ;;
    --build) build=$(realpath "${2:?}") && shift 2 ;;
    --logs) logs=${2:?} && shift 2 ;;
    --boots) boots=${2:?} && shift 2 ;;
    *) echo "tier.sh: unknown argument '$1'" >&2 && exit 2 ;;
  esac
done
logs=${logs:-$build/vm-logs}
mkdir -p "$logs"
[[ -x $build/runtime/nsbox && -x $build/tests/e2e_exec_test ]] || {
  echo "tier.sh: no build in $build (scripts/test builds it)" >&2
  exit 2
}
# Under qemu's TCG a guest runs CPU work 15-20x slower than the host; the harness's own waits
# are scaled by this (NSBOX_E2E_TIME_SCALE).
scale=${NSBOX_VM_TIME_SCALE:-10}
# sudo-session starts every test's daemon through scripts/start (its package check and a no-op
# build over 9p: about 10 s under TCG), so it runs the binaries that cover creation, limits, the
# OOM reason, the timeout kill and persistence across restarts, not the whole subset.
sudo_binaries='^e2e_(api|exec|lifecycle)_test$'
package_kernels=${NSBOX_VM_PACKAGE_KERNELS:-bookworm}

# The gtest command lines of the subset, one per binary, for the guest script; only the binaries
# matching the regular expression $1 when given.
subset_commands() {
  local binary filter
  while read -r binary filter; do
    [[ -z $binary || $binary == \#* ]] && continue
    [[ -z ${1:-} || $binary =~ $1 ]] || continue
    printf '  run_gtest %q %q\n' "$build/tests/$binary" "$filter"
  done <"$ROOT/tests/vm/e2e_subset.txt"
}

# The guest script's common head: a result line per placement ("@@ RESULT name PASS|FAIL").
guest_head() {
  cat <<EOF
set -uo pipefail
export NSBOX_E2E_TIME_SCALE=$scale
build=$(printf %q "$build")
root=$(printf %q "$ROOT")
failed=0
run_gtest() {
  "\$1" --gtest_filter="\$2" --gtest_color=no || failed=1
}
t0=0
result() {
  local verdict=FAIL
  [[ \$2 == 0 ]] && verdict=PASS
  echo "@@ RESULT \$1 \$verdict \$((SECONDS - t0))s"
}
echo "== \$(uname -r); \$(grep -c cgroup /proc/mounts) cgroup mount(s): \$(grep cgroup /proc/mounts)"
echo "== root cgroup.subtree_control: \$(cat /sys/fs/cgroup/cgroup.subtree_control)"
EOF
}

plain_script() {
  guest_head
  cat <<EOF
echo "== nsbox doctor"; "\$build/runtime/nsbox" doctor | grep -E 'cgroup|privileges' || true
echo "== placement root-cgroup: \$(cat /proc/self/cgroup)"
failed=0 t0=\$SECONDS
export NSBOX_E2E_PLACEMENT=child
$(subset_commands)
result root-cgroup \$failed

echo "== placement container: nsbox run alone in a cgroup namespace of its own (a container's)"
failed=0 t0=\$SECONDS
mkdir -p /sys/fs/cgroup/ctr
# One process all along, as a container's only one (each step execs the next): it joins /ctr,
# enters a cgroup namespace whose root that is, mounts its own cgroup2 view there (in a mount
# namespace of its own), then is nsbox run.
cat >/tmp/container.sh <<'SCRIPT'
echo \$\$ >/sys/fs/cgroup/ctr/cgroup.procs
exec unshare -C -m sh -c 'umount /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "\$0" run --memory 64M --pids 16 -- sh -c "echo ran in \$(cat /proc/self/cgroup)"' "\$1"
SCRIPT
sh /tmp/container.sh "\$build/runtime/nsbox" || failed=1
echo "/ctr afterwards: \$(ls -d /sys/fs/cgroup/ctr/*/ | tr '\n' ' '); passed on: \$(cat /sys/fs/cgroup/ctr/cgroup.subtree_control)"
[[ -d /sys/fs/cgroup/ctr/supervisor && \$(cat /sys/fs/cgroup/ctr/cgroup.subtree_control) == *memory* ]] || failed=1
result container \$failed

echo "== placement cgroupfs: nsbox run in someone else's cgroup, no systemd"
failed=0 t0=\$SECONDS
mkdir -p /sys/fs/cgroup/job
cat >/tmp/job.sh <<'SCRIPT'
echo \$\$ >/sys/fs/cgroup/job/cgroup.procs
exec "\$1" run --memory 64M --pids 16 -- sh -c 'echo ran'
SCRIPT
sh /tmp/job.sh "\$build/runtime/nsbox" || failed=1
echo "/sys/fs/cgroup/nsbox passes on: \$(cat /sys/fs/cgroup/nsbox/cgroup.subtree_control 2>&1)"
[[ \$(cat /sys/fs/cgroup/nsbox/cgroup.subtree_control) == *memory* ]] || failed=1
result cgroupfs \$failed
EOF
}

systemd_script() { # KERNEL
  guest_head
  cat <<EOF
echo "== systemd: \$(systemctl is-system-running)"
echo "== nsbox doctor (from nsbox-vm-run.service, not delegated)"
"\$build/runtime/nsbox" doctor | grep -E 'cgroup|privileges' || true

echo "== placement systemd-unit"
failed=0 t0=\$SECONDS
export NSBOX_E2E_PLACEMENT=systemd-unit
$(subset_commands)
result systemd-unit \$failed
rm -rf /run/systemd/system/nsboxd.service.d; systemctl daemon-reload

echo "== placement sudo-session"
failed=0 t0=\$SECONDS
export NSBOX_E2E_PLACEMENT=sudo-session
$(subset_commands "$sudo_binaries")
# Where that daemon ended up: a delegated scope of its own, not tester's session scope.
su -l tester -c "sudo \$root/scripts/start --socket /tmp/placed.sock --state-dir /tmp/placed" >/tmp/placed.log 2>&1 &
for _ in \$(seq 200); do [[ -S /tmp/placed.sock ]] && break; sleep 0.3; done
placed=\$(pgrep -f -- 'serve --socket /tmp/placed.sock' | head -1)
where=\$(cat /proc/\$placed/cgroup 2>&1)
echo "sudo scripts/start from a login session: nsboxd (pid \$placed) is in \$where"
grep 'cgroup placement' /tmp/placed.log
[[ \$where =~ ^0::/system.slice/nsboxd-[0-9]+.scope/supervisor\$ ]] || failed=1
"\$build/runtime/nsbox" --socket /tmp/placed.sock create placed --memory 64M --pids 32 || failed=1
"\$build/runtime/nsbox" --socket /tmp/placed.sock exec placed -- true || failed=1
scope=\$(dirname "/sys/fs/cgroup\${where#0::}")
echo "its sandboxes' pids.max: \$(cat \$scope/nsbox-*/pids.max | tr '\\n' ' ')"
grep -qx 32 \$scope/nsbox-*/pids.max || failed=1
kill -TERM \$placed; wait
# And sudo nsbox run from the same kind of session: a scope of its own too, limits enforced.
out=\$(su -l tester -c "sudo \$build/runtime/nsbox run --memory 64M --pids 16 -- sh -c 'echo ran'" 2>&1); rc=\$?
echo "sudo nsbox run from a login session: exit \$rc: \$out"
[[ \$rc == 0 && \$out == *ran* ]] || failed=1
out=\$(su -l tester -c "sudo \$build/runtime/nsbox run --memory 32M -- perl -e '\\\$x = q(a) x (128 << 20)'" 2>&1); rc=\$?
echo "sudo nsbox run, 128 MiB under a 32 MiB limit: exit \$rc"
[[ \$rc == 137 ]] || failed=1
result sudo-session \$failed
unset NSBOX_E2E_PLACEMENT

echo "== placement normal-user"
failed=0 t0=\$SECONDS
out=\$(su -l tester -c "\$build/runtime/nsbox serve --socket /tmp/user.sock --state-dir /tmp/user-state" 2>&1); rc=\$?
echo "nsbox serve as tester: exit \$rc: \$out"
[[ \$rc == 1 && \$out == *"needs root"* && ! -e /tmp/user.sock ]] || failed=1
out=\$(su -l tester -c "\$build/runtime/nsbox run -- true" 2>&1); rc=\$?
echo "nsbox run as tester: exit \$rc: \$out"
[[ \$rc == 125 && \$out == *"needs root"* ]] || failed=1
result normal-user \$failed

echo "== placement service-as-is: deploy/nsboxd.service as its comment installs it"
failed=0 t0=\$SECONDS
ln -sf "\$build/runtime/nsbox" /usr/local/bin/nsbox
install -m 0644 "\$root/deploy/nsboxd.service" /etc/systemd/system/nsboxd.service
systemctl daemon-reload
systemctl enable --now nsboxd || failed=1
for _ in \$(seq 100); do [[ -S /run/nsbox/nsboxd.sock ]] && break; sleep 0.3; done
nsbox create demo --memory 64M || failed=1
nsbox exec demo -- 'echo hello from \$(hostname)' || failed=1
unit=/sys/fs/cgroup/system.slice/nsboxd.service
main=\$(systemctl show -p MainPID --value nsboxd)
echo "nsboxd (pid \$main) is in \$(cat /proc/\$main/cgroup); \$unit/cgroup.subtree_control: \$(cat \$unit/cgroup.subtree_control)"
[[ \$(cat /proc/\$main/cgroup) == 0::/system.slice/nsboxd.service/supervisor ]] || failed=1
limits=\$(cat \$unit/nsbox-*/memory.max 2>&1)
echo "the sandboxes' memory.max: \$limits"
[[ \$limits == *67108864* ]] || failed=1
nsbox exec demo -- 'perl -e "\\\$x = q(a) x (256 << 20)"'; rc=\$?
echo "256 MiB under a 64 MiB limit: exit \$rc"
[[ \$rc == 137 ]] || failed=1
journalctl -u nsboxd --no-pager | grep -E 'cgroup placement' || failed=1
systemctl status nsboxd --no-pager | head -20
systemctl stop nsboxd || failed=1
[[ \$(systemctl is-active nsboxd) == inactive ]] || failed=1
result service-as-is \$failed
EOF
  [[ " $package_kernels " == *" $1 "* ]] || return 0
  cat <<EOF

echo "== placement package: the Debian package, installed, upgraded, removed, purged"
failed=0 t0=\$SECONDS
bash "\$root/tests/vm/package_row.sh" "\$build" || failed=1
result package \$failed
EOF
}

results=()
run_boot() { # KERNEL BOOT: boots one VM, collects its result lines
  local kernel=$1 boot=$2 log="$logs/$1-$2.log" script rc=0 started=$SECONDS
  script=$(mktemp)
  if [[ $boot == plain ]]; then plain_script >"$script"; else systemd_script "$kernel" >"$script"; fi
  echo "== tier.sh: $kernel, $boot boot (log: $log)" >&2
  NSBOX_VM_CONSOLE="$log.console" "$ROOT/tests/vm/run.sh" --kernel "$kernel" --init "$boot" \
    --share "$ROOT" --mem 3G --timeout "${NSBOX_VM_TIMEOUT:-1500}" "$script" >"$log" 2>&1 || rc=$?
  if ((rc == 125)); then
    # The guest died without a status: under qemu's emulated CPU a guest kernel has been seen to
    # panic (once, in kmalloc, under a fork storm at a pids limit) where the same test passes on
    # the next boot. Said loudly, kept, and tried once more; a second death fails the row.
    echo "== tier.sh: the $boot boot of $kernel died (exit 125); its console's tail:" >&2
    tail -n 40 "$log" >&2
    mv "$log" "$log.died"
    mv "$log.console" "$log.died.console" 2>/dev/null || true
    echo "== tier.sh: booting it once more (log: $log; the first boot's console: $log.died.console)" >&2
    rc=0
    NSBOX_VM_CONSOLE="$log.console" "$ROOT/tests/vm/run.sh" --kernel "$kernel" --init "$boot" \
      --share "$ROOT" --mem 3G --timeout "${NSBOX_VM_TIMEOUT:-1500}" "$script" >"$log" 2>&1 || rc=$?
  fi
  rm -f "$script"
  echo "== tier.sh: $kernel, $boot boot: exit $rc after $((SECONDS - started)) s" >&2
  local line found=0
  while read -r line; do
    set -- $line
    results+=("$kernel $3 $4 ${5:-}")
    found=1
    if [[ $4 != PASS ]]; then
      echo "== tier.sh: $kernel $3 FAILED; the log's gtest failures and tail:" >&2
      grep -E '^\[  FAILED|Failure|error' "$log" | head -40 >&2 || true
      tail -n 60 "$log" >&2
    fi
  done < <(grep '^@@ RESULT ' "$log" || true)
  if ((found == 0 || rc != 0)); then
    results+=("$kernel $boot-boot FAIL -")
    echo "== tier.sh: the $boot boot of $kernel ended with $rc; its log's tail:" >&2
    tail -n 80 "$log" >&2
  fi
}

for kernel in $kernels; do
  for boot in $boots; do
    run_boot "$kernel" "$boot"
  done
done

passed=0 failed=0
printf '\n%-10s %-15s %-7s %s\n' KERNEL PLACEMENT RESULT TIME
for row in "${results[@]}"; do
  # shellcheck disable=SC2086
  printf '%-10s %-15s %-7s %s\n' $row
  [[ $row == *" PASS "* ]] && passed=$((passed + 1)) || failed=$((failed + 1))
done
echo "vm: $passed passed, $failed failed"
((failed == 0))
