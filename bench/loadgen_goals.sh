#!/usr/bin/env bash
# The loadgen runs behind BENCHMARKS.md's goal rows (issues 6 and 29): a fresh
# server per run, straggler-loadgen beside it on the same machine, the
# 1-minute load average and hypervisor steal (jiffies, 8th value of
# /proc/stat's cpu line) around each run, since both move the p99 on a VM.
# Three servers, in the same run of the script:
#   bare  bench/ingest_limit/bare_ingest: the gRPC stream and parse alone,
#         the limit every ingest figure is compared with;
#   dyn   stragglerd with policy.kind: dynamic;
#   peer  stragglerd with its defaults (policy peer).
# stragglerd runs with limits {stream_reports_per_second: 0,
# max_ranks_per_job: 1048576}.
#
#   cmake -S . -B build-perf -G Ninja -DCMAKE_BUILD_TYPE=Release   # or scripts/build.sh
#   ninja -C build-perf stragglerd straggler-loadgen bare_ingest
#   bash bench/loadgen_goals.sh [BUILD_DIR] [RUNS]   # default build-perf, 3; ~6 minutes
#
# Each case runs RUNS times, the servers interleaved; the summary prints the
# median of each figure and the ratios the goals are stated in (peer / dyn,
# peer / bare). Cases: 10k@1M (10 000 ranks at 1 M reports/s), 100k (1 000
# ranks at 100 k/s: the p99 goal of issue 6), max (batched, as fast as
# possible), 65k@1M and 1M@1M (65 536 and 1 048 576 ranks at 1 M/s). SMOKE=1 runs each case once for 2 s at a smaller size (the
# ctest bench:loadgen_scale_smoke): the figures then only show a regression.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build-perf}
RUNS=${2:-3}
SMOKE=${SMOKE:-0}
DAEMON=$BUILD/daemon/stragglerd
LOADGEN=$BUILD/tools/straggler-loadgen/straggler-loadgen
BARE=$BUILD/bench/ingest_limit/bare_ingest
for bin in "$DAEMON" "$LOADGEN" "$BARE"; do
  [[ -x "$bin" ]] || { echo "loadgen_goals.sh: $bin not built (see the header)" >&2; exit 2; }
done
work=$(mktemp -d)
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
limits='limits:\n  stream_reports_per_second: 0\n  max_ranks_per_job: 1048576\n'
printf "$limits" > "$work/peer.yaml"
printf "${limits}policy:\n  kind: dynamic\n" > "$work/dyn.yaml"
results=$work/results.txt
: > "$results"

steal() { awk '/^cpu /{print $9}' /proc/stat; }

start_server() {  # KIND
  rm -f "$work/ready.json"
  if [[ $1 == bare ]]; then
    "$BARE" --ready-file "$work/ready.json" > /dev/null &
  else
    "$DAEMON" --config "$work/$1.yaml" --grpc-address 127.0.0.1:0 \
      --http-address 127.0.0.1:0 --ready-file "$work/ready.json" --log-level error &
  fi
  server_pid=$!
  for _ in $(seq 100); do [[ -s "$work/ready.json" ]] && break; sleep 0.1; done
}

stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=
}

run() {  # CASE KIND LOADGEN-ARGS...
  local case=$1 kind=$2; shift 2
  start_server "$kind"
  local s0 l0 s1 rc=0
  s0=$(steal); l0=$(cut -d' ' -f1 /proc/loadavg)
  "$LOADGEN" --ready-file "$work/ready.json" "$@" > "$work/out.txt" 2>&1 || rc=$?
  s1=$(steal)
  stop_server
  # The result row follows loadgen's header (accepted/s, p50, p99 in columns 2, 5, 6).
  local row bpr
  row=$(awk '/offered\/s/{getline; print $2, $5, $6; exit}' "$work/out.txt")
  bpr=$(sed -n 's/.*: \([0-9]*\) bytes per rank.*/\1/p' "$work/out.txt" | head -n 1)
  [[ -n "$row" ]] || row="- - -"
  echo "$case $kind $row ${bpr:--} $l0 $((s1 - s0)) $rc" >> "$results"
  printf '%-8s %-5s accepted/s %-10s p50 %-8s p99 %-8s B/rank %-6s (load %s, steal %s, exit %s)\n' \
    "$case" "$kind" $row "${bpr:--}" "$l0" "$((s1 - s0))" "$rc"
}

