#!/usr/bin/env python3
"""A straggler excluded through the DDP hook, the daemon killed with SIGKILL
and restarted (issue 28, item 1): the restored straggler stays out while it
is slow and is readmitted once it is fast, with a state database and
(--no-db) without, where the restarted daemon takes the job over from the
ranks' hellos.

Four real rank processes (torch_ddp_rank.py: DDP on Gloo, gradients averaged
by straggler.torch.partial_allreduce_hook, the daemon's own detection with
its defaults). Rank 3's step takes 200 ms while a file exists, the others'
10 ms. Once the daemon has excluded rank 3 and the others have run 150 steps
without it (rank 3 lags them, as an excluded rank does), the daemon is killed
(SIGKILL) and started again on the same port; rank 3 stays slow until the ranks have run 60 more
iterations on the restarted daemon (it must stay excluded throughout), then
the file goes and rank 3 must be readmitted. The run then ends at a common
iteration, and every rank must end with the same parameters.

    torch_restart_readmit_test.py --stragglerd PATH --ctl PATH --python PATH
                                  --pythonpath DIR [--no-db]
"""

import argparse
import os
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import free_port  # noqa: E402
from harness import (Daemon, RankProcesses, TestFailure, check, daemon_get,  # noqa: E402
                     main, require_torch, wait_for)
from harness import excluded as harness_excluded  # noqa: E402

WORLD = 4
SLOW = 3
JOB = "torch-restart-readmit"
DEADLINE_S = 240


def excluded(daemon):
    return harness_excluded(daemon_get(daemon, "/v1/jobs/" + JOB))


def progress(ranks, among=(0, 1, 2)):
    return min((ranks.lines[r][-1]["it"] if ranks.lines[r] else -1) for r in among)


def test(args):
    require_torch()
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory(prefix="torch-restart-readmit-") as work:
        address = "127.0.0.1:%d" % free_port()
        db_args = [] if args.no_db else ["--state-db", os.path.join(work, "state.db")]
        old = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-a",
                     extra_args=db_args)
        new = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-b",
                     extra_args=db_args)
        slow_file = os.path.join(work, "rank3.slow")
        stop_file = os.path.join(work, "stop")
        open(slow_file, "w").close()
        env = dict(os.environ, PYTHONPATH=args.pythonpath, OMP_NUM_THREADS="1")
        store = os.path.join(work, "ddp.store")
        cmds = [[args.python, os.path.join(here, "torch_ddp_rank.py"), "--daemon", address,
                 "--job", JOB, "--rank", str(r), "--world-size", str(WORLD), "--store", store,
                 "--iterations", "100000", "--step-ms", "10", "--stop-file", stop_file]
                + (["--slow-file", slow_file, "--slow-ms", "200"] if r == SLOW else [])
                for r in range(WORLD)]
        ranks = None
        try:
            old.start()
            ranks = RankProcesses(cmds, work, DEADLINE_S, env=env, err_tail=3000)
            wait_for("rank 3 excluded", lambda: excluded(old) == [SLOW], timeout=120)
            # Rank 3, 20x slower, falls behind the group while excluded (its
            # shadow steps lag the rows by design): kill the daemon once the
            # lag is large, as in a long job.
            out_at = progress(ranks)
            wait_for("150 iterations without rank 3", lambda: progress(ranks) >= out_at + 150,
                     timeout=120)
            old.proc.kill()  # SIGKILL: the database (or the hellos) is all that survives
            old.proc.wait()
            time.sleep(1.0)
            new.start()
            # Slow on: the restarted daemon takes the excluded set over (from
            # its database or the ranks' hellos) and must keep rank 3 out.
            wait_for("the restarted daemon's version excluding rank 3",
                     lambda: excluded(new) == [SLOW], timeout=60)
            start = progress(ranks)
            while progress(ranks) < start + 60:
                check(excluded(new) == [SLOW], "rank 3, still slow, is not excluded by the "
                      "restarted daemon: %s\n%s" % (excluded(new), new.log_tail(40)))
                for r, p in enumerate(ranks.procs):
                    if p.poll() is not None:
                        raise TestFailure("rank %d exited with %s: %s"
                                          % (r, p.returncode, ranks.err(r)))
                time.sleep(0.1)
            os.unlink(slow_file)  # rank 3 is fast from here on
            fast_from = progress(ranks)
            wait_for("rank 3 readmitted", lambda: excluded(new) == [], timeout=120)
            back_at = progress(ranks)
            # Past the readmission's effective iteration (progress + lead)
            # with room to spare, on every rank's clock.
            with open(stop_file + ".tmp", "w") as f:
                f.write(str(back_at + 60))
            os.replace(stop_file + ".tmp", stop_file)
            ranks.finish()
        finally:
            if ranks is not None:
                ranks.kill()
            old.__exit__(None, None, None)
        final = ranks.final
        for r in range(1, WORLD):
            check(final[r]["final"] == final[0]["final"],
                  "rank %d ended with other parameters than rank 0" % r)
        rows3 = [row for row in ranks.lines[SLOW] if "skip_to" not in row]
        late = [row["it"] for row in rows3 if row["participating"] and row["it"] > fast_from]
        check(late, "rank 3 never took part again after it turned fast at iteration %d" % fast_from)
        events = daemon_get(new, "/v1/jobs/%s/events" % JOB, rank=SLOW,
                            kind="state_change").get("events", [])
        for e in events:
            print("restarted daemon: %s" % e.get("message"))
        check(new.stop() == 0, "the restarted daemon did not exit 0")
        print("rank 3 kept out across the restart while slow, fast from iteration %d, readmitted "
              "(the daemon) by %d, took part again from %d (%s)"
              % (fast_from, back_at, late[0], "no database" if args.no_db else "state database"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("stragglerd", "ctl", "python", "pythonpath"):
        parser.add_argument("--" + name, required=True)
    parser.add_argument("--no-db", action="store_true")
    args = parser.parse_args()
    main(lambda: test(args))
