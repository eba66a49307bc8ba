#!/usr/bin/env python3
"""straggler.torch in a hybrid job (docs/hybrid.md), end to end: 8 real
processes (hybrid_torch_rank.py), 4 replicas x 2 pipeline stages, a real
pipeline (torch.distributed send/recv on Gloo between a replica's stages),
each stage a DDP module over its data-parallel group with
straggler.torch.partial_allreduce_hook, against the real stragglerd.

Replica 1's stage-0 rank is slow for a while; replica 1 is forced out (its
ranks 1 and 5, through the daemon's admin API: `stragglerctl override`),
readmitted, and then the daemon is killed with SIGKILL. Checks:
  * replica 1 leaves both stages' groups at the same iteration and comes back
    to both at the same iteration, where begin_step synchronises every
    member of both groups (parameters and momentum from replica 0);
  * at every iteration the checksum of each stage's parameters and optimizer
    state is identical on every active replica;
  * the excluded replica keeps running its pipeline and steps no optimizer;
  * after the kill no step hangs: every rank finishes every iteration on the
    last applied membership (certain = false).
--slow-rank: no override. Rank 1 really sleeps for its iterations 15-45 and
the daemon's own detection (its default policy) excludes replica 1, naming
rank 1 (group stage0) the culprit, and readmits it once rank 1's shadow
reports show recovery; rank 1's stage pair skips its remaining shadow steps to
the rejoin together. The same checks as above, every iteration; no
wall-clock wait (iterations only), so a loaded machine only slows it down.
--no-daemon: nothing listens at the daemon's address (the rendezvous goes
through torch.distributed's store): every group trains on its full group at
every iteration, with identical checksums on every replica.
Skipped (77) without torch.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import free_port  # noqa: E402
from harness import Daemon, RankProcesses, check, ctl, daemon_get, main  # noqa: E402

REPLICAS, STAGES = 4, 2
WORLD = REPLICAS * STAGES
JOB = "hybrid-torch"
ITERATIONS = 140
DEADLINE_S = 200
REPLICA_RANKS = [1, 5]


RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hybrid_torch_rank.py")


def check_groups(rows, it):
    """Per stage: the active set is who took part, and their checksums agree."""
    for s in range(STAGES):
        members = [m + REPLICAS * s for m in range(REPLICAS)]
        part = [m for m in members if rows[m][it]["participating"]]
        check(part and rows[part[0]][it]["active"] == part,
              "iteration %d stage %d: active %s, took part %s"
              % (it, s, part and rows[part[0]][it]["active"], part))
        sums = {rows[m][it]["checksum"] for m in part}
        check(len(sums) == 1, "iteration %d stage %d: active replicas %s differ: %s"
              % (it, s, part, {m: rows[m][it]["checksum"] for m in part}))


def test_no_daemon(args):
    iterations = 30
    with tempfile.TemporaryDirectory(prefix="hybrid-torch-") as workdir:
        env = dict(os.environ, PYTHONPATH=args.pythonpath, OMP_NUM_THREADS="1")
        address = "127.0.0.1:%d" % free_port()  # nothing listens there
        cmds = [[args.python, RANK_SCRIPT, "--daemon", address, "--job", JOB, "--rank", str(r),
                 "--store", os.path.join(workdir, "torch.store"), "--iterations", str(iterations)]
                for r in range(WORLD)]
        ranks = RankProcesses(cmds, workdir, DEADLINE_S, env=env, err_tail=3000)
        try:
            ranks.finish()
        finally:
            ranks.kill()
    rows = ranks.lines
    for it in range(iterations):
        check_groups(rows, it)
        for r in range(WORLD):
            check(rows[r][it]["participating"] and rows[r][it]["version"] == 0,
                  "rank %d at iteration %d without a daemon: %s" % (r, it, rows[r][it]))
    print("no daemon: %d iterations, both stages' groups full on every rank, checksums identical"
          % iterations)


SLOW = dict(rank=1, ms=80, step_ms=20, start=15, end=45)
SLOW_ITERATIONS = 240


def test_slow_rank(args):
    """Rank 1 really sleeps (4x its 20 ms step at most, less with the
    machine's own overhead) for its iterations 15-45; the daemon's own
    detection (default policy, no override) takes replica 1 out and back."""
    with tempfile.TemporaryDirectory(prefix="hybrid-torch-") as workdir:
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("{}\n")  # the daemon's defaults: detection and exclusion on
        env = dict(os.environ, PYTHONPATH=args.pythonpath, OMP_NUM_THREADS="1")
        store = os.path.join(workdir, "torch.store")
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            cmds = [[args.python, RANK_SCRIPT, "--daemon", d.address, "--job", JOB, "--rank", str(r),
                     "--store", store, "--iterations", str(SLOW_ITERATIONS),
                     "--step-ms", str(SLOW["step_ms"])]
                    + (["--slow-ms", str(SLOW["ms"]), "--slow-from", str(SLOW["start"]),
                        "--slow-to", str(SLOW["end"])] if r == SLOW["rank"] else [])
                    for r in range(WORLD)]
            # No wait but the ranks' end: everything below is counted in
            # iterations, so a loaded machine only makes it slower.
            ranks = RankProcesses(cmds, workdir, DEADLINE_S, env=env, err_tail=3000)
            try:
                ranks.finish()
            finally:
                ranks.kill()
            events = daemon_get(d, "/v1/events", limit=1000).get("events", [])
            check(d.stop() == 0, "stragglerd did not exit cleanly")
        rows = ranks.lines
        out_at, back_at = replica_out_and_back(rows, SLOW_ITERATIONS)
        # The daemon named rank 1, group stage0, as the culprit.
        named = [e["message"] for e in events if e.get("kind") == "EVENT_KIND_MEMBERSHIP"
                 and "replica 1 [1, 5] for rank 1 (group stage0" in e.get("message", "")]
        check(named, "no membership event names rank 1 (group stage0) as replica 1's culprit: %s"
              % [e.get("message") for e in events if e.get("kind") == "EVENT_KIND_MEMBERSHIP"])
        check(SLOW["start"] < out_at, "replica 1 out at %d, before rank 1 was slow" % out_at)
        # The culprit's own iterations: where it learnt it is taken back
        # (its first skipped iteration, or the rejoin itself).
        culprit = rows[SLOW["rank"]]
        learnt = next((row["it"] for row in culprit if row.get("skipped")), back_at)
        # Replica 1's stages skip its lagging shadow steps to the rejoin, and
        # together (stage 0 decides, tells stage 1).
        skipped = {r: {row["it"] for row in rows[r] if row.get("skipped")} for r in REPLICA_RANKS}
        check(skipped[REPLICA_RANKS[0]], "replica 1 never skipped its shadow steps to the rejoin")
        check(skipped[REPLICA_RANKS[0]] == skipped[REPLICA_RANKS[1]],
              "replica 1's two stages skipped different iterations: %s" % skipped)
        print("real slow rank: rank 1 slow for its iterations %d-%d; replica 1 out of both "
              "stages' groups at iteration %d (culprit rank 1, group stage0), back at %d with both "
              "stages resynced; rank 1 learnt of its readmission at its iteration %d (%d after "
              "its slowness ended) and skipped %d shadow iterations; checksums identical on the "
              "active replicas at all %d iterations"
              % (SLOW["start"], SLOW["end"], out_at, back_at, learnt, learnt - SLOW["end"],
                 sum(1 for row in culprit if row.get("skipped")), SLOW_ITERATIONS))


def replica_out_and_back(rows, iterations):
    """Per iteration: one version among the participants, the groups' checks,
    replica 1 in both stages' groups or in neither. Replica 1 out once and
    back once, nobody of it stepping while out, every member of both groups
    synchronised from replica 0 at the rejoin. Returns (out_at, back_at)."""
    for r in range(WORLD):
        check(len(rows[r]) == iterations, "rank %d printed %d iterations" % (r, len(rows[r])))
        check([row["it"] for row in rows[r]] == list(range(iterations)),
              "rank %d printed its iterations out of order" % r)
    changes, prev = [], True
    for it in range(iterations):
        check_groups(rows, it)
        versions = {rows[r][it]["version"] for r in range(WORLD) if rows[r][it]["participating"]}
        check(len(versions) == 1, "iteration %d: the groups applied versions %s" % (it, versions))
        states = {r: r in rows[r][it]["active"] for r in REPLICA_RANKS}
        check(len(set(states.values())) == 1,
              "iteration %d: replica 1 in one stage's group and not the other's: %s" % (it, states))
        now = states[1]
        if now != prev:
            changes.append((it, now))
            prev = now
    check(len(changes) == 2 and not changes[0][1] and changes[1][1],
          "expected replica 1 out once and back once; saw %s" % changes)
    out_at, back_at = changes[0][0], changes[1][0]
    for r in REPLICA_RANKS:
        check(not any(rows[r][it]["stepped"] for it in range(out_at, back_at)),
              "rank %d stepped its optimizer while excluded" % r)
    for r in range(WORLD):
        check(rows[r][back_at]["synced"] and rows[r][back_at]["root"] == REPLICAS * (r // REPLICAS),
              "rank %d at the rejoin %d: %s" % (r, back_at, rows[r][back_at]))
    return out_at, back_at


def test(args):
    res = os.system("%s -c 'import torch' 2>/dev/null" % args.python)
    if res != 0:
        print("SKIPPED: %s cannot import torch: install Debian's python3-torch" % args.python)
        sys.exit(77)
    if args.no_daemon:
        test_no_daemon(args)
        return
    if args.slow_rank:
        test_slow_rank(args)
        return
    rank_script = RANK_SCRIPT
    with tempfile.TemporaryDirectory(prefix="hybrid-torch-") as workdir:
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("policy:\n  exclusion_enabled: false\n")
        env = dict(os.environ, PYTHONPATH=args.pythonpath, OMP_NUM_THREADS="1")
        store = os.path.join(workdir, "torch.store")
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            cmds = [[args.python, rank_script, "--daemon", d.address, "--job", JOB, "--rank", str(r),
                     "--store", store, "--iterations", str(ITERATIONS)]
                    + (["--slow-ms", "40", "--slow-from", "15", "--slow-to", "45"] if r == 1 else [])
                    for r in range(WORLD)]
            ranks = RankProcesses(cmds, workdir, DEADLINE_S, env=env, err_tail=3000)
            try:
                ranks.wait_all_past(20)
                for r in REPLICA_RANKS:
                    ctl(args.ctl, d.address, "override", JOB, str(r), "exclude", "--reason", "test")
                ranks.wait_all_past(55, ranks=[0, 2, 3, 4, 6, 7])
                for r in REPLICA_RANKS:
                    ctl(args.ctl, d.address, "override", JOB, str(r), "none", "--reason", "test")
                # Kill the daemon once replica 1 is back (read from rank 0's
                # iterations, not a clock: two stragglerctl calls on a loaded
                # machine can take as long as 30 iterations, and a daemon
                # killed before the readmission takes effect leaves it out).
                back = 56
                # Bounded: past ITERATIONS - 30 the check below fails at once.
                while back < ITERATIONS - 30:
                    ranks.wait_all_past(back, ranks=[0])
                    if 1 in ranks.lines[0][back]["active"]:
                        break
                    back += 1
                check(back < ITERATIONS - 30, "replica 1 back only at iteration %d of %d: too "
                      "late to kill the daemon with iterations left" % (back, ITERATIONS))
                ranks.wait_all_past(back + 5)
                d.proc.kill()
                d.proc.wait()
                ranks.finish()
            finally:
                ranks.kill()
        rows = ranks.lines
        out_at, back_at = replica_out_and_back(rows, ITERATIONS)
        uncertain = [row["it"] for row in rows[0] if not row["certain"]]
        check(uncertain, "rank 0 never noticed the daemon was gone")
        for r in range(WORLD):
            check(not rows[r][-1]["certain"] and rows[r][-1]["participating"],
                  "rank %d after the kill: %s" % (r, rows[r][-1]))
        print("replica 1 out of both stages' groups at iteration %d, back at %d with both stages "
              "resynced; checksums identical on the active replicas at all %d iterations; "
              "daemon killed, iterations %d..%d ran on the last membership"
              % (out_at, back_at, ITERATIONS, uncertain[0], ITERATIONS - 1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument("--no-daemon", action="store_true")
    parser.add_argument("--slow-rank", action="store_true")
    args = parser.parse_args()
    main(lambda: test(args))
