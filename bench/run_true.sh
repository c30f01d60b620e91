#!/usr/bin/env bash
# `nsbox run true` against `bwrap --unshare-all ... true` with the same binds, side by side in one
# hyperfine run (issue 2's benchmark). Run as root from the repository after scripts/start or
# scripts/test has built build/runtime/nsbox:
#
#   sudo bench/run_true.sh [RUNS]
#
# Prints a Markdown table of medians (and the ratio) for docs/perf-notes.md.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
install_packages bubblewrap hyperfine jq
runs=${1:-100}
nsbox="$NSBOX_ROOT/build/runtime/nsbox"
[[ -x "$nsbox" ]] || build build -DCMAKE_BUILD_TYPE=RelWithDebInfo

work=$(mktemp -d /var/tmp/nsbox-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
ws="$work/workspace"
mkdir -p "$ws"
# Root inside is this host uid (see nsbox run --dry-run); the workspace must be its own.
base=$("$nsbox" run --workspace "$ws" --dry-run -- true | awk '/^uid_map:/ {print $3}')
chown "$base:$base" "$ws"

# bwrap with the same layout: host /usr read-only and the merged-/usr symlinks, /proc, /dev,
# tmpfs /tmp and /root, the workspace read-write, every namespace, loopback only.
bwrap_cmd="bwrap --unshare-all --die-with-parent --new-session \
  --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/sbin /sbin \
  --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
  --proc /proc --dev /dev --tmpfs /tmp --tmpfs /root --bind $ws /workspace \
  --chdir /workspace true"
nsbox_cmd="$nsbox run --workspace $ws -- true"

hyperfine -N --warmup 10 --runs "$runs" --export-json "$work/result.json" \
  -n "nsbox run true" "$nsbox_cmd" \
  -n "bwrap --unshare-all true" "$bwrap_cmd" \
  -n "/usr/bin/true (no sandbox)" "/usr/bin/true" >&2

echo
echo "| command | median ms | mean ms | min ms | max ms | runs |"
echo "|---|---|---|---|---|---|"
jq -r '.results[] | "| `\(.command)` | \(.median*1000*100|round/100) | \(.mean*1000*100|round/100) | \(.min*1000*100|round/100) | \(.max*1000*100|round/100) | \(.times|length) |"' "$work/result.json"
jq -r '"\nbwrap / nsbox (medians): \((.results[1].median / .results[0].median)*100|round/100)x"' "$work/result.json"
echo "machine: $(nproc) CPUs, $(uname -r), $(date -u +%Y-%m-%d)"
