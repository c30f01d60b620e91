#!/usr/bin/env bash
# tests/vm/image.sh: build (once) and cache the guest image of the VM test tier, then print the
# directory that holds it. run.sh calls it before every boot; when the cache is current it
# returns at once.
#
# Usage: tests/vm/image.sh            build if needed, print the image directory on stdout
#        tests/vm/image.sh --rebuild  throw the cache away and build again
#        tests/vm/image.sh --packages print the guest's package list and exit
#        tests/vm/image.sh --check-libs [BINARY...]
#                                     print the Debian packages behind the shared libraries of
#                                     host-built binaries (default: every executable of build/)
#                                     and whether the guest has them
#
# What the image is (docs: tests/vm/README.md):
#   * a Debian 12 (bookworm) root file system, `debootstrap --variant=minbase` from the host's
#     own Debian mirror (read from its apt sources, never written into any file here), with
#     systemd, the nsbox build and runtime packages (scripts/lib.sh NSBOX_PACKAGES) and the
#     libraries the host-built binaries link, so they run from the 9p share unchanged;
#   * two kernels: bookworm's linux-image-amd64 (6.1, installed as a package) and trixie's
#     (6.12, one .deb fetched with a throwaway apt configuration; the host's apt sources are
#     left alone). Both kernels' modules are in the image, so modprobe works in the guest;
#   * root.img: a raw ext4 image of that tree (made by mkfs.ext4 -d, no loop mounts). qemu
#     opens it with snapshot=on, so a run never changes it and runs can overlap;
#   * per kernel: vmlinuz-NAME (the bzImage), vmlinux-NAME (the same kernel uncompressed, which
#     qemu boots faster, see extract_vmlinux) and initrd-NAME.img, a tiny busybox initramfs
#     that loads the few modules needed to mount the root disk and the 9p shares, then
#     switch_root's to the plain init (guest/nsbox-vm-init) or to systemd, as the kernel
#     command line says (guest/init).
#
# Cache: $NSBOX_VM_CACHE (default /var/cache/nsbox-vm), in two stages so that editing the
# guest scripts does not mean a new debootstrap:
#   rootfs-KEY1/  the unpacked tree. KEY1 hashes the package list and the code of the functions
#                 that build it (build_rootfs and the functions it calls).
#   image-KEY2/   root.img, the kernels and initrds. KEY2 hashes KEY1, this script and
#                 everything under guest/.
# Older rootfs-* and image-* directories are removed after a successful build. A lock file
# serialises builds (run.sh may be started several times at once).
#
# Needs root (debootstrap, chroot, file ownership in the image). Installs its host tools with
# apt-get when they are missing.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${NSBOX_VM_CACHE:-/var/cache/nsbox-vm}
SUITE=bookworm

# The guest's packages, on top of debootstrap's minbase. Sorted and de-duplicated below, with
# NSBOX_PACKAGES of scripts/lib.sh and $NSBOX_VM_EXTRA_PACKAGES (space-separated) added.
GUEST_PACKAGES=(
  # The init system, its login sessions (logind via pam_systemd) and sudo for the tests that
  # need a real systemd machine (run.sh --init systemd).
  systemd systemd-sysv dbus libpam-systemd sudo
  # Tools the tests and nsbox use in the guest.
  kmod procps util-linux iproute2 nftables busybox-static e2fsprogs uidmap
  # bookworm's kernel, 6.1 (the image also gets trixie's, see fetch_trixie_kernel).
  linux-image-amd64
  # Runtime libraries of the host-built binaries (`image.sh --check-libs` lists what they link;
  # most also come in as dependencies of the -dev packages, named here so that a slimmer
  # NSBOX_PACKAGES never loses them). libsystemd0: systemd's own tools (busctl, systemctl) link it.
  libc6 libstdc++6 libgcc-s1 libssl3 libldns3 libnftables1 libnftnl11 libmnl0 libxtables12
  libjansson4 libgmp10 libseccomp2 libcap2 liburing2 libspdlog1.10 libfmt9 libarchive13
  libnettle8 zlib1g libzstd1 liblzma5 libbz2-1.0 liblz4-1 libacl1 libsystemd0
)

