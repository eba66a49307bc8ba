#!/usr/bin/env bash
# Runs every GPU test this machine can run, says which it skipped and why, and
# ends with one summary line (docs/gpu.md):
#
#   bash scripts/gpu-check.sh [--root DIR] [--require-gpu] [--only NAME]...
#
# DIR: a build tree (default: build/ of this repository) or a bundle unpacked
# from scripts/gpu-bundle.sh (it has bin/stragglerd). The checks:
#   cuda_timer      the CUDA event timer (cuda_timer_gpu_tests)
#   nvml_agent      telemetry through straggler-agent with the real NVML
#   nccl_one_rank   a one-rank NCCL communicator through BeginIteration, the
#                   agreement and the all-reduce (the C++ driver, real daemon)
#   python_nccl     straggler.PartialAllReduce(backend="nccl") on CUDA tensors
#   nccl_two_rank   exclusion and rejoin on two ranks: >= 2 GPUs, or NCCL >= 2.30
#                   with NCCL_MULTI_RANK_GPU_ENABLE=1 (two ranks on one GPU)
#   monitor_cuda    the CUDA-event timing of straggler.torch.monitor
#   nccl_no_daemon  DDP over NCCL with the hook and no daemon: the full group
#   pip_nccl        `pip install` of python/ with STRAGGLER_NCCL=on (build tree
#                   only: it needs the checkout), then python_nccl on that module
# Exit status: 1 when a check failed; with --require-gpu also when every
# check was skipped (a run that tested nothing must not pass); else 0.
# Environment: PYTHON (default python3), CHECK_TIMEOUT (seconds per check, 600).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=""
REQUIRE_GPU=0
ONLY=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --root) ROOT=$2; shift 2 ;;
    --require-gpu) REQUIRE_GPU=1; shift ;;
    --only) ONLY+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
CHECK_TIMEOUT=${CHECK_TIMEOUT:-600}
# pip's NCCL (nvidia-nccl-cu13, the one torch loads) is not on the loader's
# path: add its folder for the C++ binaries, unless a libnccl.so.2 is found.
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
  nccl_dir=$("$PYTHON" -c "import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], 'lib'))" \
             2>/dev/null || true)
  if [[ -n $nccl_dir && -d $nccl_dir ]]; then export LD_LIBRARY_PATH=$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
fi

# Where the pieces are: a bundle (bin/, lib/, python/, tests/, scripts/) or a
# build tree beside this script's repository.
if [[ -z "$ROOT" ]]; then
  if [[ -x "$REPO/bin/stragglerd" ]]; then ROOT=$REPO; else ROOT=$REPO/build; fi
fi
[[ -d "$ROOT" ]] || { echo "gpu-check.sh: --root $ROOT: no such directory" >&2; exit 2; }
ROOT=$(cd "$ROOT" && pwd)
if [[ -x "$ROOT/bin/stragglerd" ]]; then
  LAYOUT=bundle
  BIN_STRAGGLERD=$ROOT/bin/stragglerd
  BIN_AGENT=$ROOT/bin/straggler-agent
  BIN_SIM=$ROOT/bin/straggler-sim
  BIN_CTL=$ROOT/bin/stragglerctl
  BIN_DRIVER=$ROOT/bin/straggler-collective-driver
  BIN_TIMER=$ROOT/bin/cuda_timer_gpu_tests
  PYPATH=$ROOT/python
  TESTS=$ROOT/tests
else
  LAYOUT=build
  BIN_STRAGGLERD=$ROOT/daemon/stragglerd
  BIN_AGENT=$ROOT/agent/straggler-agent
  BIN_SIM=$ROOT/tools/straggler-sim/straggler-sim
  BIN_CTL=$ROOT/tools/stragglerctl/stragglerctl
  BIN_DRIVER=$ROOT/tests/straggler-collective-driver
  BIN_TIMER=$ROOT/tests/cuda_timer_gpu_tests
  PYPATH=$ROOT/python
  TESTS=$REPO/tests
fi
HELPERS=$(dirname "${BASH_SOURCE[0]}")/gpu-check-helpers.py
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")

