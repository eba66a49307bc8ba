#!/usr/bin/env python3
"""Detection with a declared topology against the real stragglerd (issue 17,
"Done when"): straggler-sim --topology 4x2x2 (4 replicas x 2 stages x 2
tensor ranks, Megatron's order: stage 1 = ranks 8-15) with stage 1 1.6x slower
by design (--stage-cost 1,1.6), over real gRPC, with the daemon's default
policy (no config file).

  --case imbalance   nothing is flagged: the slower stage is the design.
  --case straggler   rank 10 (stage 1) also at 1.4x its stage from iteration
                     SLOW_FROM on: rank 10, and only rank 10, is flagged, within
                     10 iterations of SLOW_FROM.

The same job, replayed offline, is scenarios/pipeline-4x2x2-stage1.6.yaml and
pipeline-stage-straggler-1.4x.yaml.

    topology_detection_test.py --stragglerd PATH --sim PATH --case imbalance|straggler
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, check, in_workdir, main, run  # noqa: E402

ITERATIONS = 200
# 20 ms steps: long against the per-step cost of 16 rank threads and a daemon
# on a shared 2-core machine.
ITERATION_MS = 20
SLOW_RANK = 10
SLOW_FROM = 60
SLOW_FACTOR = 1.4
WITHIN = 10
SEED = 17  # fixed, so a failure can be replayed with the same draws


def run_case(args, workdir):
    with Daemon(args.stragglerd, workdir) as d:
        report_path = os.path.join(workdir, "sim.json")
        cmd = [args.sim, "--daemon", d.address, "--job", "topo-detect-" + args.case,
               "--topology", "4x2x2", "--stage-cost", "1,1.6", "--iterations", str(ITERATIONS),
               "--iteration-ms", str(ITERATION_MS), "--noise", "0.05", "--seed", str(SEED),
               "--report", report_path, "--quiet"]
        if args.case == "straggler":
            cmd += ["--slow", "%d:%g:%d:%d" % (SLOW_RANK, SLOW_FACTOR, SLOW_FROM, ITERATIONS)]
        res = run(cmd, 180)
        check(res.returncode == 0, "sim exited %d:\n%s\n%s" % (res.returncode, res.stderr[-2000:],
                                                                d.log_tail()))
        with open(report_path) as f:
            report = json.load(f)
    check(report["world_size"] == 16, "the sim ran %s ranks, not 4x2x2" % report["world_size"])
    detected = {r["rank"]: r["detected_at"] for r in report["ranks"] if r["detected_at"]}
    print("%s: detections %s" % (args.case, detected))
    if args.case == "imbalance":
        check(not detected, "stage 1 is 1.6x slower by design, yet ranks were flagged: %s"
              % detected)
        return
    others = {r: at for r, at in detected.items() if r != SLOW_RANK}
    check(not others, "ranks other than %d flagged: %s" % (SLOW_RANK, others))
    at = detected.get(SLOW_RANK, [])
    check(at, "rank %d at %gx its stage from %d was never flagged"
          % (SLOW_RANK, SLOW_FACTOR, SLOW_FROM))
    check(SLOW_FROM <= at[0] <= SLOW_FROM + WITHIN,
          "rank %d flagged at %d, expected within %d iterations of %d"
          % (SLOW_RANK, at[0], WITHIN, SLOW_FROM))
    check(len(at) == 1, "rank %d flagged %d times (%s): it flaps" % (SLOW_RANK, len(at), at))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--sim", required=True)
    parser.add_argument("--case", choices=["imbalance", "straggler"], required=True)
    parser.add_argument("--keep")
    args = parser.parse_args()
    main(lambda: in_workdir("topology-detection-", lambda w: run_case(args, w), args.keep))