# Packages of NSBOX_PACKAGES left out of the guest (none today). Anything listed here makes
# scripts/start in the guest try apt-get, which fails there: the guest has no network.
SKIPPED_PACKAGES=()

# Modules the tiny initramfs loads (with their dependencies) before switch_root: the virtio
# disk and its file system, the 9p shares, the virtio-serial ports that carry the command's
# output, and overlay. Everything else loads on demand from the image's /lib/modules.
INITRD_MODULES=(virtio_pci virtio_blk ext4 crc32c_generic 9p 9pnet_virtio virtio_console overlay)

# Each line says how long the script has run (where a CI log's minutes went).
log() { printf 'nsbox-vm image [%ds]: %s\n' "$SECONDS" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# The package list: GUEST_PACKAGES, NSBOX_PACKAGES and $NSBOX_VM_EXTRA_PACKAGES, minus
# SKIPPED_PACKAGES, one per line, sorted.
package_list() {
  local nsbox_packages extra_packages
  # lib.sh only defines things when sourced; do it in another bash so nothing else leaks in.
  # shellcheck disable=SC2016 # ($1 and the array are the inner bash's)
  mapfile -t nsbox_packages < <(bash -c 'source "$1" && printf "%s\n" "${NSBOX_PACKAGES[@]}"' _ "$REPO/scripts/lib.sh")
  read -ra extra_packages <<<"${NSBOX_VM_EXTRA_PACKAGES:-}"
  printf '%s\n' "${GUEST_PACKAGES[@]}" "${nsbox_packages[@]}" "${extra_packages[@]}" |
    grep -vxF -f <(printf '%s\n' "${SKIPPED_PACKAGES[@]}" '') | sort -u
}

# Print "URI SUITE" for every enabled `deb` entry of the host's apt sources, in both formats
# (one-line .list and deb822 .sources).
host_apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    # deb [options] URI SUITE COMPONENT...
    awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } print $i, $(i + 1) }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk '
      function flush(  n, m, i, j, u, s) {
        if (types ~ /(^| )deb( |$)/ && tolower(enabled) != "no") {
          n = split(uris, u, " "); m = split(suites, s, " ")
          for (i = 1; i <= n; i++) for (j = 1; j <= m; j++) print u[i], s[j]
        }
        types = uris = suites = ""; enabled = "yes"
      }
      BEGIN { enabled = "yes" }
      /^[ \t]*$/ { flush(); next }
      /^#/ { next }
      { key = tolower($1); sub(/^[^:]*:[ \t]*/, "") }
      key == "types:" { types = $0 }
      key == "uris:" { uris = $0 }
      key == "suites:" { suites = $0 }
      key == "enabled:" { enabled = $0 }
      END { flush() }' "$f"
  done
}

# The host's mirror for a suite (bookworm, bookworm-updates, bookworm-security), or nothing.
# $NSBOX_VM_MIRROR overrides the main mirror (used for the plain suites, trixie included).
mirror_for() {
  local suite=$1
  if [[ -n ${NSBOX_VM_MIRROR:-} && $suite != *-security ]]; then
    echo "$NSBOX_VM_MIRROR"
    return
  fi
  host_apt_sources | awk -v s="$suite" '$2 == s && $1 ~ /^(https?|file):/ { print $1; exit }'
}

