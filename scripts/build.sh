#!/usr/bin/env bash
# Configures (Ninja, RelWithDebInfo, ccache) and builds every target into ./build.
#
#   bash scripts/build.sh [extra cmake -D options...]
#
# Environment: BUILD_DIR (default: build), BUILD_TYPE (default: RelWithDebInfo),
# CCACHE_DIR (default: .cache/ccache under the repository), JOBS (default: nproc).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo}
JOBS=${JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$ROOT/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
mkdir -p "$CCACHE_DIR" "$BUILD_DIR"

log() { printf 'build.sh: %s\n' "$*"; }

for tool in cmake ninja; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    log "ERROR: $tool not found; run scripts/install-deps.sh first" >&2
    exit 1
  fi
done

# A build directory configured with another generator or from another source
# tree cannot be reconfigured in place: drop its cache (objects are kept by ccache).
cache="$BUILD_DIR/CMakeCache.txt"
if [[ -f "$cache" ]]; then
  gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache")
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
  if [[ "$gen" != "Ninja" || "$home" != "$ROOT" ]]; then
    log "discarding stale CMake cache in $BUILD_DIR (generator '$gen', source '$home')"
    rm -rf "$cache" "$BUILD_DIR/CMakeFiles"
  fi
fi

configure_log="$BUILD_DIR/configure.log"
log "configuring $BUILD_DIR ($BUILD_TYPE, Ninja, CCACHE_DIR=$CCACHE_DIR)"
set +e
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "$@" 2>&1 | tee "$configure_log"
rc=${PIPESTATUS[0]}
set -e
if [[ $rc -ne 0 ]]; then
  log "ERROR: CMake configure failed (exit $rc); full output in $configure_log" >&2
  exit "$rc"
fi

echo "---- configure summary ----"
grep -E '^-- stragglerd:' "$configure_log" || echo "(no stragglerd: summary lines)"
echo "---------------------------"

build_log="$BUILD_DIR/build.log"
log "building all targets with -j$JOBS"
set +e
cmake --build "$BUILD_DIR" -j "$JOBS" 2>&1 | tee "$build_log"
rc=${PIPESTATUS[0]}
set -e
if [[ $rc -ne 0 ]]; then
  {
    echo "---- build FAILED (exit $rc); failed steps ----"
    grep -E '^FAILED: ' "$build_log" | sed 's/^FAILED: /  /' | head -n 30
    echo "---- first errors ----"
    grep -E '(error|Error)[: ]' "$build_log" | grep -v '^FAILED: ' | head -n 30
    echo "---- full output in $build_log ----"
  } >&2
  log "ERROR: build failed" >&2
  exit "$rc"
fi
if command -v ccache >/dev/null 2>&1; then
  ccache --show-stats 2>/dev/null | grep -E '^(Cacheable calls|  Hits|Hits)' | head -n 2 || true
fi
log "build OK ($BUILD_DIR)"
