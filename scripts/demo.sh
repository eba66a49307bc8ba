#!/usr/bin/env bash
# The main job: installs the dependencies, builds, starts stragglerd on
# loopback, runs straggler-sim (8 ranks, rank 3 slowed 3x from iteration 50 to
# 350) against it so detection, exclusion and recovery print as they happen,
# then lists the job's events with stragglerctl and stops the daemon with
# SIGTERM. Everything runs on the daemon's built-in defaults (no config file).
#
# Environment: SKIP_DEPS=1 skips install-deps.sh, SKIP_BUILD=1 skips the build;
# BUILD_DIR (default: build); DEMO_JOB (default: demo); READY_TIMEOUT seconds
# (default: 30); DEMO_LOG_LEVEL (passed to stragglerd --log-level when set).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
export BUILD_DIR
JOB=${DEMO_JOB:-demo}
READY_TIMEOUT=${READY_TIMEOUT:-30}

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'demo.sh: ERROR: %s\n' "$*" >&2; exit 1; }

if [[ "${SKIP_DEPS:-0}" != "1" ]]; then
  bash scripts/install-deps.sh
fi
if [[ "${SKIP_BUILD:-0}" != "1" ]]; then
  bash scripts/build.sh
fi

DAEMON=$BUILD_DIR/daemon/stragglerd
SIM=$BUILD_DIR/tools/straggler-sim/straggler-sim
CTL=$BUILD_DIR/tools/stragglerctl/stragglerctl
for bin in "$DAEMON" "$SIM" "$CTL"; do
  [[ -x "$bin" ]] || die "$bin was not built (run scripts/build.sh and check its errors)"
done

RUN_DIR=$BUILD_DIR/demo
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
READY_FILE=$RUN_DIR/stragglerd.ready.json
DAEMON_LOG=$RUN_DIR/stragglerd.log
REPORT=$RUN_DIR/sim-report.json

DAEMON_PID=""
stop_daemon() {
  # Sends SIGTERM, waits up to 15 s for a clean exit, then SIGKILL.
  # Sets DAEMON_RC to the daemon's exit status.
  local pid=$DAEMON_PID i
  DAEMON_PID=""
  DAEMON_RC=0
  [[ -n "$pid" ]] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      printf 'demo.sh: stragglerd (pid %s) did not exit 15 s after SIGTERM; killing it\n' "$pid" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || DAEMON_RC=$?
}
SIM_PID=""
on_exit() {
  local rc=$?
  trap - EXIT
  if [[ -n "$SIM_PID" ]]; then
    kill -TERM "$SIM_PID" 2>/dev/null || true
    wait "$SIM_PID" 2>/dev/null || true
  fi
  stop_daemon
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

DAEMON_ARGS=(--grpc-address 127.0.0.1:0 --http-address 127.0.0.1:0 --ready-file "$READY_FILE")
if [[ -n "${DEMO_LOG_LEVEL:-}" ]]; then
  DAEMON_ARGS+=(--log-level "$DEMO_LOG_LEVEL")
fi

log "starting stragglerd ${DAEMON_ARGS[*]} (log: $DAEMON_LOG, shown with a [stragglerd] prefix)"
"$DAEMON" "${DAEMON_ARGS[@]}" \
  > >(tee "$DAEMON_LOG" | sed -u 's/^/[stragglerd] /' >&2) 2>&1 &
DAEMON_PID=$!

ADDR=""
deadline=$((SECONDS + READY_TIMEOUT))
while [[ -z "$ADDR" ]]; do
  if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    stop_daemon
    die "stragglerd exited (status $DAEMON_RC) before it was ready; see $DAEMON_LOG"
  fi
  if ((SECONDS >= deadline)); then
    die "stragglerd did not write its ready file $READY_FILE within ${READY_TIMEOUT} s; see $DAEMON_LOG"
  fi
  if [[ -s "$READY_FILE" ]]; then
    ADDR=$(sed -n 's/.*"grpc_address"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$READY_FILE" | head -n 1)
  fi
  [[ -n "$ADDR" ]] || sleep 0.1
done
log "stragglerd is serving on $ADDR (ready file: $(cat "$READY_FILE"))"

SIM_ARGS=(--daemon "$ADDR" --job "$JOB" --ranks 8 --iterations 400 --iteration-ms 20
          --noise 0.05 --slow 3:3:50:350 --report "$REPORT")
log "straggler-sim ${SIM_ARGS[*]}"
# In the background with a wait, so that a signal to this script stops it at once.
sim_rc=0
timeout 300 "$SIM" "${SIM_ARGS[@]}" &
SIM_PID=$!
wait "$SIM_PID" || sim_rc=$?
SIM_PID=""
if [[ $sim_rc -ne 0 ]]; then
  printf 'demo.sh: straggler-sim exited with status %s\n' "$sim_rc" >&2
fi

log "stragglerctl --daemon $ADDR events $JOB"
ctl_rc=0
timeout 60 "$CTL" --daemon "$ADDR" events "$JOB" || ctl_rc=$?
if [[ $ctl_rc -ne 0 ]]; then
  printf 'demo.sh: stragglerctl exited with status %s\n' "$ctl_rc" >&2
fi

log "stopping stragglerd (SIGTERM)"
stop_daemon
printf 'stragglerd exited with status %s\n' "$DAEMON_RC"
printf 'daemon log: %s\nsimulation report: %s\n' "$DAEMON_LOG" "$REPORT"

if [[ $sim_rc -ne 0 || $ctl_rc -ne 0 || $DAEMON_RC -ne 0 ]]; then
  exit 1
fi