# Install the host tools this script and run.sh need, if any is missing.
ensure_host_tools() {
  local -A tools=(
    [debootstrap]=debootstrap [qemu-system-x86_64]=qemu-system-x86 [qemu-img]=qemu-utils
    [mkfs.ext4]=e2fsprogs [cpio]=cpio [xz]=xz-utils [zstd]=zstd [dpkg-deb]=dpkg [flock]=util-linux
  )
  local missing=() tool
  for tool in "${!tools[@]}"; do
    command -v "$tool" >/dev/null || missing+=("${tools[$tool]}")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing host tools: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# chroot_run ROOT COMMAND...: run a command in the tree with /proc, /sys and /dev mounted, in a
# private mount namespace: the mounts vanish with it, so no failure can leave a bind mount of
# /dev under a directory that a later `rm -rf` walks into.
chroot_run() {
  local root=$1
  shift
  # shellcheck disable=SC2016 # (the inner sh expands $1 and $@)
  unshare --mount --propagation private -- /bin/sh -ec '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount --rbind /dev "$root/dev"
    exec chroot "$root" "$@"' sh "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive INITRD=No "$@"
}

# fetch_trixie_kernel ROOT: put trixie's kernel into the tree: /boot/vmlinuz-KVER and
# /boot/config-KVER, modules in /usr/lib/modules/KVER (then depmod). The .deb comes through a
# one-off apt configuration in a temporary directory: the host's sources, lists, pins and
# package state are neither read nor changed.
fetch_trixie_kernel() {
  local root=$1 mirror tmp pkg kver
  mirror=$(mirror_for "$SUITE")
  tmp=$(mktemp -d)
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/deb"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$tmp/sources.list"
  local apt_opts=(
    -o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Dir::State::Status=/dev/null
    -o APT::Architectures::=amd64
  )
  apt-get "${apt_opts[@]}" -q update >"$tmp/apt.log" 2>&1 || {
    cat "$tmp/apt.log" >&2
    die "apt-get update of the trixie suite failed"
  }
  # linux-image-amd64 depends on the versioned package, e.g. linux-image-6.12.57+deb13-amd64.
  pkg=$(apt-cache "${apt_opts[@]}" depends linux-image-amd64 |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
  [[ -n $pkg ]] || die "no trixie kernel package found"
  log "fetching trixie's $pkg"
  (cd "$tmp" && apt-get "${apt_opts[@]}" -q download "$pkg" >>"$tmp/apt.log" 2>&1) || {
    cat "$tmp/apt.log" >&2
    die "cannot download $pkg"
  }
  dpkg-deb -x "$tmp/$pkg"_*.deb "$tmp/deb"
  local moddir=
  for moddir in "$tmp"/deb/usr/lib/modules/* "$tmp"/deb/lib/modules/*; do
    [[ -d $moddir ]] && break
  done
  kver=${moddir##*/}
  [[ -f $tmp/deb/boot/vmlinuz-$kver ]] || die "no vmlinuz in $pkg"
  install -m 0644 "$tmp/deb/boot/vmlinuz-$kver" "$tmp/deb/boot/config-$kver" "$root/boot/"
  mkdir -p "$root/usr/lib/modules"
  rm -rf "$root/usr/lib/modules/$kver"
  cp -a "$moddir" "$root/usr/lib/modules/"
  chroot_run "$root" depmod "$kver"
  echo "$kver" >"$root/boot/nsbox-vm-trixie-kver"
  rm -rf "$tmp"
}

# configure_rootfs ROOT: users, sudo, host name, fstab and unit masks.
configure_rootfs() {
  local root=$1
  # tester: uid 1000 with subordinate ids (rootless sandboxes) and passwordless sudo.
  chroot_run "$root" useradd --create-home --uid 1000 --user-group --shell /bin/bash tester
  for f in subuid subgid; do
    grep -q '^tester:' "$root/etc/$f" 2>/dev/null || echo 'tester:100000:65536' >>"$root/etc/$f"
  done
  echo 'tester ALL=(ALL) NOPASSWD: ALL' >"$root/etc/sudoers.d/tester"
  chmod 0440 "$root/etc/sudoers.d/tester"
  echo nsbox-vm >"$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 nsbox-vm\n::1 localhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
  # The initramfs mounts the root rw; pass 0: no fsck (qemu's snapshot=on throws writes away).
  echo '/dev/vda / ext4 rw,relatime 0 0' >"$root/etc/fstab"
  # systemd makes a machine id at first boot when this file is empty; every boot is a first
  # boot here (snapshot=on), so keep it empty rather than share a fixed one.
  : >"$root/etc/machine-id"
  # debootstrap copied the host's resolv.conf; the guest has no network, so say that instead
  # (with qemu's user-mode network, should one ever be added, 10.0.2.3 is the resolver).
  printf '# The nsbox test VM has no network.\nnameserver 10.0.2.3\n' >"$root/etc/resolv.conf"
  # A volatile journal (in /run): every boot is thrown away, and the flush to /var/log/journal
  # is on systemd's critical path at boot.
  rm -rf "$root/var/log/journal"
}

# build_rootfs ROOT: debootstrap, the packages, trixie's kernel and the configuration.
build_rootfs() {
  local root=$1 mirror updates security packages
  mirror=$(mirror_for "$SUITE")
  [[ -n $mirror ]] || die "no '$SUITE' entry in the host's apt sources (set NSBOX_VM_MIRROR to a Debian mirror URL)"
  updates=$(mirror_for "$SUITE-updates")
  security=$(mirror_for "$SUITE-security")
  mapfile -t packages < <(package_list)

  log "debootstrap --variant=minbase $SUITE (log: $root.debootstrap.log)"
  rm -rf "$root"
  debootstrap --variant=minbase --components=main "$SUITE" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
    tail -n 30 "$root.debootstrap.log" >&2
    die "debootstrap failed"
  }

  # apt in the chroot, from the same mirrors as the host (bookworm-updates and -security too,
  # so that the guest's libraries are the versions the host builds against).
  {
    echo "deb $mirror $SUITE main"
    [[ -z $updates ]] || echo "deb $updates $SUITE-updates main"
    [[ -z $security ]] || echo "deb $security $SUITE-security main"
  } >"$root/etc/apt/sources.list"
  # No daemon may start in the chroot.
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  log "installing ${#packages[@]} packages (log: $root.apt.log)"
  local apt_get=(chroot_run "$root" apt-get -q -y --no-install-recommends -o Dpkg::Options::=--force-unsafe-io)
  {
    "${apt_get[@]}" update && "${apt_get[@]}" upgrade && "${apt_get[@]}" install "${packages[@]}"
  } >"$root.apt.log" 2>&1 || {
    tail -n 30 "$root.apt.log" >&2
    die "apt-get install in the chroot failed"
  }

  fetch_trixie_kernel "$root"
  configure_rootfs "$root"

  # The guest has no network: leave it no mirror to try, and no package lists or .debs (nor
  # debootstrap's log, which names the mirror).
  echo '# The nsbox test VM has no network; tests/vm/image.sh installs its packages.' >"$root/etc/apt/sources.list"
  chroot_run "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root/usr/sbin/policy-rc.d" "$root/var/log/bootstrap.log"
  # No stock initramfs either (INITRD=No above should have skipped it): run.sh boots its own.
  rm -f "$root"/boot/initrd.img-*
}