if [[ $SMOKE == 1 ]]; then
  D=2; R10=2000; R65=8192; R1M=65536
else
  D=6; R10=10000; R65=65536; R1M=1048576
fi
for i in $(seq "$RUNS"); do
  for kind in dyn peer; do
    run 10k@1M "$kind" --ranks $R10 --streams 8 --batch 1000 --rate 1000000 --duration $D
  done
  run 100k peer --ranks 1000 --streams 4 --batch 250 --rate 100000 --duration $D
  for kind in bare dyn peer; do
    run max "$kind" --ranks 1000 --streams 4 --batch 1000 --rate 0 --duration $((D > 4 ? 4 : D))
  done
  run 65k@1M peer --ranks $R65 --streams 16 --batch 4096 --rate 1000000 --duration $D
  for kind in dyn peer; do
    run 1M@1M "$kind" --ranks $R1M --streams 16 --batch 4096 --rate 1000000 --duration $((D + 2))
  done
done

echo "== medians of $RUNS run(s) (accepted/s, p50 ms, p99 ms, bytes per rank)"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    case, kind, acc, p50, p99, bpr = line.split()[:6]
    rows.setdefault((case, kind), []).append((acc, p50, p99, bpr))
def med(vals):
    nums = [float(v) for v in vals if v != '-']
    return statistics.median(nums) if nums else None
m = {}
for (case, kind), vals in rows.items():
    cols = list(zip(*vals))
    m[(case, kind)] = [med(c) for c in cols]
    acc, p50, p99, bpr = m[(case, kind)]
    f = lambda v, fmt: '-' if v is None else fmt % v
    print(f"{case:8} {kind:5} {f(acc, '%.0f'):>10}/s  p50 {f(p50, '%.3f'):>8}  p99 {f(p99, '%.3f'):>8}"
          f"  {f(bpr, '%.0f'):>6} B/rank")
def ratio(a, b, i, what):
    if a in m and b in m and m[a][i] and m[b][i]:
        print(f"{what}: {m[a][i] / m[b][i]:.2f}")
ratio(('max', 'peer'), ('max', 'dyn'), 0, "max throughput, peer / dynamic (goal >= 0.9)")
ratio(('max', 'peer'), ('max', 'bare'), 0, "max throughput, peer / bare limit (goal >= 0.35)")
ratio(('max', 'dyn'), ('max', 'bare'), 0, "max throughput, dynamic / bare limit")
ratio(('10k@1M', 'peer'), ('10k@1M', 'dyn'), 2, "10k ranks at 1 M/s, p99 peer / dynamic (goal <= 1.5)")
ratio(('1M@1M', 'peer'), ('1M@1M', 'dyn'), 3, "1M ranks, bytes per rank peer / dynamic")
failed = [l.split()[:2] for l in open(sys.argv[1]) if l.split()[8] != '0']
if failed:
    sys.exit(f"loadgen failed in: {failed}")
# On a quiet machine bare is 2-4x the daemon; a loaded one can starve the bare run more than
# the daemon's in the next seconds (the fresh-root CI run at load 8: bare 2.2, dynamic 3.8
# M/s). Only a daemon well past bare says a tool is broken.
if m[('max', 'bare')][0] * 2 <= max(m[('max', 'dyn')][0], m[('max', 'peer')][0]):
    sys.exit("the daemon outran the bare limit twice over: bare_ingest or loadgen is broken")
PY
