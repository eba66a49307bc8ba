#!/usr/bin/env python3
"""Issue 31 end to end through a real PyTorch DDP job: four rank processes
(torch_cause_rank.py: Gloo, CPU, straggler.torch.monitor(ddp, work=tokens)
and `for batch in mon.loader(DataLoader(...))`) against the real stragglerd
on loopback, under the daemon's default policy (peer).

  --case input: rank 3's dataset sleeps 60 ms per batch from iteration
    SLOW_FROM on, the others' 2 ms (its input wait grows from about 5% of its
    own time to 60%; its own time is then about 2.4x its peers'); compute
    (a 40 ms sleep in backward) is the same everywhere. The daemon flags
    rank 3 a straggler within 10 iterations of SLOW_FROM with likely cause
    input_pipeline (event and REST worker, "input wait ... vs the other
    ranks' median ..."; the rule also needs rank 3's compute below 1.15x its
    peers': the monitor kept the fetch out of compute_seconds), and flags no
    other rank (straggler or mild). `stragglerctl export` carries the input
    wait, and straggler-replay over that trace detects rank 3 with the same
    cause and nobody else. --no-loader runs the same job without
    mon.loader() (must FAIL: rank 3's compute is normal, and nothing else
    reaches the daemon).
  --case work: variable-length batches (8 log-normal sequences, about +-25%
    tokens per step), work= the token count from the attention mask, and
    compute in proportion to the tokens plus a fixed part; rank 3 is 1.3x
    slower per unit of work throughout. The daemon flags rank 3 a straggler
    within 10 iterations of its first judged row and no other rank, and its
    detection event says it judged per unit of work ("... at W units of
    work"). --no-work runs the same job without work= (must FAIL: judged on
    time, the +-25% tokens per step hide the 1.3x rank for the whole run).

Each case is one job of 34 steps of 40-140 ms: 15-20 s on an idle 2-core
machine, most of it torch's start in four processes.
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, check, ctl, main, require_torch, run,  # noqa: E402
                     run_monitored_job)

WORLD = 4
SLOW_RANK = 3
# peer judges nothing in a group's first peer_profile_iterations (10) rows.
FIRST_JUDGED = 10
DETECT_WITHIN = 10
DEADLINE_S = 150
# --case input
INPUT_SLOW_FROM = 14
INPUT_ITERATIONS = 34
# --case work
WORK_ITERATIONS = 34
WORK_FACTOR = 1.3
# The compute (a sleep) of a step of the mean tokens: long against the
# scheduling jitter of 4 ranks on 2 busy cores.
WORK_COMPUTE_MS = 80


def run_job(args, job, rank_args):
    """Runs the 4-rank job; returns (ranks, the daemon's events, what REST
    said of the slow rank while it ran, `stragglerctl export`'s CSV)."""
    with tempfile.TemporaryDirectory(prefix="torch-cause-") as workdir:
        with Daemon(args.stragglerd, workdir) as d:
            ranks, seen, events = run_monitored_job(args, d, workdir, job, "torch_cause_rank.py",
                                                    WORLD, rank_args, DEADLINE_S, SLOW_RANK)
            csv = ctl(args.ctl, d.address, "export", job, "--format", "csv")
            check(d.stop() == 0, "stragglerd did not exit cleanly")
    for r in range(WORLD):
        final = ranks.final[r]["final"]
        check(final["dropped"] == 0 and final["bad_work"] == 0,
              "rank %d: %d reports dropped, %d batches' work invalid"
              % (r, final["dropped"], final["bad_work"]))
    return ranks, events, seen, csv


def transitions(events):
    """(rank, iteration, to, event) of every state change to straggler or mild."""
    return [(int(e.get("rank", 0)), int(e.get("iteration", 0)), e.get("to"), e) for e in events
            if e.get("kind") == "EVENT_KIND_STATE_CHANGE"
            and e.get("to") in ("WORKER_STATE_STRAGGLER", "WORKER_STATE_MILD")]


def check_detected(name, events, onset):
    """Rank SLOW_RANK flagged a straggler within DETECT_WITHIN iterations of
    `onset`, no other rank flagged at all; returns its detection event."""
    flags = transitions(events)
    for r, it, to, e in flags:
        print("%s: rank %d -> %s at iteration %d: %s; likely cause %s: %s" % (
            name, r, to, it, e.get("message"), e.get("evidence", {}).get("likelyCause"),
            e.get("evidence", {}).get("likelyCauseDetail")))
    others = [(r, it, to) for r, it, to, _ in flags if r != SLOW_RANK]
    check(not others, "%s: healthy ranks flagged: %s" % (name, others))
    mine = [(it, e) for r, it, to, e in flags if r == SLOW_RANK and to == "WORKER_STATE_STRAGGLER"]
    check(mine and onset <= mine[0][0] < onset + DETECT_WITHIN,
          "%s: rank %d, slow from iteration %d, was flagged a straggler at %s (expected within "
          "%d iterations)" % (name, SLOW_RANK, onset, [it for it, _ in mine] or "no iteration",
                              DETECT_WITHIN))
    return mine[0][1]


def test_input():
    def rank_args(r):
        extra = ["--case", "input", "--iterations", str(INPUT_ITERATIONS)]
        if args.no_loader:
            extra.append("--no-loader")
        if r == SLOW_RANK:
            extra += ["--slow-from", str(INPUT_SLOW_FROM), "--slow-input-ms", "60"]
        return extra

    ranks, events, seen, csv = run_job(args, "cause-input", rank_args)
    # The premise: the slow rank's fetches were slow, the others' not.
    slow_its = range(INPUT_SLOW_FROM, INPUT_ITERATIONS)
    fetch = {r: sorted(row["fetch"] for row in ranks.lines[r] if row["it"] in slow_its)
             for r in range(WORLD)}
    print("median fetch ms from iteration %d: %s" % (INPUT_SLOW_FROM, {
        r: round(v[len(v) // 2] * 1e3, 1) for r, v in fetch.items()}))
    e = check_detected("input", events, INPUT_SLOW_FROM)
    ev = e.get("evidence", {})
    check(ev.get("likelyCause") == "LIKELY_CAUSE_INPUT_PIPELINE",
          "rank %d's likely cause is %s, expected input pipeline: %s"
          % (SLOW_RANK, ev.get("likelyCause"), ev.get("likelyCauseDetail")))
    check(ev.get("likelyCauseDetail", "").startswith("input wait "),
          "detail does not give the input wait: %r" % ev.get("likelyCauseDetail"))
    causes = {w.get("likelyCause") for w in seen if w.get("state") == "WORKER_STATE_STRAGGLER"}
    print("REST view of rank %d as a straggler: causes %s" % (SLOW_RANK, sorted(causes)))
    check(causes == {"LIKELY_CAUSE_INPUT_PIPELINE"},
          "rank %d as a straggler in REST showed causes %s" % (SLOW_RANK, sorted(causes)))
    check_replayed(csv)


def check_replayed(csv):
    """`stragglerctl export` carries each report's input wait, and
    straggler-replay judges the exported trace as the daemon did: rank 3 is
    detected, its likely cause input_pipeline (the daemon's rule over the
    trace's phases), nobody else is."""
    header = csv.splitlines()[0].split(",")
    check("input_wait_seconds" in header, "export csv: no input wait column: %r" % header)
    with tempfile.TemporaryDirectory(prefix="torch-cause-trace-") as d:
        path = os.path.join(d, "trace.csv")
        with open(path, "w") as f:
            f.write(csv)
        res = run([args.replay, path, "--format", "json"], 60)
    check(res.returncode == 0, "straggler-replay: %s" % res.stderr)
    ranks = {r["rank"]: r for r in json.loads(res.stdout)["ranks"]}
    print("replayed: %s" % {r: (v["detected_at"], v.get("detected_cause")) for r, v in
                            ranks.items() if v["detected_at"]})
    check(ranks[SLOW_RANK]["detected_at"] and
          set(ranks[SLOW_RANK].get("detected_cause", [])) == {"input_pipeline"},
          "the replayed trace: rank %d %r" % (SLOW_RANK, ranks[SLOW_RANK]))
    others = [r for r, v in ranks.items() if r != SLOW_RANK and v["detected_at"]]
    check(not others, "the replayed trace flags ranks %s" % others)


def test_work():
    def rank_args(r):
        extra = ["--case", "work", "--iterations", str(WORK_ITERATIONS),
                 "--compute-ms", str(WORK_COMPUTE_MS)]
        if args.no_work:
            extra.append("--no-work")
        if r == SLOW_RANK:
            extra += ["--slow-from", "0", "--slow-factor", str(WORK_FACTOR)]
        return extra

    ranks, events, _, _ = run_job(args, "cause-work", rank_args)
    # The premise: the tokens vary from step to step as much as the slowdown.
    n = sorted(row["tokens"] for r in range(WORLD) for row in ranks.lines[r])
    print("tokens per step: min %d, median %d, max %d" % (n[0], n[len(n) // 2], n[-1]))
    check(n[-1] > 1.3 * n[len(n) // 2] and n[0] < n[len(n) // 2] / 1.3,
          "the batches' tokens vary too little (%d-%d): the case does not need work" % (n[0],
                                                                                        n[-1]))
    for r in range(WORLD):
        print("rank %d: " % r + " ".join(
            "%d:%.0f/%.1f" % (row["it"], row["tokens"], row["reported"]["compute_seconds"] * 1e3)
            for row in ranks.lines[r] if row["reported"]))
    e = check_detected("work", events, FIRST_JUDGED)
    check("units of work" in e.get("message", ""),
          "the detection of rank %d does not say it was judged per unit of work: %r"
          % (SLOW_RANK, e.get("message")))


def test():
    require_torch()
    if args.case == "input":
        test_input()
    else:
        test_work()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--python", required=True, help="an interpreter that imports torch")
    parser.add_argument("--pythonpath", required=True, help="the build's python/ directory")
    parser.add_argument("--replay", required=True, help="straggler-replay")
    parser.add_argument("--case", choices=["input", "work"], required=True)
    parser.add_argument("--no-work", action="store_true",
                        help="work case without work= (must fail)")
    parser.add_argument("--no-loader", action="store_true",
                        help="input case without mon.loader() (must fail)")
    args = parser.parse_args()
    main(test)