# build_initrd ROOT KVER OUT: the tiny initramfs of kernel KVER: static busybox, guest/init and
# INITRD_MODULES with their dependencies, decompressed (busybox insmod reads plain .ko only),
# in load order (modules.order).
build_initrd() {
  local root=$1 kver=$2 out=$3 dir mod name
  dir=$(mktemp -d)
  mkdir -p "$dir"/{bin,dev,proc,sys,newroot,lib/modules}
  cp "$root/bin/busybox" "$dir/bin/busybox"
  install -m 0755 "$HERE/guest/init" "$dir/init"
  : >"$dir/modules.order"
  # modprobe (the guest's, in the chroot) resolves dependencies and soft dependencies.
  while read -r mod; do
    name=$(basename "$mod")
    name=${name%.xz}
    name=${name%.zst}
    grep -qxF "$name" "$dir/modules.order" && continue
    case $mod in
      *.xz) xz -dc "$root$mod" >"$dir/lib/modules/$name" ;;
      *.zst) zstd -qdc "$root$mod" >"$dir/lib/modules/$name" ;;
      *) cp "$root$mod" "$dir/lib/modules/$name" ;;
    esac
    echo "$name" >>"$dir/modules.order"
  done < <(chroot "$root" modprobe --all --set-version "$kver" --show-depends "${INITRD_MODULES[@]}" |
    awk '$1 == "insmod" { print $2 }')
  (cd "$dir" && find . | cpio --quiet -o -H newc) >"$out"
  rm -rf "$dir"
}

