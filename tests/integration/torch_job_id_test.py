#!/usr/bin/env python3
"""A missing STRAGGLER_JOB_ID must not stop training (issue 28, item 6): two
ranks of README's monitoring-only recipe (torch_job_id_rank.py) launched by
the real torchrun (`python -m torch.distributed.run`, with `--redirects 1
--tee 1`, which Debian's torch 1.13 on Python 3.11 needs: docs/python.md),
with a real stragglerd at STRAGGLER_ENDPOINT and no STRAGGLER_JOB_ID.

Cases (--case):
  unset    torchrun's static rendezvous (TORCHELASTIC_RUN_ID is "none"): no
           job id anywhere. Both ranks train to the end (DDP still averages:
           equal parameters), each logs "not monitoring" once (two monitors
           per rank), its monitors report nothing, the daemon holds no job,
           and PartialAllReduceState (exclusion) refuses, naming
           STRAGGLER_JOB_ID.
  run_id   torchrun --rdzv_id: its TORCHELASTIC_RUN_ID names the job. Both
           ranks report under it, and the daemon holds every step of both.

    torch_job_id_test.py --case CASE --stragglerd PATH --python PY --pythonpath DIR
"""

import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import free_port  # noqa: E402
from harness import (Daemon, TestFailure, check, daemon_get,  # noqa: E402
                     torch_cases_main)

WORLD = 2
ITERATIONS = 12
WARNING = "straggler.torch.monitor: not monitoring"


def torchrun(args, workdir, daemon, rendezvous):
    """Runs the two ranks under torchrun; returns (results by rank, torchrun's stderr)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([args.pythonpath, here]),
               OMP_NUM_THREADS="1", STRAGGLER_ENDPOINT=daemon.address)
    for name in ("STRAGGLER_JOB_ID", "STRAGGLER_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK",
                 "WORLD_SIZE"):
        env.pop(name, None)
    cmd = [args.python, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc_per_node", str(WORLD), "--redirects", "1", "--tee", "1",
           "--log_dir", os.path.join(workdir, "torchrun-logs"), *rendezvous,
           os.path.join(here, "torch_job_id_rank.py"), "--out", workdir,
           "--iterations", str(ITERATIONS)]
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        raise TestFailure("torchrun did not end within 180 s: %s" % (e.stderr or "")[-3000:])
    check(res.returncode == 0, "torchrun exited with %d (a rank died):\n%s\n%s"
          % (res.returncode, res.stdout[-2000:], res.stderr[-4000:]))
    results = {}
    for r in range(WORLD):
        with open(os.path.join(workdir, "rank%d.json" % r)) as f:
            results[r] = json.load(f)
    return results, res.stderr


def test_unset(args, workdir):
    with Daemon(args.stragglerd, workdir) as d:
        results, stderr = torchrun(args, workdir, d, [
            "--rdzv_backend", "static", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port())])
        jobs = daemon_get(d, "/v1/jobs").get("jobs", [])
        check(d.stop() == 0, "stragglerd did not exit cleanly")
    for r, res in results.items():
        check(res["run_id_env"] == "none",
              "rank %d: torchrun's TORCHELASTIC_RUN_ID is %r, expected 'none' (static "
              "rendezvous without --rdzv_id)" % (r, res["run_id_env"]))
        check(res["enabled"] == [False, False] and res["reported"] == [0, 0],
              "rank %d: monitors enabled %s, reported %s without a job id"
              % (r, res["enabled"], res["reported"]))
        check(res["state_error"] and "STRAGGLER_JOB_ID" in res["state_error"],
              "rank %d: PartialAllReduceState without a job id: %r (expected a ValueError "
              "naming STRAGGLER_JOB_ID)" % (r, res["state_error"]))
    check(results[0]["params"] == results[1]["params"],
          "the ranks' parameters differ: DDP's own all-reduce did not run")
    warnings = [line for line in stderr.splitlines() if WARNING in line]
    check(len(warnings) == WORLD and all("STRAGGLER_JOB_ID" in w for w in warnings),
          "expected one warning per rank naming STRAGGLER_JOB_ID, got %d:\n%s"
          % (len(warnings), "\n".join(warnings) or stderr[-2000:]))
    check(not jobs, "the daemon holds jobs though no rank had a job id: %s" % jobs)
    print("unset: 2 ranks trained %d steps unmonitored; warning: %s"
          % (ITERATIONS, warnings[0].strip()))


def test_run_id(args, workdir):
    run = "job-id-test-%d" % os.getpid()
    with Daemon(args.stragglerd, workdir) as d:
        results, stderr = torchrun(args, workdir, d, [
            "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % free_port(),
            "--rdzv_id", run])
        reports = daemon_get(d, "/v1/jobs/%s/reports" % run, limit=1000).get("reports", [])
        check(d.stop() == 0, "stragglerd did not exit cleanly")
    check(WARNING not in stderr, "a rank did not monitor:\n%s" % stderr[-2000:])
    for r, res in results.items():
        check(res["enabled"] == [True, True] and res["job_id"] == run,
              "rank %d: monitors enabled %s under job id %r, expected torchrun's %r"
              % (r, res["enabled"], res["job_id"], run))
    check(results[0]["params"] == results[1]["params"], "the ranks' parameters differ")
    held = {(int(x.get("iteration", 0)), int(x.get("rank", 0))) for x in reports}
    want = {(it, r) for it in range(ITERATIONS) for r in range(WORLD)}
    check(want <= held, "the daemon's job %r lacks reports %s" % (run, sorted(want - held)[:8]))
    print("run_id: job %r from TORCHELASTIC_RUN_ID, %d reports held" % (run, len(held)))


CASES = {"unset": test_unset, "run_id": test_run_id}

if __name__ == "__main__":
    torch_cases_main(CASES, __doc__.splitlines()[0], "straggler-job-id-",
                     probe="torch.distributed.run")
