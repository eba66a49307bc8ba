#!/usr/bin/env python3
"""Topology end to end (docs/topology.md): straggler-sim --topology 2x2x2
--stage-cost 1,1.6 against the real stragglerd, then

  * REST (GET /v1/jobs/J/workers) shows every rank's peer group stage<s> and
    replica r, laid out as Megatron's default order (rank = t + 2*(r + 2*s));
  * `stragglerctl workers` shows them in its GROUP and REPLICA columns, and
    `stragglerctl worker` in its table;
  * /metrics labels the per-rank families with peer_group and replica;
  * stage 1 computes 1.6x as long (the sim's report, the daemon's EWMA);
  * bad --topology / --stage-cost values exit 2 naming the value;
  * straggler-replay carries a CSV's peer_group and replica columns into its
    report.

    topology_test.py --stragglerd PATH --sim PATH --ctl PATH --replay PATH
"""

import argparse
import json
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, check, daemon_get, in_workdir, main, run)  # noqa: E402

JOB = "topo-sim"


def expected(rank):
    """(peer group, replica) of `rank` in 2 replicas x 2 stages x 2 tensor ranks."""
    return "stage%d" % (rank // 4), (rank // 2) % 2


def test_sim(args, workdir):
    with Daemon(args.stragglerd, workdir) as d:
        report_path = os.path.join(workdir, "sim.json")
        res = run([args.sim, "--daemon", d.address, "--job", JOB, "--topology", "2x2x2",
                   "--stage-cost", "1,1.6", "--iterations", "40", "--iteration-ms", "10",
                   "--noise", "0.02", "--seed", "3", "--report", report_path, "--quiet"], 120)
        check(res.returncode == 0, "sim exited %d:\n%s\n%s" % (res.returncode, res.stderr,
                                                                d.log_tail()))
        with open(report_path) as f:
            report = json.load(f)
        check(report["world_size"] == 8, "the sim ran %s ranks, not 2x2x2" % report["world_size"])
        for r in report["ranks"]:
            check(("stage%d" % r["stage"], r["replica"]) == expected(r["rank"]),
                  "sim report rank %d: stage %s replica %s" % (r["rank"], r["stage"],
                                                               r["replica"]))

        workers = daemon_get(d, "/v1/jobs/%s/workers" % JOB)["workers"]
        check(len(workers) == 8, "workers: %s" % workers)
        for w in workers:
            rank = w.get("rank", 0)
            got = (w.get("peerGroup"), w.get("replica"))
            check(got == expected(rank), "REST worker %d: %r, expected %r"
                  % (rank, got, expected(rank)))
        # The stage-1 ranks compute 1.6x as long as stage 0's (--stage-cost).
        ewma = {w.get("rank", 0): w["ewmaComputeSeconds"] for w in workers}
        ratio = (sum(ewma[r] for r in range(4, 8)) / sum(ewma[r] for r in range(4)))
        check(1.4 < ratio < 1.8, "stage 1 / stage 0 compute: %.2f, expected about 1.6" % ratio)

        table = run([args.ctl, "--daemon", d.address, "workers", JOB], 30)
        check(table.returncode == 0, "stragglerctl workers: %s" % table.stderr)
        lines = table.stdout.splitlines()
        header = lines[0].split()
        check("GROUP" in header and "REPLICA" in header and header[-1] == "GPU",
              "workers header: %s" % lines[0])
        gi, ri = header.index("GROUP"), header.index("REPLICA")
        rows = {int(line.split()[0]): line.split() for line in lines[1:]}
        for rank, cells in rows.items():
            # The EXCLUDED column may read "yes (straggler)": count from the end.
            shift = len(cells) - len(header)
            got = (cells[gi + shift], int(cells[ri + shift]))
            check(got == expected(rank), "stragglerctl workers rank %d: %r" % (rank, got))
        one = run([args.ctl, "--daemon", d.address, "worker", JOB, "5"], 30).stdout
        check("peer group" in one and "stage1" in one, "stragglerctl worker 5:\n%s" % one)

        metrics = daemon_get(d, "/metrics")
        for rank in range(8):
            group, replica = expected(rank)
            pattern = (r'^straggler_rank_compute_seconds\{job="%s",rank="%d",node="[^"]*",'
                       r'peer_group="%s",replica="%d"\} ' % (JOB, rank, group, replica))
            check(re.search(pattern, metrics, re.M),
                  "/metrics has no compute sample of rank %d labelled %s/%d" % (rank, group,
                                                                               replica))
        check('straggler_topology_refused_total{reason="invalid_peer_group"} 0' in metrics,
              "a refusal counted for a well-formed topology")

    for flags, needle in ((["--topology", "2x2"], "expected REPLICASxSTAGESxTENSOR"),
                          (["--topology", "2x0x2"], "STAGES '0' is not an integer >= 1"),
                          (["--topology", "2x2x2", "--ranks", "4"], "is 8 ranks, but the job has 4"),
                          (["--stage-cost", "1,2"], "--stage-cost needs --topology"),
                          (["--topology", "1x3x1", "--stage-cost", "1,2"],
                           "--stage-cost has 2 values for 3 stages"),
                          (["--topology", "1x2x1", "--stage-cost", "1,-2"], "'-2' is not a number > 0")):
        res = run([args.sim, "--daemon", "127.0.0.1:1", "--iterations", "1"] + flags, 30)
        check(res.returncode == 2 and needle in res.stderr,
              "sim %s: exit %d, stderr %r (expected 2 naming %r)"
              % (" ".join(flags), res.returncode, res.stderr, needle))


def test_replay(args, workdir):
    csv = os.path.join(workdir, "trace.csv")
    with open(csv, "w") as f:
        f.write("iteration,rank,compute_seconds,peer_group,replica\n")
        for it in range(60):
            for rank in range(4):
                group, replica = "stage%d" % (rank // 2), rank % 2
                f.write("%d,%d,%.3f,%s,%d\n" % (it, rank, 0.16 if group == "stage1" else 0.1,
                                                group, replica))
    out = os.path.join(workdir, "replay.json")
    res = run([args.replay, csv, "--report", out], 60)
    check(res.returncode == 0, "replay exited %d: %s" % (res.returncode, res.stderr))
    with open(out) as f:
        ranks = json.load(f)["ranks"]
    got = [(r["peer_group"], r["replica"]) for r in ranks]
    check(got == [("stage0", 0), ("stage0", 1), ("stage1", 0), ("stage1", 1)],
          "replay report topology: %s" % got)
    with open(csv, "a") as f:
        f.write("60,0,0.1,stage1,0\n")  # rank 0 changes its group
    res = run([args.replay, csv], 60)
    check(res.returncode == 2 and "rank 0 changes its topology" in res.stderr,
          "replay of a changing topology: exit %d, %s" % (res.returncode, res.stderr))


def test(args):
    in_workdir("topology-", lambda w: test_sim(args, w))
    in_workdir("topology-replay-", lambda w: test_replay(args, w))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    for flag in ("--stragglerd", "--sim", "--ctl", "--replay"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    main(lambda: test(args))
