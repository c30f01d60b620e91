#!/usr/bin/env bash
# Build a minimal Debian root file system with `debootstrap --variant=minbase` and pack it as a
# plain rootfs tarball that `nsbox image import NAME FILE` accepts.
#
#   images/debian/build-image.sh [--suite SUITE] [--mirror URL] [--include PKG,PKG] [--output FILE]
#
# The mirror, unless --mirror is given, is the Debian archive the host's own apt configuration
# uses (/etc/apt/sources.list, sources.list.d/*.list and deb822 sources.list.d/*.sources); no
# host name is hard-coded. See images/debian/README.md.
#
# NSBOX_APT_ETC (default /etc/apt) points the mirror search at another apt configuration
# directory; it exists for testing the parser.
set -euo pipefail

prog=$(basename "$0")
log() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() {
  printf '%s: error: %s\n' "$prog" "$*" >&2
  exit 1
}

usage() {
  cat <<EOF
Usage: $prog [--suite SUITE] [--mirror URL] [--include PKG,PKG] [--output FILE]

Build a minimal Debian image (debootstrap --variant=minbase) as a rootfs tarball for
'nsbox image import'. Must run as root.

  --suite SUITE      Debian suite or code name (default: the host's VERSION_CODENAME)
  --mirror URL       Debian archive to bootstrap from (default: the one the host's apt uses)
  --include PKGS     extra packages, comma separated (passed to debootstrap --include)
  --output FILE      tarball to write (default: ./debian-SUITE.tar.gz)
  -h, --help         this help
EOF
}

orig_args=("$@")
suite=""
mirror=""
include=""
output=""
while (($# > 0)); do
  case $1 in
    --suite) suite=${2:?--suite needs a value}; shift 2 ;;
    --suite=*) suite=${1#*=}; shift ;;
    --mirror) mirror=${2:?--mirror needs a value}; shift 2 ;;
    --mirror=*) mirror=${1#*=}; shift ;;
    --include) include=${2:?--include needs a value}; shift 2 ;;
    --include=*) include=${1#*=}; shift ;;
    --output | -o) output=${2:?--output needs a value}; shift 2 ;;
    --output=*) output=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

if [[ $(id -u) -ne 0 ]]; then
  die "must run as root (debootstrap creates device nodes, chroots and sets file owners): try: sudo $0${orig_args[*]+ ${orig_args[*]}}"
fi
command -v debootstrap >/dev/null || die "debootstrap is not installed: apt-get install debootstrap"

host_codename=""
if [[ -r /etc/os-release ]]; then
  # shellcheck source=/dev/null
  host_codename=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
fi
if [[ -z $suite ]]; then
  [[ -n $host_codename ]] || die "the host's /etc/os-release has no VERSION_CODENAME: pass --suite"
  suite=$host_codename
  log "suite: $suite (the host's VERSION_CODENAME)"
else
  log "suite: $suite (--suite)"
fi
[[ $suite =~ ^[A-Za-z0-9._-]+$ ]] || die "not a suite name: $suite"
[[ -z $include || $include =~ ^[A-Za-z0-9.+:,-]+$ ]] || die "not a package list: $include"

# ---- fetching a URL (only to check that a repository is a Debian archive) -------------------

fetch_tool=""
if command -v curl >/dev/null; then
  fetch_tool=curl
elif command -v wget >/dev/null; then
  fetch_tool=wget
elif command -v python3 >/dev/null; then
  fetch_tool=python3
fi

# fetch URL: print the document on stdout; fail if it cannot be fetched.
fetch() {
  local url=$1
  case $url in
    file:*)
      local path=${url#file:}
      path=/${path##/}
      path=/${path#/localhost/}
      path=/${path##/}
      cat -- "$path" 2>/dev/null
      return
      ;;
  esac
  case $fetch_tool in
    curl) curl -fsL --max-time 30 -- "$url" ;;
    wget) wget -q -T 30 -O - -- "$url" ;;
    python3)
      python3 -c 'import sys, urllib.request
sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=30).read())' "$url" 2>/dev/null
      ;;
    *) return 1 ;;
  esac
}

