#!/usr/bin/env python3
"""What the membership switch rule costs a trainer's step, by the lead: one rank
of the Python module against a real stragglerd on loopback, each step
sleeping --step-ms (the step), then report(i), then membership_for(i + 1) at
once, as straggler.torch's end_step(i) and begin_step(i + 1) do.

membership_for(i + 1) is certain once the daemon has processed this rank's
report of i + 1 - lead (docs/membership.md#the-switch-rule): with lead 2 that is
the report just made, so the call waits one round trip to the daemon; with
lead 3 (the default) it is the previous step's, acknowledged long before.
The lead is set through the daemon's policy (policy.lead_iterations).

  bench/client/membership_wait.py --stragglerd build/daemon/stragglerd \\
      --pythonpath build/python [--lead 2 --lead 3] [--steps 400] [--step-ms 5] [--runs 2]

Prints one line per lead and run: p50, p90 and mean of the membership_for wait
over the steps after the first 50, and the share of report() calls that woke
the client's sender (Stats().report_wakes). Exits 1 when a call is not
certain or the daemon fails (BENCHMARKS.md "Membership wait per step").
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "integration"))
from harness import Daemon, check, failures_exit, percentile  # noqa: E402

WARMUP = 50


def one_run(straggler, stragglerd, lead, steps, step_ms, job):
    with tempfile.TemporaryDirectory(prefix="membership-wait-") as workdir:
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("policy:\n  lead_iterations: %d\n" % lead)
        with Daemon(stragglerd, workdir, extra_args=["--config", config]) as d:
            c = straggler.Client(endpoint=d.address, job_id=job, rank=0, world_size=1)
            try:
                check(c.membership_for(0, timeout=10.0).ok, "iteration 0 not certain")
                waits = []
                for i in range(steps):
                    time.sleep(step_ms / 1000.0)
                    c.report(0, i, step_ms / 1000.0)
                    t = time.perf_counter()
                    m = c.membership_for(i + 1, timeout=10.0)
                    waits.append(time.perf_counter() - t)
                    check(m.ok, "lead %d: membership_for(%d) not certain within 10 s" % (lead, i + 1))
                st = c.stats()
            finally:
                c.close()
    return waits[WARMUP:] if len(waits) > WARMUP else waits, st


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stragglerd", required=True)
    ap.add_argument("--pythonpath", required=True, help="where the straggler module was built")
    ap.add_argument("--lead", type=int, action="append", help="policy.lead_iterations (repeatable; default 2 and 3)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, args.pythonpath)
    import straggler  # noqa: E402 (built module, path given on the command line)

    leads = args.lead or [2, 3]
    for lead in leads:
        if lead < 1:
            print("membership_wait: --lead %d must be >= 1" % lead, file=sys.stderr)
            return 2

    def runs():
        for lead in leads:
            for run in range(args.runs):
                waits, st = one_run(straggler, args.stragglerd, lead, args.steps, args.step_ms,
                                    "wait-l%d-r%d" % (lead, run))
                print("lead %d run %d: membership_for wait p50 %.1f us, p90 %.1f us, mean %.1f us "
                      "(%d steps of %.1f ms); report() woke the sender %d of %d; load %.2f"
                      % (lead, run, percentile(waits, 0.5) * 1e6, percentile(waits, 0.9) * 1e6,
                         statistics.mean(waits) * 1e6, len(waits), args.step_ms,
                         st.report_wakes, st.enqueued, os.getloadavg()[0]), flush=True)
    return failures_exit(runs, "membership_wait")


if __name__ == "__main__":
    sys.exit(main())