# What the machine has, said once, so every skip below can name it.
GPUS=0
GPU_NAMES="none"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >"$LOGDIR/nvidia-smi.txt" 2>&1; then
  GPUS=$(grep -c '^GPU ' "$LOGDIR/nvidia-smi.txt")
  GPU_NAMES=$(sed -n 's/^GPU [0-9]*: \(.*\) (UUID.*/\1/p' "$LOGDIR/nvidia-smi.txt" | sort | uniq -c |
              awk '{c=$1; $1=""; printf "%s%dx%s", (n++ ? ", " : ""), c, $0}')
fi
NCCL_INFO=""
if [[ -x "$BIN_DRIVER" ]]; then
  NCCL_INFO=$("$BIN_DRIVER" --gpu-count 2>&1 >/dev/null | tail -n 1)
fi
HAVE_PY=0
"$PYTHON" -c "import sys; sys.path.insert(0, '$PYPATH'); import straggler" >/dev/null 2>&1 && HAVE_PY=1
echo "gpu-check: $LAYOUT at $ROOT; GPUs: $GPUS ($GPU_NAMES); ${NCCL_INFO:-no NCCL backend}; logs in $LOGDIR"

PASSED=0; FAILED=0; SKIPPED=0
SUMMARY=()
wanted() {
  [[ ${#ONLY[@]} -eq 0 ]] && return 0
  local o; for o in "${ONLY[@]}"; do [[ "$o" == "$1" ]] && return 0; done
  return 1
}
record() {  # name status detail
  case "$2" in
    PASS) PASSED=$((PASSED + 1)) ;;
    FAIL) FAILED=$((FAILED + 1)) ;;
    SKIP) SKIPPED=$((SKIPPED + 1)) ;;
  esac
  printf '%-15s %s  %s\n' "$1" "$2" "$3"
  SUMMARY+=("$1=$2")
}
skip() { wanted "$1" && record "$1" SKIP "$2"; }
# run_check name command...: exit 0 passes, 77 skips (reason: the last
# "SKIP"/"SKIPPED" line of its output), anything else fails (log kept).
run_check() {
  local name=$1; shift
  wanted "$name" || return 0
  local log=$LOGDIR/$name.log
  timeout "$CHECK_TIMEOUT" "$@" >"$log" 2>&1
  local rc=$?
  local last; last=$(grep -v '^\s*$' "$log" | tail -n 1)
  if [[ $rc -eq 0 ]]; then
    record "$name" PASS "$(grep -E '^[a-zA-Z0-9 -]+: ' "$log" | grep -v '^SKIP' | tail -n 1 | cut -c1-200)"
  elif [[ $rc -eq 77 ]]; then
    record "$name" SKIP "$(grep -E '^SKIP(PED)?:' "$log" | tail -n 1 | sed -E 's/^SKIP(PED)?: //' | cut -c1-200)"
  else
    record "$name" FAIL "exit $rc: ${last:0:200} (log $log)"
  fi
}

no_gpu="no GPU visible (nvidia-smi: $( [[ -s $LOGDIR/nvidia-smi.txt ]] && head -n 1 "$LOGDIR/nvidia-smi.txt" | cut -c1-80 || echo 'not installed'))"

# 1. The CUDA event timer.
if [[ ! -x "$BIN_TIMER" ]]; then skip cuda_timer "$BIN_TIMER not built (no CUDA toolkit at build time)"
elif [[ $GPUS -eq 0 ]]; then skip cuda_timer "$no_gpu"
else run_check cuda_timer "$BIN_TIMER"; fi

# 2. NVML through the agent.
if [[ ! -x "$BIN_AGENT" || ! -x "$BIN_SIM" ]]; then skip nvml_agent "$BIN_AGENT or $BIN_SIM not built"
elif [[ $GPUS -eq 0 ]]; then skip nvml_agent "$no_gpu"
else run_check nvml_agent "$PYTHON" "$HELPERS" nvml --stragglerd "$BIN_STRAGGLERD" --agent "$BIN_AGENT" \
       --sim "$BIN_SIM" --tests "$TESTS"; fi