# release_field DOC FIELD: the value of FIELD in the head of a Release file.
release_field() {
  sed -n "/^$2:/{s/^$2:[[:space:]]*//p;q;}" <<<"$1"
}

# ---- apt's HTTP proxy, if the host has one configured and the environment does not ---------

if [[ -z ${http_proxy:-} ]] && command -v apt-config >/dev/null; then
  apt_proxy=""
  eval "$(apt-config shell apt_proxy Acquire::http::Proxy 2>/dev/null || true)"
  if [[ $apt_proxy == http://* || $apt_proxy == https://* ]]; then
    export http_proxy=$apt_proxy
    log "using apt's Acquire::http::Proxy $apt_proxy for HTTP"
  fi
fi

# ---- the host's apt sources -----------------------------------------------------------------

apt_etc=${NSBOX_APT_ETC:-/etc/apt}

# One-line format: "deb [options] URI SUITE [COMPONENT...]"; prints FILE<TAB>URI<TAB>SUITE.
parse_one_line() {
  awk -v file="$1" '
    { sub(/#.*/, "") }
    $1 == "deb" {
      line = $0
      sub(/^[ \t]*deb[ \t]+/, "", line)
      if (line ~ /^\[/) {
        if (line !~ /\]/) next
        sub(/^\[[^]]*\][ \t]*/, "", line)
      }
      n = split(line, f, /[ \t]+/)
      if (n >= 2 && f[1] != "" && f[2] != "") print file "\t" f[1] "\t" f[2]
    }' "$1"
}

# deb822 format: stanzas of "Field: value" separated by blank lines, "#" comments,
# continuation lines start with white space; prints FILE<TAB>URI<TAB>SUITE per URI x suite.
parse_deb822() {
  awk -v file="$1" '
    function flush(   n, m, i, j, U, S) {
      if ((" " types " ") ~ /[ \t]deb[ \t]/ && tolower(enabled) !~ /^[ \t]*(no|false|0)[ \t]*$/) {
        n = split(uris, U, /[ \t]+/)
        m = split(suites, S, /[ \t]+/)
        for (i = 1; i <= n; i++)
          for (j = 1; j <= m; j++)
            if (U[i] != "" && S[j] != "") print file "\t" U[i] "\t" S[j]
      }
      types = uris = suites = enabled = key = ""
    }
    /^[ \t]*$/ { flush(); next }
    /^#/ { next }
    /^[ \t]/ {
      if (key == "types") types = types " " $0
      else if (key == "uris") uris = uris " " $0
      else if (key == "suites") suites = suites " " $0
      next
    }
    /:/ {
      key = tolower(substr($0, 1, index($0, ":") - 1))
      value = substr($0, index($0, ":") + 1)
      if (key == "types") types = value
      else if (key == "uris") uris = value
      else if (key == "suites") suites = value
      else if (key == "enabled") enabled = value
    }
    END { flush() }' "$1"
}

# Every "deb" entry, in the order apt reads them.
host_entries() {
  local f
  [[ -f $apt_etc/sources.list ]] && parse_one_line "$apt_etc/sources.list"
  for f in "$apt_etc"/sources.list.d/*; do
    [[ -f $f ]] || continue
    case $f in
      *.list) parse_one_line "$f" ;;
      *.sources) parse_deb822 "$f" ;;
    esac
  done
  return 0
}

pick_mirror() {
  local entries=() candidates=() line file uri s rank reason
  mapfile -t entries < <(host_entries)
  ((${#entries[@]} > 0)) || die "no 'deb' entries in $apt_etc/sources.list{,.d/*.list,.d/*.sources}: pass --mirror URL"

  # Candidates: entries for a release suite (not -security, -updates, -backports...) over a
  # transport debootstrap speaks. Rank 0: the suite being built; 1: the host's code name;
  # 2: any other suite (stable, testing...). Order of apt's files kept within a rank.
  for line in "${entries[@]}"; do
    IFS=$'\t' read -r file uri s <<<"$line"
    case $s in
      */ | *-security | */updates | *-updates | *-backports | *-backports-sloppy | *-proposed | \
        *-debug) continue ;;
    esac
    case $uri in
      http://* | https://* | ftp://* | file:/*) ;;
      *) continue ;;
    esac
    uri=${uri%/}
    if [[ $s == "$suite" ]]; then
      rank=0
    elif [[ -n $host_codename && $s == "$host_codename" ]]; then
      rank=1
    else
      rank=2
    fi
    candidates+=("$rank"$'\t'"$file"$'\t'"$uri"$'\t'"$s")
  done
  ((${#candidates[@]} > 0)) ||
    die "no release-suite 'deb' entry over http(s)/ftp/file in the host's apt sources: pass --mirror URL"
  mapfile -t candidates < <(printf '%s\n' "${candidates[@]}" | sort -s -t $'\t' -k1,1n)

  if [[ -z $fetch_tool ]]; then
    IFS=$'\t' read -r rank file uri s <<<"${candidates[0]}"
    mirror=$uri
    log "mirror: $mirror (first 'deb' entry in $file, suite $s; not verified: no curl, wget or python3)"
    return
  fi

  local release origin
  for line in "${candidates[@]}"; do
    IFS=$'\t' read -r rank file uri s <<<"$line"
    if ! release=$(fetch "$uri/dists/$s/Release"); then
      log "skipping $uri $s ($file): no dists/$s/Release"
      continue
    fi
    origin=$(release_field "$release" Origin)
    if [[ $origin != Debian ]]; then
      log "skipping $uri $s ($file): not a Debian archive (Origin: ${origin:-none})"
      continue
    fi
    if [[ $s != "$suite" ]] && ! fetch "$uri/dists/$suite/Release" >/dev/null; then
      log "skipping $uri ($file): a Debian archive, but it has no dists/$suite/Release"
      continue
    fi
    case $rank in
      0) reason="its suite is $suite, the one being built" ;;
      1) reason="its suite is $s, the host's VERSION_CODENAME" ;;
      *) reason="its suite is $s" ;;
    esac
    mirror=$uri
    log "mirror: $mirror (from $file: the first 'deb' entry whose dists/$s/Release says Origin: Debian; $reason)"
    return
  done
  die "none of the host's apt entries is a reachable Debian archive with suite $suite: pass --mirror URL"
}

if [[ -n $mirror ]]; then
  mirror=${mirror%/}
  log "mirror: $mirror (--mirror)"
  if [[ -n $fetch_tool ]] && ! fetch "$mirror/dists/$suite/Release" >/dev/null; then
    die "$mirror/dists/$suite/Release cannot be fetched: is $mirror a Debian archive with suite $suite?"
  fi
else
  pick_mirror
fi

# ---- output and work directories --------------------------------------------------------------

[[ -n $output ]] || output=$PWD/debian-$suite.tar.gz
[[ $output == /* ]] || output=$PWD/$output
outdir=$(dirname -- "$output")
[[ -d $outdir ]] || die "the output's directory $outdir does not exist"
[[ ! -d $output ]] || die "the output $output is a directory"

rootfs=""
partial=""
# Unmount whatever debootstrap left mounted under DIR (proc, sys, bind-mounted /dev nodes),
# deepest first. Fails if something stays mounted.
umount_under() {
  local dir=$1 mnts m
  dir=$(realpath -- "$dir")
  # /proc/self/mounts escapes blanks as \040; the work directory has none (mktemp names).
  mapfile -t mnts < <(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r)
  for m in "${mnts[@]}"; do
    umount -- "$m" 2>/dev/null || umount -l -- "$m" 2>/dev/null || true
  done
  ! awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mounts
}
# group_alive PGID: whether a live (not zombie) process is left in the process group.
group_alive() {
  ps -e -o pgid=,stat= | awk -v pg="$1" '$1 == pg && $2 !~ /^Z/ { f = 1 } END { exit !f }'
}
# stop_group PGID: end debootstrap's process group (dpkg, maintainer scripts included).
stop_group() {
  local pg=$1 i
  kill -TERM -- "-$pg" 2>/dev/null || return 0
  for ((i = 0; i < 30; i++)); do
    group_alive "$pg" || break
    sleep 0.1
  done
  kill -KILL -- "-$pg" 2>/dev/null || true
  wait "$pg" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    group_alive "$pg" || break
    sleep 0.1
  done
}
bootstrap_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n $bootstrap_pid ]]; then
    log "stopping debootstrap"
    stop_group "$bootstrap_pid"
  fi
  if [[ -n $rootfs && -d $rootfs ]]; then
    if umount_under "$rootfs"; then
      rm -rf --one-file-system -- "$rootfs"
    else
      log "something is still mounted under $rootfs: not removing it"
    fi
  fi
  [[ -z $partial ]] || rm -f -- "$partial"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Same file system as the output, so that nothing big crosses a device; a hidden name.
rootfs=$(mktemp -d -- "$outdir/.debian-$suite.rootfs.XXXXXX")
chmod 755 "$rootfs"

# ---- debootstrap ---------------------------------------------------------------------------------

start=$SECONDS
args=(--variant=minbase)
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [[ -f $keyring ]]; then
  args+=("--keyring=$keyring")
else
  log "no $keyring on the host: debootstrap checks signatures with its own default"
fi
[[ -z $include ]] || args+=("--include=$include")

log "debootstrap ${args[*]} $suite $rootfs $mirror"
# In its own session and process group: dpkg (and so debootstrap) carries on past a Ctrl-C,
# so the terminal's SIGINT comes to this script alone, whose trap ends the whole group.
setsid debootstrap "${args[@]}" "$suite" "$rootfs" "$mirror" </dev/null &
bootstrap_pid=$!
if ! wait "$bootstrap_pid"; then
  bootstrap_pid=""
  if [[ -f $rootfs/debootstrap/debootstrap.log ]]; then
    log "debootstrap failed; the end of its log:"
    tail -n 20 "$rootfs/debootstrap/debootstrap.log" >&2
  fi
  if [[ $(findmnt -n -o OPTIONS -T "$outdir" 2>/dev/null) =~ (^|,)(noexec|nodev)(,|$) ]]; then
    log "note: $outdir is on a noexec or nodev file system; write the output elsewhere"
  fi
  die "debootstrap failed"
fi
bootstrap_pid=""
umount_under "$rootfs" || die "debootstrap left mounts under $rootfs"
log "debootstrap done in $((SECONDS - start)) s"

# ---- tidy it for a sandbox --------------------------------------------------------------------

for f in usr/bin/apt-get usr/bin/dpkg bin/bash; do
  [[ -e $rootfs/$f ]] || die "the built rootfs has no /$f"
done
# Package caches and indexes: apt-get update inside a sandbox with network fetches them again
# from the mirror in /etc/apt/sources.list, which debootstrap wrote and which stays.
find "$rootfs/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -delete
rm -f "$rootfs"/var/cache/apt/*.bin
find "$rootfs/var/lib/apt/lists" -mindepth 1 -maxdepth 1 ! -name partial ! -name lock -exec rm -rf -- {} +
# Host copies debootstrap made: nsbox sets the hostname and the sandbox's resolver itself.
rm -f "$rootfs/etc/resolv.conf" "$rootfs/etc/hostname"
# A snapshot archive's Release files are past their Valid-Until: let apt in the image accept them.
if [[ $mirror == *snapshot.debian.org* ]]; then
  printf 'Acquire::Check-Valid-Until "false";\n' >"$rootfs/etc/apt/apt.conf.d/99nsbox-snapshot"
fi
log "sources.list in the image: $(grep -v '^#' "$rootfs/etc/apt/sources.list" | head -n 1)"

# ---- pack -------------------------------------------------------------------------------------------

compress=gzip
command -v pigz >/dev/null && compress=pigz
partial=$(mktemp -- "$outdir/.$(basename -- "$output").XXXXXX")
log "packing with tar and $compress"
# Device nodes under /dev are left out (nsbox gives every sandbox its own /dev); the directory
# itself stays. Owners are numeric so that the importer needs no passwd lookups.
tar --numeric-owner --xattrs --xattrs-include='*' --one-file-system \
  --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
  -C "$rootfs" -cf - . | "$compress" -6 >"$partial"
chmod 644 "$partial"
mv -f -- "$partial" "$output"
partial=""

size=$(stat -c %s -- "$output")
log "wrote $output: $(numfmt --to=iec --suffix=B "$size") ($size bytes) in $((SECONDS - start)) s"
log "import it with: nsbox image import debian $output"
