#!/usr/bin/env bash
# The loadgen runs behind BENCHMARKS.md's goal rows: a fresh stragglerd per
# run (rate limit off), straggler-loadgen beside it on the same machine, and
# the 1-minute load average and hypervisor steal (jiffies, 8th value of
# /proc/stat's cpu line) around each run, since both move the p99 on a VM.
#
#   cmake -S . -B build-perf -G Ninja -DCMAKE_BUILD_TYPE=Release
#   ninja -C build-perf stragglerd straggler-loadgen
#   bash bench/loadgen_goals.sh [BUILD_DIR]      # default build-perf; ~1.5 minutes
#
# Runs: 3 x 100 k reports/s (1 000 ranks, 4 streams, batch 250, 10 s: the p99
# goal), 3 x as fast as possible (batch 1 000: the throughput goal), 1 x
# 10 000 ranks at 100 k/s (memory per rank). Prints loadgen's result line and
# the daemon's VmRSS per rank for each.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build-perf}
DAEMON=$BUILD/daemon/stragglerd
LOADGEN=$BUILD/tools/straggler-loadgen/straggler-loadgen
for bin in "$DAEMON" "$LOADGEN"; do
  [[ -x "$bin" ]] || { echo "loadgen_goals.sh: $bin not built (see the header)" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'limits:\n  stream_reports_per_second: 0\n' > "$work/no-rate-limit.yaml"

steal() { awk '/^cpu /{print $9}' /proc/stat; }

run() {  # LABEL LOADGEN-ARGS...
  local label=$1; shift
  rm -f "$work/ready.json"
  "$DAEMON" --config "$work/no-rate-limit.yaml" --grpc-address 127.0.0.1:0 \
    --http-address 127.0.0.1:0 --ready-file "$work/ready.json" --log-level warn &
  local pid=$!
  for _ in $(seq 100); do [[ -s "$work/ready.json" ]] && break; sleep 0.1; done
  local s0 l0 s1
  s0=$(steal); l0=$(cut -d' ' -f1 /proc/loadavg)
  "$LOADGEN" --ready-file "$work/ready.json" "$@" > "$work/out.txt" 2>&1
  s1=$(steal)
  echo "== $label (load $l0, steal $((s1 - s0)) jiffies): $*"
  grep -A1 "offered/s" "$work/out.txt" | tail -n 2
  grep "VmRSS" "$work/out.txt" || true
  kill -TERM "$pid"
  wait "$pid" || true
}

for i in 1 2 3; do
  run "p99 at 100k/s, run $i" --ranks 1000 --streams 4 --batch 250 --rate 100000 --duration 10
done
for i in 1 2 3; do
  run "max batched, run $i" --ranks 1000 --streams 4 --batch 1000 --rate 0 --duration 10
done
run "10 000 ranks" --ranks 10000 --streams 8 --batch 1000 --rate 100000 --duration 10