# 3. One-rank NCCL communicator.
if [[ -z "$NCCL_INFO" || ! -x "$BIN_DRIVER" ]]; then skip nccl_one_rank "no NCCL backend in this build"
elif [[ $GPUS -eq 0 ]]; then skip nccl_one_rank "$no_gpu"
else run_check nccl_one_rank "$PYTHON" "$HELPERS" one_rank --stragglerd "$BIN_STRAGGLERD" \
       --driver "$BIN_DRIVER" --tests "$TESTS"; fi

# 4. The Python NCCL path.
if [[ $HAVE_PY -eq 0 ]]; then skip python_nccl "the straggler Python package is not importable from $PYPATH"
elif [[ $GPUS -eq 0 ]]; then skip python_nccl "$no_gpu"
else run_check python_nccl "$PYTHON" "$TESTS/collective/python_nccl_test.py" --gpu reducer \
       --pythonpath "$PYPATH"; fi

# 5. Two-rank exclusion and rejoin.
nccl_code=$(sed -n 's/^NCCL \([0-9]*\)\.\([0-9]*\)\.\([0-9]*\) .*/\1 \2 \3/p' <<<"$NCCL_INFO" |
            awk '{print $1*10000 + $2*100 + $3}')
if [[ -z "$NCCL_INFO" || ! -x "$BIN_DRIVER" ]]; then skip nccl_two_rank "no NCCL backend in this build"
elif [[ $GPUS -ge 2 ]]; then
  run_check nccl_two_rank "$PYTHON" "$TESTS/integration/collective_test.py" exclusion_rejoin --backend nccl \
    --stragglerd "$BIN_STRAGGLERD" --driver "$BIN_DRIVER" --ctl "$BIN_CTL"
elif [[ $GPUS -eq 1 && ${nccl_code:-0} -ge 23000 ]]; then
  NCCL_MULTI_RANK_GPU_ENABLE=1 run_check nccl_two_rank "$PYTHON" "$TESTS/integration/collective_test.py" \
    exclusion_rejoin --backend nccl --stragglerd "$BIN_STRAGGLERD" --driver "$BIN_DRIVER" --ctl "$BIN_CTL"
else
  skip nccl_two_rank "needs >= 2 GPUs, or NCCL >= 2.30 for two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1); this machine: $GPUS GPU(s), ${NCCL_INFO%%:*}"
fi

# 6. Monitoring-only mode's CUDA-event timing.
if [[ $HAVE_PY -eq 0 ]]; then skip monitor_cuda "the straggler Python package is not importable from $PYPATH"
elif [[ $GPUS -eq 0 ]]; then skip monitor_cuda "$no_gpu"
else run_check monitor_cuda "$PYTHON" "$HELPERS" monitor_cuda --pythonpath "$PYPATH"; fi

# 7. NCCL with no daemon.
if [[ $HAVE_PY -eq 0 ]]; then skip nccl_no_daemon "the straggler Python package is not importable from $PYPATH"
elif [[ $GPUS -eq 0 ]]; then skip nccl_no_daemon "$no_gpu"
else run_check nccl_no_daemon "$PYTHON" "$TESTS/collective/python_nccl_test.py" --gpu ddp \
       --pythonpath "$PYPATH"; fi

# 8. A pip-installed module (not the build tree's): NCCL built in, on CUDA tensors.
if [[ $LAYOUT != build || ! -f "$REPO/python/setup.py" ]]; then skip pip_nccl "needs the source checkout (python/setup.py); this is a $LAYOUT"
elif [[ -z "$NCCL_INFO" ]]; then skip pip_nccl "no NCCL backend in this build, so pip would find none either"
elif [[ $GPUS -eq 0 ]]; then skip pip_nccl "$no_gpu"
else run_check pip_nccl "$PYTHON" "$HELPERS" pip_nccl --source "$REPO" --tests "$TESTS"; fi

status=ok
rc=0
if [[ $FAILED -gt 0 ]]; then status=FAILED; rc=1
elif [[ $REQUIRE_GPU -eq 1 && $PASSED -eq 0 ]]; then status="FAILED (--require-gpu: nothing ran)"; rc=1; fi
echo "gpu-check summary: $status: $PASSED passed, $FAILED failed, $SKIPPED skipped; GPUs: $GPUS ($GPU_NAMES); $(date -u +%Y-%m-%dT%H:%MZ); ${SUMMARY[*]}"
exit $rc
