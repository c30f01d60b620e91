#!/usr/bin/env bash
# tests/vm/package_row.sh BUILD: the VM tier's `package` row, run as root in the systemd guest
# (tests/vm/tier.sh). The Debian package of BUILD (BUILD/nsbox_VERSION_amd64.deb, made by
# `cpack -G DEB`) installed as a user installs it, used by a member of its socket's group from a
# login session, upgraded over a running sandbox, upgraded again with dpkg interrupted after the
# unpack, removed, purged; then installed on a host whose user namespaces are disabled.
# Each check prints "ok: ..." or "FAIL: ..."; the exit status is the number of failures.
set -uo pipefail
build=${1:?usage: package_row.sh BUILD}
fails=0
check() { # WHAT COMMAND...: runs COMMAND, says ok or FAIL
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
as_tester() { su -l tester -c "$1"; }
wait_socket() { for _ in $(seq 100); do [[ -S /run/nsbox/nsboxd.sock ]] && return 0; sleep 0.2; done; return 1; }
main_pid() { systemctl show -p MainPID --value nsboxd; }

shopt -s nullglob
debs=("$build"/nsbox_*_amd64.deb)
[[ ${#debs[@]} == 1 ]] || { echo "FAIL: want one $build/nsbox_*_amd64.deb, found ${#debs[@]}"; exit 1; }
deb=${debs[0]}
version=$(dpkg-deb -f "$deb" Version)
# The upgrades: the same package with higher versions, repacked here (dpkg-deb -R, Version
# edited, -b without compression): seconds, where a second cpack would mean a second configure of
# the build with another project(VERSION). Only the package's version differs; `nsbox --version`
# stays the build's. That is what an upgrade does to dpkg, systemd and the maintainer scripts.
repack() { # SUFFIX -> /tmp/nsbox_VERSION+SUFFIX.deb
  rm -rf /tmp/repack && dpkg-deb -R "$deb" /tmp/repack &&
    sed -i "s/^Version: .*/Version: $version+$1/" /tmp/repack/DEBIAN/control &&
    dpkg-deb -Znone -b /tmp/repack "/tmp/nsbox_$version+$1.deb" >/dev/null
}
repack vm2 && repack vm3 || { echo "FAIL: repacking $deb"; exit 1; }

# What the service-as-is row left: its unit in /etc (which would shadow the package's), its link.
systemctl disable --now nsboxd >/dev/null 2>&1
rm -f /etc/systemd/system/nsboxd.service /usr/local/bin/nsbox
rm -rf /var/lib/nsbox
systemctl daemon-reload

echo "== install $deb ($(du -k "$deb" | cut -f1) KiB)"
check "apt-get install ./$(basename "$deb")" apt-get install -y "$deb"
check "systemctl is-active nsboxd: active" test "$(systemctl is-active nsboxd)" = active
check "systemctl is-enabled nsboxd: enabled" test "$(systemctl is-enabled nsboxd)" = enabled
check "the group nsbox exists" getent group nsbox
wait_socket
stat -c '%n %U:%G %a' /run/nsbox/nsboxd.sock
check "the socket is root:nsbox 0660" test "$(stat -c '%U:%G %a' /run/nsbox/nsboxd.sock)" = "root:nsbox 660"
check "nsbox-init and nsbox-net in /usr/libexec/nsbox" test -x /usr/libexec/nsbox/nsbox-init -a -x /usr/libexec/nsbox/nsbox-net
grep '^ExecStart' /usr/lib/systemd/system/nsboxd.service

echo "== tester, in the group nsbox, from a login session"
out=$(as_tester 'nsbox ls' 2>&1)
echo "before joining the group: $out"
check "outside the group: refused, naming the group" grep -q nsbox <<<"$out"
usermod -aG nsbox tester
check "nsbox create pkg" as_tester 'nsbox create pkg'
check "a file written in the sandbox" as_tester "nsbox exec pkg -- 'echo kept > note.txt'"
out=$(as_tester 'nsbox exec pkg -- cat note.txt' 2>&1)
check "a command reads it: '$out'" test "$out" = kept

echo "== upgrade to $version+vm2 over the running sandbox"
before=$(main_pid)
check "apt-get install ./nsbox_$version+vm2.deb" apt-get install -y "/tmp/nsbox_$version+vm2.deb"
after=$(main_pid)
echo "nsboxd: pid $before before, $after after"
check "the daemon restarted" test "$before" != "$after" -a "$(systemctl is-active nsboxd)" = active
wait_socket
out=$(as_tester 'nsbox exec pkg -- cat note.txt' 2>&1)
check "the file survived and a command runs: '$out'" test "$out" = kept

echo "== upgrade to $version+vm3 interrupted after the unpack (dpkg --unpack, no configure)"
check "dpkg --unpack" dpkg --unpack "/tmp/nsbox_$version+vm3.deb"
dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' nsbox
check "the package is unpacked, not configured" test "$(dpkg-query -W -f='${db:Status-Abbrev}' nsbox)" = "iU "
check "systemctl restart nsboxd (the new binaries)" systemctl restart nsboxd
wait_socket
out=$(as_tester 'nsbox exec pkg -- cat note.txt' 2>&1)
check "the workspace is whole: '$out'" test "$out" = kept
check "dpkg --configure -a completes it" dpkg --configure -a
check "installed: $version+vm3" test "$(dpkg-query -W -f='${db:Status-Abbrev}${Version}' nsbox)" = "ii $version+vm3"
check "active after configure" test "$(systemctl is-active nsboxd)" = active

echo "== apt-get remove nsbox"
apt-get remove -y nsbox 2>&1 | tee /tmp/remove.log
check "the service is stopped" test "$(systemctl is-active nsboxd)" != active
check "remove says the workspaces are kept" grep -q "are kept; 'apt purge nsbox' removes them" /tmp/remove.log
ws=$(grep -rl --include=note.txt kept /var/lib/nsbox 2>/dev/null | head -1)
check "/var/lib/nsbox keeps the workspace's file (${ws:-none})" test -n "$ws"

echo "== apt-get purge nsbox"
apt-get purge -y nsbox 2>&1 | tee /tmp/purge.log
check "purge says what it removes" grep -q "removing /var/lib/nsbox (" /tmp/purge.log
check "/var/lib/nsbox is gone" test ! -e /var/lib/nsbox
check "the group nsbox is gone" test -z "$(getent group nsbox)"

echo "== a host whose user namespaces are disabled (sysctl user.max_user_namespaces=0)"
sysctl -w user.max_user_namespaces=0
check "dpkg -i completes" dpkg -i "$deb"
sleep 4 # RestartSec=1s: a crash loop would have restarted it by now
systemctl status nsboxd --no-pager 2>&1 | head -15
check "NRestarts=0" test "$(systemctl show -p NRestarts --value nsboxd)" = 0
check "exit status 78, the unit failed" test "$(systemctl show -p ExecMainStatus --value nsboxd)" = 78
journalctl -u nsboxd --no-pager -o cat | tail -5
check "the journal names the cause and the fix" journalctl -u nsboxd --no-pager -o cat --grep 'sysctl -w user.max_user_namespaces'
nsbox doctor | grep -E 'user namespaces|required'
check "nsbox doctor names it" sh -c 'nsbox doctor | grep -q "user.max_user_namespaces"'
sysctl -w user.max_user_namespaces=15000 >/dev/null
check "with the sysctl back, systemctl start works" systemctl start nsboxd
wait_socket && check "active" test "$(systemctl is-active nsboxd)" = active

echo "== purge with a mount under /var/lib/nsbox: refused, nothing removed across it"
systemctl stop nsboxd
mkdir -p /var/lib/nsbox/held && mount -t tmpfs held /var/lib/nsbox/held && echo x >/var/lib/nsbox/held/f
dpkg --purge nsbox 2>&1 | tee /tmp/purge2.log
check "purge names the mount and removes nothing" grep -q "/var/lib/nsbox is in use and is not removed: /var/lib/nsbox/held" /tmp/purge2.log
check "the mount and its file are still there" test -f /var/lib/nsbox/held/f
umount /var/lib/nsbox/held && rm -rf /var/lib/nsbox

echo "package row: $fails failure(s)"
exit "$fails"
