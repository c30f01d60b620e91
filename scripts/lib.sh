# Shared by the scripts: install what is missing, configure and build. Sourced, not run.
set -euo pipefail

NSBOX_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Debian 12 packages the build, the tests and the benchmarks need.
NSBOX_PACKAGES=(
  g++ cmake ninja-build pkg-config
  libseccomp-dev libcap-dev liburing-dev
  libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libboost1.81-dev
  libldns-dev libnftables-dev libmnl-dev
  libarchive-dev nettle-dev zlib1g-dev libzstd-dev liblzma-dev libbz2-dev liblz4-dev libacl1-dev
  clang-format
  busybox-static debootstrap tmux perl curl
  python3 # the documents' links and examples (tests/tools/check_links.py, run_docs.py); bench/
  nftables iproute2
  e2fsprogs # mkfs.ext4, for a sandbox's own disk (limits.diskBytes)
  dpkg-dev # dpkg-shlibdeps: the Debian package's dependencies (cpack -G DEB, README)
  bubblewrap # the peer nsbox-api-bench compares with
)

# Each line says how long the script has run, so that a CI log shows where its time went.
log() { printf '\033[1m==> [%dm%02ds] %s\033[0m\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

install_packages() {
  local missing=() pkg status
  local -A installed=()
  # One dpkg-query for them all: a process per package costs seconds on a slow machine.
  while read -r pkg status; do
    [[ $status == "install ok installed" ]] && installed[${pkg%%:*}]=1
  done < <(dpkg-query -W -f='${Package} ${Status}\n' "${NSBOX_PACKAGES[@]}" "$@" 2>/dev/null || true)
  for pkg in "${NSBOX_PACKAGES[@]}" "$@"; do
    [[ -n ${installed[$pkg]:-} ]] || missing+=("$pkg")
  done
  # The TypeScript client's tests need Node.js >= 20 and npm (scripts/test sets NSBOX_WANT_NODE;
  # the daemon does not need them); the machine's own are used when present (Debian 12's nodejs
  # is 18, too old, so it is only a last resort).
  if [[ ${NSBOX_WANT_NODE:-0} == 1 ]] && { ! command -v node >/dev/null || ! command -v npm >/dev/null; }; then
    for pkg in nodejs npm; do
      dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$pkg")
    done
  fi
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "nsbox: these Debian packages are missing: ${missing[*]}" >&2
    echo "nsbox: run this script as root (sudo) so that it can install them" >&2
    exit 1
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# build DIR [cmake options...]: configure (once) and build everything (or only the targets
# named in $NSBOX_TARGETS, a regular expression over target names).
build() {
  local dir=$1
  shift
  if [[ ! -f "$NSBOX_ROOT/$dir/build.ninja" ]]; then
    log "configuring $dir"
    cmake -S "$NSBOX_ROOT" -B "$NSBOX_ROOT/$dir" -G Ninja "$@"
  fi
  log "building $dir"
  if [[ -n "${NSBOX_TARGETS:-}" ]]; then
    local targets
    targets=$(ninja -C "$NSBOX_ROOT/$dir" -t targets all | sed -n 's/^\([A-Za-z0-9_-]*\): phony$/\1/p' |
      { grep -E "^(${NSBOX_TARGETS})$" || true; } | sort -u)
    if [[ -z $targets ]]; then
      echo "nsbox: no target of $dir matches '$NSBOX_TARGETS'" >&2
      return 1
    fi
    # shellcheck disable=SC2086
    cmake --build "$NSBOX_ROOT/$dir" --target $targets
  else
    cmake --build "$NSBOX_ROOT/$dir"
  fi
}
