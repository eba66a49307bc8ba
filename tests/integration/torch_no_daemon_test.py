#!/usr/bin/env python3
"""No hard dependency on the daemon (issue 14): a 4-rank PyTorch DDP job with
the partial all-reduce hook, written as README's exclusion recipe, whose
stragglerd is not there.

Cases (--case):
  no_daemon    Nothing listens at STRAGGLER_ENDPOINT for the whole run: every
               rank trains to the end on the full group, with finite loss and
               equal parameters (the average really ran).
  daemon_late  stragglerd starts at that address ~10 s into the run, then rank
               3 turns 4x slower: rank 3 is excluded from then on (a plan
               with it not participating) and the others go on to the end,
               which the driver sets 20 iterations after the exclusion.

    torch_no_daemon_test.py --case CASE --stragglerd PATH --python PY --pythonpath DIR
"""

import math
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import free_port  # noqa: E402
from harness import Daemon, RankProcesses, check, torch_cases_main, wait_for  # noqa: E402

WORLD = 4
SLOW = 3


def start_ranks(args, workdir, address, job, iterations, slow_flag="", stop_file=""):
    env = dict(os.environ, PYTHONPATH=args.pythonpath, WORLD_SIZE=str(WORLD),
               STRAGGLER_ENDPOINT=address, STRAGGLER_JOB_ID=job)
    for name in ("STRAGGLER_RUN_ID", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)  # the run id comes from torch.distributed's store
    rank_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_no_daemon_rank.py")
    cmds = []
    store = os.path.join(workdir, "filestore")
    for r in range(WORLD):
        cmds.append([args.python, rank_py, "--store", store, "--iterations", str(iterations),
                     "--slow-rank", str(SLOW), "--slow-flag", slow_flag, "--stop-file", stop_file])
    # RankProcesses takes one env for all: RANK goes through env(1) per rank.
    return RankProcesses([["env", "RANK=%d" % r] + c for r, c in enumerate(cmds)], workdir,
                         deadline_s=240, env=env)


def log_of(daemon):
    with open(daemon.log_path) as f:
        return f.read()


def check_trained(ranks, label):
    for r in range(WORLD):
        lines = ranks.lines[r]
        check(lines and all(math.isfinite(x["loss"]) for x in lines),
              "%s: rank %d has no or non-finite losses" % (label, r))
    run_ids = {ranks.final[r]["run_id"] for r in range(WORLD)}
    check(len(run_ids) == 1 and "" not in run_ids,
          "%s: the ranks disagree on the run id, or have none: %s" % (label, run_ids))


def test_no_daemon(args, workdir):
    address = "127.0.0.1:%d" % free_port()  # nothing listens there
    ranks = start_ranks(args, workdir, address, "no-daemon-%d" % os.getpid(), 150)
    try:
        ranks.finish()
    finally:
        ranks.kill()
    check_trained(ranks, "no daemon")
    params = [ranks.final[r]["params"] for r in range(WORLD)]
    check(all(p == params[0] for p in params),
          "no daemon: the ranks' parameters differ: the gradients were not averaged")
    check(all(not ranks.final[r]["connected"] for r in range(WORLD)),
          "no daemon: a client says it is connected")
    check(all(x["participating"] and len(x["active"]) == WORLD
              for r in range(WORLD) for x in ranks.lines[r]),
          "no daemon: a step ran without the full group")
    t = max(ranks.lines[0][-1]["t"], 1e-9)
    print("no daemon: 4 ranks x 150 steps on the full group in %.1f s (%.1f steps/s)"
          % (t, 150 / t))


def excluded_at(ranks):
    """The first iteration rank SLOW ran excluded, once some other rank ran
    that iteration too; else None. Fails at once when a rank has died."""
    for r, p in enumerate(ranks.procs):
        check(p.poll() in (None, 0), "rank %d exited with %s: %s" % (r, p.returncode, ranks.err(r)))
    out = [x["it"] for x in list(ranks.lines[SLOW]) if not x["participating"]]
    if out and any(ranks.lines[r] and ranks.lines[r][-1]["it"] >= out[0]
                   for r in range(WORLD) if r != SLOW):
        return out[0]
    return None


def stop_after(ranks, stop_file, more):
    """Ends the job `more` iterations past the furthest rank: each rank reads
    the file before each step (written whole, by rename)."""
    at = max(ranks.lines[r][-1]["it"] for r in range(WORLD) if ranks.lines[r]) + more
    with open(stop_file + ".tmp", "w") as f:
        f.write(str(at))
    os.rename(stop_file + ".tmp", stop_file)
    return at


def test_daemon_late(args, workdir):
    address = "127.0.0.1:%d" % free_port()
    flag = os.path.join(workdir, "slow.flag")
    stop_file = os.path.join(workdir, "stop")
    job = "daemon-late-%d" % os.getpid()
    # A bound the driver never lets the ranks reach: it stops them once the
    # exclusion is seen, so the run is as long as the machine needs.
    ranks = start_ranks(args, workdir, address, job, 5000, slow_flag=flag, stop_file=stop_file)
    daemon = Daemon(args.stragglerd, workdir, grpc_address=address)
    try:
        time.sleep(10)
        check(all(p.poll() is None for p in ranks.procs), "a rank ended before the daemon came")
        daemon.start()
        wait_for("a client to reach the late daemon", lambda: "stream from" in log_of(daemon),
                 timeout=30)
        open(flag, "w").close()
        wait_for("rank %d to be excluded" % SLOW, lambda: excluded_at(ranks) is not None,
                 timeout=120)
        end = stop_after(ranks, stop_file, 20)
        ranks.finish()
    finally:
        ranks.kill()
        daemon.__exit__(None, None, None)
    check_trained(ranks, "daemon late")
    out = [x["it"] for x in ranks.lines[SLOW] if not x["participating"]]
    check(out, "rank %d was never excluded after the daemon came (slow from the flag on)\n%s"
          % (SLOW, daemon.log_tail()))
    others = [x for r in range(WORLD) if r != SLOW for x in ranks.lines[r]
              if x["it"] >= out[0]]
    check(all(SLOW not in x["active"] and x["participating"] for x in others),
          "the other ranks did not leave rank %d out from iteration %d on" % (SLOW, out[0]))
    check(all(ranks.lines[r][-1]["it"] == end - 1 for r in range(WORLD) if r != SLOW),
          "the other ranks did not go on to iteration %d: %s"
          % (end - 1, [ranks.lines[r][-1]["it"] for r in range(WORLD)]))
    print("daemon late: rank %d excluded from iteration %d (daemon started at ~10 s), "
          "the others went on to %d" % (SLOW, out[0], end - 1))


CASES = {"no_daemon": test_no_daemon, "daemon_late": test_daemon_late}

if __name__ == "__main__":
    torch_cases_main(CASES, __doc__.splitlines()[0], "straggler-no-daemon-")
