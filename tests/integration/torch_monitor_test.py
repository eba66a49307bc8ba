#!/usr/bin/env python3
"""Monitoring-only mode, end to end: four real rank processes
(torch_monitor_rank.py: a plain torch DDP job on Gloo, CPU, with
straggler.torch.monitor(ddp) and the client from the environment) against the
real stragglerd on loopback, exclusion off (policy exclusion_enabled: false),
or with --exclusion on the daemon's default (exclusion enabled): the monitor
marks its ranks monitor-only in the hello, so the straggler is still excluded
by nobody (issue 28, item 3; docs/membership.md, "Monitoring only"). That
case also polls the daemon's REST API while the job runs: rank 3 must show
as a straggler, "monitorOnly", never excluded (after the run the ranks have
finished, so only a live look sees the state).

Two cases, one after the other (8 processes at once would be too many for a
small machine):
  * straggler: rank 3 sleeps 60-100 ms more inside its backward from
    iteration SLOW_FROM on. The daemon (`dynamic` policy, pinned in its config) flags rank 3
    a straggler within 10 iterations of SLOW_FROM, flags no other rank, and
    excludes nobody (membership version 0, no membership event). What the
    monitor reported leaves out DDP's all-reduce wait: on ranks 0-2, whose
    backward() waits for rank 3's last bucket, the reported compute is far
    below forward+backward; and forward+backward alone could not tell rank 3
    apart (every rank's is within 1.3x of the others'). The daemon holds
    every rank's report of every iteration, with the values the monitor
    reported.
  * healthy: the same job without the slow rank gets 0 straggler flags.

--timing naive runs the straggler case with the integration this replaces
(report forward+backward time): it must FAIL (rank 3 not flagged), which
shows the test can tell the two apart.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, check, ctl, main, require_torch,  # noqa: E402
                     run_monitored_job)

WORLD = 4
SLOW_RANK = 3
# Epochs of 14 iterations: the daemon's `dynamic` policy profiles the
# fastest rank over the first 5 iterations of each epoch. Epoch 0 holds the
# warm-up (the first steps are 2-3x slower), so the slowdown starts in epoch 1,
# after its profile.
EPOCH_ITERATIONS = 14
SLOW_FROM = 20
ITERATIONS = 34
DETECT_WITHIN = 10
DEADLINE_S = 120


def run_case(args, name, slow_from):
    """Runs one 4-rank job; returns its ranks' rows, the daemon's events,
    membership and accepted reports {(iteration, rank): compute_seconds},
    and what the daemon's REST API said of the slow rank while it ran."""
    job = "monitor-" + name
    with tempfile.TemporaryDirectory(prefix="torch-monitor-") as workdir:
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            # Monitoring only; the epochs above are laid out for dynamic's profile.
            f.write("policy:\n  kind: dynamic\n")
            if args.exclusion == "off":
                f.write("  exclusion_enabled: false\n")
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            ranks, seen, events = run_monitored_job(
                args, d, workdir, job, "torch_monitor_rank.py", WORLD,
                lambda r: ["--iterations", str(ITERATIONS), "--timing", args.timing,
                           "--epoch-iterations", str(EPOCH_ITERATIONS),
                           "--slow-from", str(slow_from if r == SLOW_RANK else -1)],
                DEADLINE_S, SLOW_RANK)
            membership = json.loads(ctl(args.ctl, d.address, "--output", "json", "membership",
                                        job))
            csv = ctl(args.ctl, d.address, "export", job, "--format", "csv").splitlines()
            check(d.stop() == 0, "stragglerd did not exit cleanly")
    reports = {}
    for line in csv[1:]:  # epoch,iteration,rank,compute_seconds
        _, it, rank, compute = line.split(",")
        reports[(int(it), int(rank))] = float(compute)
    return ranks, events, membership, reports, seen


def flagged(events):
    """(rank, iteration) of every transition to straggler."""
    return [(e.get("rank", 0), int(e.get("iteration", 0))) for e in events
            if e.get("kind") == "EVENT_KIND_STATE_CHANGE"
            and e.get("to") == "WORKER_STATE_STRAGGLER"]


def check_common(name, ranks, events, membership, reports):
    memberships = [e for e in events if e.get("kind") == "EVENT_KIND_MEMBERSHIP"]
    check(not memberships and int(membership.get("version", 0)) == 0
          and not membership.get("excluded"),
          "%s: monitoring only, yet the membership changed: version %s, excluded %s, events %s"
          % (name, membership.get("version"), membership.get("excluded"), memberships))
    want = {(it, r) for it in range(ITERATIONS) for r in range(WORLD)}
    check(set(reports) == want, "%s: the daemon holds no report of %s and unexpected %s"
          % (name, sorted(want - set(reports))[:8], sorted(set(reports) - want)[:8]))
    params = [ranks.final[r]["final"]["params"] for r in range(WORLD)]
    check(all(p == params[0] for p in params),
          "%s: the ranks' parameters differ: DDP's all-reduce did not average" % name)
    if args.timing != "monitor":
        return
    for r in range(WORLD):
        final = ranks.final[r]["final"]
        check(final["reported"] == ITERATIONS and final["dropped"] == 0 and final["unmatched"] == 0,
              "%s rank %d: monitor reported %d steps (%d dropped, %d backwards without a step)"
              % (name, r, final["reported"], final["dropped"], final["unmatched"]))
        # What the daemon holds is what the monitor reported (one step late).
        mine = {row["reported"]["iteration"]: row["reported"]["compute_seconds"]
                for row in ranks.lines[r] if row["reported"] is not None}
        mine[final["last"]["iteration"]] = final["last"]["compute_seconds"]
        check(sorted(mine) == list(range(ITERATIONS)),
              "%s rank %d: the monitor reported iterations %s" % (name, r, sorted(mine)))
        for it, compute in mine.items():
            check(abs(reports[(it, r)] - compute) < 1e-9,
                  "%s rank %d iteration %d: reported %.6f, the daemon holds %.6f"
                  % (name, r, it, compute, reports[(it, r)]))


