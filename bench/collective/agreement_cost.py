#!/usr/bin/env python3
"""What the membership rule costs a Gloo job per iteration: 4 processes of the
collective test driver (tests/collective/collective_driver.cc) against a real
stragglerd on loopback, nobody excluded. Measures the job's wall time per
iteration (from the start signal to the last rank's exit, over the
iterations; each iteration sleeps --step-ms, then averages 8 floats and 8
doubles) and the time each rank spends in BeginIteration (the driver's
begin_ms: MembershipFor, normally no wait, plus the in-band agreement - one
40-byte all-reduce - which also waits for the last rank to arrive). Run it
with two driver builds to see what the agreement adds (BENCHMARKS.md
"In-band agreement").

  bench/collective/agreement_cost.py --stragglerd build/daemon/stragglerd \\
      --driver build/tests/straggler-collective-driver [--driver OTHER ...] \\
      [--agreement-interval 1 --agreement-interval 8] \
      [--iterations 400] [--step-ms 20] [--runs 3]

Each driver runs with each --agreement-interval (default 1; a driver built
before the option existed takes no interval: pass "none").
Prints one line per driver, interval and run: wall ms per iteration, then median, p90
and p99 of begin_ms over the iterations after the first 10 of every rank,
and the load average. Exits 1
when a run fails (a rank exits badly, or an average is wrong).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "integration"))
from harness import Daemon, RankProcesses, check, failures_exit, percentile  # noqa: E402

WORLD = 4


def one_run(stragglerd, driver, interval, iterations, step_ms, job):
    with tempfile.TemporaryDirectory(prefix="agreement-cost-") as workdir:
        with Daemon(stragglerd, workdir) as d:
            go = os.path.join(workdir, "go")
            cmds = [[driver, "--daemon", d.address, "--job", job, "--rank", str(r),
                     "--world-size", str(WORLD), "--iterations", str(iterations),
                     "--step-ms", str(step_ms), "--elements", "8", "--go-file", go]
                    + ([] if interval == "none" else ["--agreement-interval", interval])
                    for r in range(WORLD)]
            ranks = RankProcesses(cmds, workdir, deadline_s=120 + iterations * step_ms / 1000.0)
            with open(go, "w") as f:
                f.write("go\n")
            started = time.monotonic()
            ranks.finish()
            wall = time.monotonic() - started
            begin = []
            for r in range(WORLD):
                rows = ranks.lines[r]
                check(len(rows) == iterations, "rank %d printed %d of %d iterations"
                      % (r, len(rows), iterations))
                for row in rows:
                    check(row["participated"] and row["active"] == list(range(WORLD)),
                          "rank %d iteration %d: %r" % (r, row["it"], row))
                    if row["it"] >= 10:
                        begin.append(row["begin_ms"])
            return 1000.0 * wall / iterations, begin


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stragglerd", required=True)
    p.add_argument("--driver", action="append", required=True)
    p.add_argument("--agreement-interval", action="append")
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--step-ms", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()

    def runs():
        check(args.iterations > 10, "--iterations=%d must be > 10" % args.iterations)
        for run in range(args.runs):
            # Alternating, so load hits every variant alike.
            variants = [(d, i) for d in args.driver for i in (args.agreement_interval or ["1"])]
            for n, (driver, interval) in enumerate(variants):
                per_iteration, begin = one_run(args.stragglerd, driver, interval, args.iterations,
                                               args.step_ms, "agreement-cost-%d-%d" % (run, n))
                load = open("/proc/loadavg").read().split()[0]
                print("%s interval %s run %d: %.3f ms per iteration (step %d ms); BeginIteration median "
                      "%.3f ms, p90 %.3f ms, p99 %.3f ms (%d samples, load %s)"
                      % (driver, interval, run, per_iteration, args.step_ms, statistics.median(begin),
                                                 percentile(begin, 0.9), percentile(begin, 0.99),
                                                 len(begin), load), flush=True)
    return failures_exit(runs, "agreement_cost")


if __name__ == "__main__":
    sys.exit(main())