# extract_vmlinux BZIMAGE OUT: the uncompressed kernel (an ELF file) inside a bzImage. qemu boots
# it through its PVH entry point (Debian's kernels have CONFIG_PVH=y), which skips the real-mode
# set-up and the decompressor: bookworm's kernel is xz-compressed, and unpacking it under TCG
# takes seconds of every boot. The payload's place is in the boot protocol's header:
# setup_sects (0x1f1), payload_offset (0x248) and payload_length (0x24c), whose last 4 bytes
# are the uncompressed size, not compressed data.
extract_vmlinux() {
  local in=$1 out=$2 setup_sects offset length magic
  field() { od -An -tu"$2" -j "$1" -N"$2" "$in" | tr -d ' '; }
  setup_sects=$(field $((0x1f1)) 1)
  offset=$(((setup_sects + 1) * 512 + $(field $((0x248)) 4)))
  length=$(($(field $((0x24c)) 4) - 4))
  magic=$(od -An -tx1 -j "$offset" -N4 "$in" | tr -d ' ')
  local decompress
  case $magic in
    fd377a58) decompress=(xz -dc) ;;
    28b52ffd) decompress=(zstd -qdc) ;;
    1f8b08*) decompress=(gzip -dc) ;;
    *) die "$in: unknown kernel compression (magic $magic)" ;;
  esac
  dd if="$in" iflag=skip_bytes,count_bytes skip="$offset" count="$length" bs=1M status=none |
    "${decompress[@]}" >"$out"
  [[ $(od -An -tx1 -N4 "$out" | tr -d ' ') == 7f454c46 ]] || die "$in: the payload is no ELF file"
}

# build_image ROOT OUT: install the guest scripts, make root.img and one initramfs per kernel.
build_image() {
  local root=$1 out=$2 kver_bookworm kver_trixie size_mb
  install -m 0755 "$HERE/guest/nsbox-vm-init" "$HERE/guest/nsbox-vm-run" "$root/usr/local/sbin/"
  install -m 0644 "$HERE/guest/nsbox-vm-run.service" "$root/etc/systemd/system/"
  mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
  ln -sfn ../nsbox-vm-run.service "$root/etc/systemd/system/multi-user.target.wants/nsbox-vm-run.service"

  kver_trixie=$(cat "$root/boot/nsbox-vm-trixie-kver")
  kver_bookworm=$(for f in "$root"/boot/vmlinuz-*; do echo "${f##*/vmlinuz-}"; done |
    grep -vxF "$kver_trixie" | sort -V | tail -n1)
  [[ -n $kver_bookworm ]] || die "no bookworm kernel in $root/boot"

  # Size: what the tree uses plus 2 GiB of free room (the file is sparse).
  size_mb=$(($(du -sm "$root" | cut -f1) + 2048))
  log "mkfs.ext4 -d: root.img, ${size_mb} MiB (sparse)"
  mkfs.ext4 -q -F -L nsbox-vm -E root_owner=0:0 -d "$root" "$out/root.img" "${size_mb}M" >/dev/null

  local name kver
  for name in bookworm trixie; do
    kver=kver_$name
    kver=${!kver}
    cp "$root/boot/vmlinuz-$kver" "$out/vmlinuz-$name"
    extract_vmlinux "$out/vmlinuz-$name" "$out/vmlinux-$name"
    build_initrd "$root" "$kver" "$out/initrd-$name.img"
    echo "$kver" >"$out/kver-$name"
    log "kernel $name: $kver"
  done
}