def median_of(rows, key, its):
    return statistics.median(row[key] for row in rows if row["it"] in its)


def check_rest_view(seen):
    """The slow rank as the daemon's REST API showed it during the run: a
    straggler at some point, monitoring only, and never excluded."""
    states = [w.get("state") for w in seen]
    print("REST view of rank %d: %d answers, states %s" % (
        SLOW_RANK, len(seen), sorted(set(states))))
    check(seen, "the daemon's REST API never answered for rank %d" % SLOW_RANK)
    check("WORKER_STATE_STRAGGLER" in states,
          "rank %d never showed as a straggler in REST (states seen: %s)"
          % (SLOW_RANK, sorted(set(states))))
    out = [w for w in seen if w.get("excluded")]
    check(not out, "rank %d showed as excluded %d times, first: %s" % (SLOW_RANK, len(out),
                                                                          out[:1]))
    # Pending: the job exists (another rank's hello made it) but rank 3's own
    # hello, which carries the mark, has not arrived yet.
    unmarked = [w for w in seen
                if not w.get("monitorOnly") and w.get("state") != "WORKER_STATE_PENDING"]
    check(not unmarked, "rank %d showed without monitorOnly %d times, first: %s"
          % (SLOW_RANK, len(unmarked), unmarked[:1]))


def test_straggler():
    ranks, events, membership, reports, seen = run_case(args, "straggler", SLOW_FROM)
    check_common("straggler", ranks, events, membership, reports)
    if args.timing == "monitor":
        check_rest_view(seen)
    flags = flagged(events)
    print("straggler case: flags (rank, iteration) %s" % flags)
    mine = [it for r, it in flags if r == SLOW_RANK]
    check(mine and SLOW_FROM <= mine[0] < SLOW_FROM + DETECT_WITHIN,
          "rank %d, slow from iteration %d, was flagged at %s (expected within %d iterations)"
          % (SLOW_RANK, SLOW_FROM, mine or "no iteration", DETECT_WITHIN))
    others = [(r, it) for r, it in flags if r != SLOW_RANK]
    check(not others, "healthy ranks flagged: %s" % others)
    slow_its = set(range(SLOW_FROM + 1, ITERATIONS))
    naive = {r: median_of(ranks.lines[r], "naive", slow_its) for r in range(WORLD)}
    compute = {r: statistics.median(reports[(it, r)] for it in slow_its) for r in range(WORLD)}
    print("slow phase medians, ms: forward+backward %s; reported compute %s" % (
        {r: round(v * 1e3, 1) for r, v in naive.items()},
        {r: round(v * 1e3, 1) for r, v in compute.items()}))
    # Forward+backward alone cannot tell the straggler apart: everyone waits for it.
    check(max(naive.values()) < 1.3 * min(naive.values()),
          "forward+backward times %s differ by more than 1.3x: the scenario does not need the "
          "monitor" % naive)
    # The fast ranks' reported compute leaves out their wait for rank 3's last
    # bucket (it sleeps at least 60 ms after offering its first one).
    for r in range(WORLD):
        if r != SLOW_RANK:
            check(compute[r] < naive[r] - 0.040,
                  "rank %d: reported compute %.1f ms includes the all-reduce wait "
                  "(forward+backward %.1f ms)" % (r, compute[r] * 1e3, naive[r] * 1e3))
    check(compute[SLOW_RANK] >= 0.060 + min(compute.values()),
          "rank %d slept >= 60 ms more per step but reported %.1f ms (fastest %.1f ms)"
          % (SLOW_RANK, compute[SLOW_RANK] * 1e3, min(compute.values()) * 1e3))


def test_healthy():
    ranks, events, membership, reports, _ = run_case(args, "healthy", -1)
    check_common("healthy", ranks, events, membership, reports)
    flags = flagged(events)
    check(not flags, "healthy job: straggler flags %s" % flags)
    print("healthy case: 0 flags; median compute ms %s" % {
        r: round(statistics.median(reports[(it, r)] for it in range(ITERATIONS)) * 1e3, 1)
        for r in range(WORLD)})


def test():
    require_torch()
    if args.case in ("straggler", "both"):
        test_straggler()
    if args.case in ("healthy", "both"):
        test_healthy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--python", required=True, help="an interpreter that imports torch")
    parser.add_argument("--pythonpath", required=True, help="the build's python/ directory")
    parser.add_argument("--case", choices=["straggler", "healthy", "both"], default="both")
    parser.add_argument("--timing", choices=["monitor", "naive"], default="monitor",
                        help="naive: report forward+backward (the straggler case must fail)")
    parser.add_argument("--exclusion", choices=["off", "on"], default="off",
                        help="on: the daemon's default policy excludes stragglers; the monitor's "
                             "monitor-only mark must keep rank 3 in")
    args = parser.parse_args()
    main(test)
