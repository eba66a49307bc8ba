#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into their own build
# directory (ASan + UBSan) and runs each over its corpus, fuzz/corpus/<target>/.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
#
# SECONDS per target (default 10; ctest's fuzz:smoke runs 10); TARGETs
# default to all: fuzz_ingest fuzz_config fuzz_rest fuzz_policy. Inputs the run finds
# go to a scratch corpus in the build directory, not into the repository,
# unless FUZZ_MERGE=1: then those that add coverage are merged into
# fuzz/corpus/<target>/ (commit them). A crash, leak, sanitizer finding or
# timeout fails the run; the input is kept as FUZZ_BUILD_DIR/artifacts/... and
# the command to replay it is printed.
#
# Environment: FUZZ_BUILD_DIR (default: build-fuzz), FUZZ_CXX / FUZZ_CC (default:
# clang++-14 / clang-14, else clang++ / clang), JOBS (default: nproc),
# CCACHE_DIR (default: .cache/ccache), FUZZ_MERGE=1 (see above).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SECONDS_PER_TARGET=${1:-10}
shift || true
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(fuzz_ingest fuzz_config fuzz_rest fuzz_policy)
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$ROOT/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}

log() { printf 'fuzz.sh: %s\n' "$*"; }

if [[ ! "$SECONDS_PER_TARGET" =~ ^[0-9]+$ || "$SECONDS_PER_TARGET" -eq 0 ]]; then
  log "ERROR: SECONDS must be a positive integer, not '$SECONDS_PER_TARGET'" >&2
  exit 2
fi
pick() { for c in "$@"; do command -v "$c" >/dev/null 2>&1 && { echo "$c"; return; }; done; }
CXX_BIN=${FUZZ_CXX:-$(pick clang++-14 clang++)}
CC_BIN=${FUZZ_CC:-$(pick clang-14 clang)}
if [[ -z "$CXX_BIN" || -z "$CC_BIN" ]]; then
  log "ERROR: clang not found; run scripts/install-deps.sh (clang-14, libclang-rt-14-dev)" >&2
  exit 1
fi

log "configuring $BUILD ($CXX_BIN, STRAGGLER_FUZZ=ON)"
mkdir -p "$BUILD"
# -O1 and line tables only: quicker to build than RelWithDebInfo and enough
# for sanitizer stack traces; no NDEBUG, so asserts fire too.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DSTRAGGLER_FUZZ=ON -DSTRAGGLER_BUILD_TESTS=OFF -DSTRAGGLER_ENABLE_CUDA=OFF \
  >"$BUILD/configure.log" 2>&1 || {
    cat "$BUILD/configure.log" >&2
    log "ERROR: configure failed" >&2
    exit 1
  }
grep -E "^-- stragglerd: STRAGGLER_FUZZ" "$BUILD/configure.log" || true
log "building ${TARGETS[*]} with -j$JOBS"
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"

mkdir -p "$BUILD/artifacts"
failed=()
for t in "${TARGETS[@]}"; do
  seeds="$ROOT/fuzz/corpus/$t"
  scratch="$BUILD/corpus/$t"
  mkdir -p "$scratch"
  log "$t: ${SECONDS_PER_TARGET}s over $(ls "$seeds" | wc -l) seeds (fuzz/corpus/$t) + $(ls "$scratch" | wc -l) found earlier"
  # -timeout: one input taking longer is a finding (a hang); -rss_limit_mb
  # likewise for memory. New inputs go to the scratch corpus (first dir).
  if ! "$BUILD/fuzz/$t" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$BUILD/artifacts/$t-" -print_final_stats=1 \
        "$scratch" "$seeds" >"$BUILD/$t.log" 2>&1; then
    tail -n 60 "$BUILD/$t.log" >&2
    log "FAILED: $t; replay with: $BUILD/fuzz/$t $BUILD/artifacts/$t-<file> (full log $BUILD/$t.log)" >&2
    failed+=("$t")
    continue
  fi
  grep -E '^stat::number_of_executed_units|^Done ' "$BUILD/$t.log" | tr '\n' ' ' | sed "s/^/fuzz.sh: $t: /"
  echo
  if [[ "${FUZZ_MERGE:-0}" == "1" ]]; then
    "$BUILD/fuzz/$t" -merge=1 "$seeds" "$scratch" >>"$BUILD/$t.log" 2>&1
    log "$t: merged into fuzz/corpus/$t ($(ls "$seeds" | wc -l) files)"
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  log "FAILED: ${failed[*]}" >&2
  exit 1
fi
log "all targets ran ${SECONDS_PER_TARGET}s without a finding: ${TARGETS[*]}"
