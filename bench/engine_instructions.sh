#!/usr/bin/env bash
# Instructions per report of the engine, peer against dynamic, counted by
# callgrind: load-independent (the same count on a busy or a quiet machine),
# unlike engine_bench's nanoseconds, which issue 29's goals are stated in.
# Cases: 1 000 ranks healthy (BM_EngineIngest/x/1000) and 8 000 ranks with
# every row planned (BM_EngineRowPlanned, pure data parallelism).
#
#   ninja -C build engine_instructions
#   bash bench/engine_instructions.sh [BUILD_DIR] [MAX_RATIO]   # default build; ~20 s
#
# With MAX_RATIO (the ctest bench:engine_instructions), exits 1 when peer's
# count is above MAX_RATIO x dynamic's in either case: the counts are exact,
# so the ratio is stable enough to assert, as a guard against a regression.
# Exits 77 (skipped) without valgrind.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${1:-build}
MAX_RATIO=${2:-}
BIN=$BUILD/bench/micro/engine_instructions
[[ -x "$BIN" ]] || { echo "engine_instructions.sh: $BIN not built (ninja -C $BUILD engine_instructions)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "engine_instructions.sh: valgrind not found (apt-get install valgrind): skipped" >&2; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# count POLICY RANKS ROWS [--planned] -> instructions per report
count() {
  local out=$work/cg.$1.$2${4:-}
  valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*Measure*' \
    --callgrind-out-file="$out" "$BIN" --policy "$1" --ranks "$2" --rows "$3" ${4:-} >/dev/null 2>"$out.log" ||
    { cat "$out.log" >&2; exit 1; }
  local total
  total=$(sed -n 's/^summary: //p' "$out")
  [[ "${total:-0}" -gt 0 ]] || { echo "engine_instructions.sh: callgrind counted nothing in Measure ($out)" >&2; exit 1; }
  awk -v t="$total" -v n=$(( $2 * $3 )) 'BEGIN { printf "%.0f", t / n }'
}

printf '| case | peer | dynamic | peer / dynamic |\n|---|---|---|---|\n'
over=0
for c in "1000 200" "8000 20 --planned"; do
  set -- $c
  p=$(count peer "$1" "$2" ${3:-}); d=$(count dynamic "$1" "$2" ${3:-})
  ratio=$(awk -v a="$p" -v b="$d" 'BEGIN { printf "%.2f", a / b }')
  printf '| %s ranks%s | %s | %s | %s |\n' "$1" "${3:+, every row planned}" "$p" "$d" "$ratio"
  if [[ -n "$MAX_RATIO" ]] && awk -v r="$ratio" -v m="$MAX_RATIO" 'BEGIN { exit !(r > m) }'; then
    echo "engine_instructions.sh: peer / dynamic $ratio is above $MAX_RATIO ($1 ranks${3:+, planned})" >&2
    over=1
  fi
done
exit "$over"
