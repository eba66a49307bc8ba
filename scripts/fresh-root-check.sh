#!/usr/bin/env bash
# README's promise checked from a clean root (issue 35): `.ci/run` on a fresh
# Debian 12 that has no CUDA toolkit, so the no-CUDA build and its tests run
# even on a machine that has /usr/local/cuda.
#
#   bash scripts/fresh-root-check.sh [--root DIR] [--mirror URL] [-- COMMAND...]
#
# As root. DIR (default /var/tmp/straggler-fresh-root) gets `debootstrap
# bookworm` when it holds no Debian yet, and is reused after that (delete it
# for a really fresh root). The checkout's files (tracked and untracked, not
# ignored ones: no build/) are copied to DIR/src; /proc, /sys, /dev and
# /dev/pts are bound; COMMAND (default .ci/run: install-deps, build, ctest)
# runs in /src under chroot with a clean environment, niced. The binds are
# undone on exit, whatever happened. Needs debootstrap (apt-get install
# debootstrap) and the mirror. The issue's run took ~10 min of debootstrap and
# packages, the build, then 1641 s of ctest on 2 cores.
# Exit status: COMMAND's; 2 for bad arguments or a root that has CUDA.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=/var/tmp/straggler-fresh-root
MIRROR=http://deb.debian.org/debian
while [[ $# -gt 0 ]]; do
  case "$1" in
    --root) ROOT=$2; shift 2 ;;
    --mirror) MIRROR=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "fresh-root-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
CMD=("$@")
[[ ${#CMD[@]} -gt 0 ]] || CMD=(bash .ci/run)
say() { printf 'fresh-root-check.sh: %s\n' "$*"; }

[[ $EUID -eq 0 ]] || { say "run as root (debootstrap, mount, chroot)" >&2; exit 2; }
if [[ ! -f $ROOT/etc/debian_version ]]; then
  command -v debootstrap >/dev/null || { say "debootstrap not found: apt-get install debootstrap" >&2; exit 2; }
  say "debootstrap bookworm into $ROOT from $MIRROR"
  mkdir -p "$ROOT"
  nice -n 19 debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR"
fi
if [[ -e $ROOT/usr/local/cuda ]] || compgen -G "$ROOT/usr/local/cuda-*" >/dev/null; then
  say "$ROOT has a CUDA toolkit under /usr/local: not the root this check is for" >&2
  exit 2
fi

BOUND=()
unbind() {  # the reverse order of binding; each one only if still mounted
  local i
  for ((i = ${#BOUND[@]} - 1; i >= 0; i--)); do
    mountpoint -q "${BOUND[i]}" && umount "${BOUND[i]}" || true
  done
}
trap unbind EXIT
bind() {  # bind SOURCE TARGET-UNDER-ROOT
  mkdir -p "$ROOT/$2"
  mount --bind "$1" "$ROOT/$2"
  BOUND+=("$ROOT/$2")
}
mountpoint -q "$ROOT/proc" && { say "$ROOT/proc is already mounted (another run?)" >&2; exit 2; }
mkdir -p "$ROOT/proc"
mount -t proc proc "$ROOT/proc"
BOUND+=("$ROOT/proc")
bind /sys sys
bind /dev dev
bind /dev/pts dev/pts
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# The host's own name must resolve, as Debian's installer makes it (127.0.1.1
# in /etc/hosts; debootstrap writes no such line): torchrun's c10d rendezvous
# looks it up (integration:job_id_missing_run_id hung 180 s on "gai error -2"
# in the first run of this check, 2026-11-29). The chroot shares this host's
# name.
if ! grep -qsw -- "$(hostname)" "$ROOT/etc/hosts"; then
  grep -qs localhost "$ROOT/etc/hosts" || printf '127.0.0.1\tlocalhost\n' >> "$ROOT/etc/hosts"
  printf '127.0.1.1\t%s\n' "$(hostname)" >> "$ROOT/etc/hosts"
fi

rm -rf "$ROOT/src"
mkdir -p "$ROOT/src"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
   tar --null -T - --ignore-failed-read -cf - ) | tar -xf - -C "$ROOT/src"
say "$(git -C "$REPO" rev-parse --short HEAD) copied to $ROOT/src; running '${CMD[*]}' there"

start=$(date +%s)
set +e
chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  nice -n 19 bash -c 'cd /src && "$@"' bash "${CMD[@]}"
rc=$?
set -e
say "'${CMD[*]}' exited $rc after $(( $(date +%s) - start )) s in $ROOT"
exit $rc