# package_of FILE: the host package that owns FILE, under its own name, its resolved name or
# either with /usr dropped (merged /usr: dpkg knows /lib/x86_64-linux-gnu/libc.so.6).
package_of() {
  local path candidates=("$1" "$(readlink -f "$1")")
  candidates+=("${candidates[0]#/usr}" "${candidates[1]#/usr}")
  for path in "${candidates[@]}"; do
    dpkg -S "$path" 2>/dev/null | head -n1 | cut -d: -f1 | grep . && return 0
  done
  return 0
}

# --check-libs: which Debian packages provide the libraries that host-built binaries link, and
# whether the guest has them: installed in the current cached tree if there is one, else in the
# package list.
check_libs() {
  local bins=("$@") lib pkg rootfs
  if ((${#bins[@]} == 0)); then
    mapfile -t bins < <(find "$REPO/build" -maxdepth 3 -type f -perm -u+x ! -path '*/CMakeFiles/*' \
      -exec sh -c 'head -c 4 "$1" | grep -q ELF' sh {} \; -print 2>/dev/null)
  fi
  ((${#bins[@]} > 0)) || die "no binaries to check (build first, or name them)"
  rootfs=$CACHE/rootfs-$(rootfs_key)
  local -A listed=()
  while read -r pkg; do listed[$pkg]=1; done < <(package_list)
  echo "${#bins[@]} binaries; their libraries and the packages behind them:"
  ldd "${bins[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    while read -r lib; do
      pkg=$(package_of "$lib")
      if [[ -z $pkg ]]; then
        echo "  $lib: no Debian package on the host"
      elif [[ -f $rootfs.done ]] &&
        dpkg-query --admindir="$rootfs/var/lib/dpkg" -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
        echo "  $lib: $pkg (installed in the guest)"
      elif [[ -n ${listed[$pkg]:-} ]]; then
        echo "  $lib: $pkg (in the package list)"
      else
        echo "  $lib: $pkg MISSING: add it to GUEST_PACKAGES in $0"
      fi
    done
}

# The cache keys. rootfs: the suite, the package list and the code that builds the tree.
rootfs_key() {
  {
    echo "$SUITE"
    package_list
    declare -f build_rootfs configure_rootfs fetch_trixie_kernel chroot_run
  } | sha256sum | cut -c1-16
}
# image: the rootfs key, this script and the guest files.
image_key() {
  {
    rootfs_key
    cat "${BASH_SOURCE[0]}" "$HERE"/guest/*
  } | sha256sum | cut -c1-16
}

main() {
  case ${1:-} in
    --packages)
      package_list
      return
      ;;
    --check-libs)
      shift
      check_libs "$@"
      return
      ;;
    --rebuild | '') ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
  esac

  local rootfs image
  rootfs=$CACHE/rootfs-$(rootfs_key)
  image=$CACHE/image-$(image_key)

  if [[ ${1:-} != --rebuild && -f $image/done ]]; then
    echo "$image"
    return
  fi
  [[ $(id -u) -eq 0 ]] || die "building the image needs root"
  mkdir -p "$CACHE"
  # One build at a time; whoever waited finds the image done.
  exec {lock}>"$CACHE/lock"
  flock "$lock"
  if [[ ${1:-} == --rebuild ]]; then
    rm -rf "$rootfs" "$image"
  elif [[ -f $image/done ]]; then
    echo "$image"
    return
  fi

  local start=$SECONDS
  ensure_host_tools
  if [[ ! -f $rootfs.done ]]; then
    build_rootfs "$rootfs"
    touch "$rootfs.done"
  fi
  rm -rf "$image" "$image.tmp"
  mkdir -p "$image.tmp"
  build_image "$rootfs" "$image.tmp"
  touch "$image.tmp/done"
  mv "$image.tmp" "$image"
  # The build logs name the mirror: keep them only when something failed.
  rm -f "$rootfs".*.log

  # Drop older builds (a VM still running from one keeps its open files).
  local old
  for old in "$CACHE"/rootfs-* "$CACHE"/image-*; do
    case $old in
      "$rootfs" | "$rootfs".* | "$image") ;;
      *) rm -rf "$old" ;;
    esac
  done
  log "image ready in $((SECONDS - start)) s: $image"
  echo "$image"
}

main "$@"
