#!/usr/bin/env python3
"""Cause "host" from a real CPU hog (issue 31, item 3): the real stragglerd,
the real straggler-agent with host telemetry on, and three rank processes
(this file with --rank) reporting through the agent's unix socket, so the
agent learns each rank's process from SO_PEERCRED and reads its run delay
from /proc.

Busy processes and rank 2 are pinned to CPU 0 with taskset, ranks 0 and 1
to CPU 1. Each rank does the same CPU work every step (spins until it used
80 ms of CPU), in its own slot of a fixed 400 ms period (rank 1's slot
half a period after rank 0's, so the two ranks of CPU 1 do not wait for each
other, even on a busy machine). Rank 2 shares its CPU with two busy processes: its compute takes
several times as long and its process waits for the CPU most of it. The
ranks and hogs run at the test's own priority: under `nice`, beside other
users' niced builds, the ranks of CPU 1 were as slow as rank 2.

Asserts: rank 2 is detected a straggler, its detection event's likely cause
is `host`, and the detail names rank 2's own process (its PID) with a run
delay; the worker shows the same cause while it is a straggler, and
`stragglerctl workers` has it in its CAUSE column. --no-hog runs the same
job without the busy processes and asserts the opposite: rank 2 is never
flagged (the same check, inverted, so the pair shows the test tells the two
apart; a crash or a broken setup fails both). Skips (77) on a machine with fewer than 2 CPUs,
and when ranks 0-1 took more than twice their CPU time per step: other load
on the machine then slows them as the hogs slow rank 2.

    host_cause_test.py --stragglerd PATH --agent PATH --ctl PATH --pythonpath DIR [--no-hog]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import Agent, http_get  # noqa: E402
from harness import (Daemon, TestFailure, check, main, print_log_tails, run,  # noqa: E402
                     wait_for)

JOB = "host-cause"
WORLD = 3
HOGGED_RANK = 2
PERIOD_S = 0.4
ITERATIONS = 100
WORK_S = 0.08
# Busy processes beside rank 2. One is not enough: the scheduler lets a
# task that sleeps most of the time run ahead of a busy one when it wakes
# (EEVDF's lag, CFS's sleeper credit), so a rank whose steps are short
# bursts barely waits for a single hog.
HOGS = 2
# Ranks 0-1 slower than this x WORK_S per step: the machine is too busy.
BUSY_FACTOR = 2.0
# --no-hog: rank 2 slower than this x ranks 0-1 is slow by the peer policy's
# own measure (peer_enter_ratio): other load on its CPU, not the test's.
NO_HOG_SLOWER = 1.12
# Before the first report: the agent reads a process twice (its first read
# has no rates) before its sample goes upstream.
WARMUP_S = 2.5


def busy(cpu_seconds):
    """Spins until this thread has used `cpu_seconds` of CPU: the same work
    on every rank, however long the wall clock takes for it."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


def rank_main(args):
    sys.path.insert(0, args.pythonpath)
    import straggler  # noqa: E402
    client = straggler.Client(endpoint="unix://" + args.socket, job_id=JOB, rank=args.rank,
                              world_size=WORLD, node="node-0")
    time.sleep(max(0.0, args.start_at - time.time()))
    offset = PERIOD_S / 2 if args.rank == 1 else 0.0
    took = []
    for it in range(ITERATIONS):
        slot = args.start_at + WARMUP_S + it * PERIOD_S + offset
        time.sleep(max(0.0, slot - time.time()))
        start = time.perf_counter()
        busy(WORK_S)
        took.append(time.perf_counter() - start)
        client.report(0, it, took[-1])
    print("rank %d: compute median %.1f ms" % (args.rank, sorted(took)[len(took) // 2] * 1e3),
          flush=True)
    # Connected until the test has looked at the workers (a closed rank is
    # `finished`, and only a straggler shows a cause).
    deadline = time.time() + 60
    while not os.path.exists(args.hold) and time.time() < deadline:
        time.sleep(0.05)
    client.close()


def events(daemon):
    body = json.loads(http_get(daemon.http_address, "/v1/jobs/%s/events" % JOB))
    return [e for e in body.get("events", []) if e.get("kind") == "EVENT_KIND_STATE_CHANGE"
            and e.get("to") == "WORKER_STATE_STRAGGLER"]


def test(args):
    if len(os.sched_getaffinity(0)) < 2:
        print("SKIPPED: fewer than 2 CPUs to pin the ranks to")
        sys.exit(77)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    work = tempfile.mkdtemp(prefix="host-cause-")
    hogs = []
    ranks = {}
    with Daemon(args.stragglerd, work) as d:
        config = os.path.join(work, "agent.yaml")
        with open(config, "w") as f:
            f.write("telemetry:\n  enabled: false\nhost_telemetry:\n  enabled: true\n"
                    "  interval_ms: 1000\n")
        sock = os.path.join(work, "agent.sock")
        agent = Agent(args.agent, work, sock, d.address, extra_args=["--config", config])
        agent.start()
        try:
            for _ in range(0 if args.no_hog else HOGS):
                hogs.append(subprocess.Popen(["taskset", "-c", str(cpus[0]), sys.executable, "-c",
                                              "while True: pass"]))
            hold = os.path.join(work, "hold")
            start_at = time.time() + 1.0
            for r in range(WORLD):
                cpu = cpus[0] if r == HOGGED_RANK else cpus[1]
                log = open(os.path.join(work, "rank%d.log" % r), "w")
                ranks[r] = subprocess.Popen(
                    ["taskset", "-c", str(cpu), sys.executable, os.path.abspath(__file__),
                     "--rank", str(r), "--socket", sock, "--start-at", repr(start_at),
                     "--hold", hold, "--pythonpath", args.pythonpath],
                    stdout=log, stderr=subprocess.STDOUT)
            def worker(rank):
                return json.loads(http_get(d.http_address, "/v1/jobs/%s/workers/%d"
                                           % (JOB, rank)))

            wait_for("every rank's last report", lambda: all(
                int(worker(r).get("lastIteration", 0)) == ITERATIONS - 1 for r in range(WORLD)),
                timeout=ITERATIONS * PERIOD_S + 60, interval=0.2)
            w = worker(HOGGED_RANK)
            table = run([args.ctl, "--daemon", d.address, "workers", JOB], 30).stdout
            open(hold, "w").close()
            for r, p in ranks.items():
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    raise TestFailure("rank %d did not finish" % r)
                check(p.returncode == 0, "rank %d exited %d" % (r, p.returncode))

            # The premise: CPU 1 is the ranks 0-1's. On a machine whose other
            # load slows them as much as the hogs slow rank 2 (a shared VM
            # under builds: 6x seen), the test measures that load: skip.
            medians = {}
            for r in range(WORLD):
                with open(os.path.join(work, "rank%d.log" % r)) as f:
                    medians[r] = float(f.read().split("compute median ")[1].split()[0])
            for r in (0, 1):
                median_ms = medians[r]
                if median_ms > BUSY_FACTOR * WORK_S * 1e3:
                    print("SKIPPED: rank %d took %.0f ms for %.0f ms of CPU (more than %.1fx): "
                          "the machine is too busy for this test" % (r, median_ms, WORK_S * 1e3,
                                                                       BUSY_FACTOR))
                    sys.exit(77)
            # Without the hogs, the premise is that nothing slows CPU 0 alone:
            # other load there makes rank 2 slow (and the daemon rightly says
            # so, cause host: 127 ms vs 82 ms seen beside two builds).
            quiet = max(medians[0], medians[1])
            if args.no_hog and medians[HOGGED_RANK] > NO_HOG_SLOWER * quiet:
                print("SKIPPED: without a hog rank %d took %.0f ms, ranks 0-1 %.0f ms (more than "
                      "%.2fx): other load slowed CPU %d" % (HOGGED_RANK, medians[HOGGED_RANK],
                                                           quiet, NO_HOG_SLOWER, cpus[0]))
                sys.exit(77)
            flagged = events(d)
            for e in flagged:
                print("detected rank %s at iteration %s: likely cause %s: %s" % (
                    e.get("rank", 0), e.get("iteration"), e["evidence"].get("likelyCause"),
                    e["evidence"].get("likelyCauseDetail")))
            mine = [e for e in flagged if int(e.get("rank", 0)) == HOGGED_RANK]
            if args.no_hog:
                check(not mine, "rank %d was flagged without a busy process beside it"
                      % HOGGED_RANK)
                check(agent.stop() == 0, "agent did not exit 0")
                return
            check(mine, "rank %d (sharing CPU %d with a busy process) was never flagged"
                  % (HOGGED_RANK, cpus[0]))
            ev = mine[0]["evidence"]
            check(ev.get("likelyCause") == "LIKELY_CAUSE_HOST",
                  "rank %d's likely cause is %s, expected host: %s"
                  % (HOGGED_RANK, ev.get("likelyCause"), ev.get("likelyCauseDetail")))
            want = "process %d: run delay " % ranks[HOGGED_RANK].pid
            check(ev.get("likelyCauseDetail", "").startswith(want),
                  "detail does not name rank %d's process %r: %r"
                  % (HOGGED_RANK, want, ev.get("likelyCauseDetail")))
            # Still a straggler at its last report (the hog ran to the end):
            # its worker and stragglerctl's CAUSE column show the cause.
            check(w.get("state") == "WORKER_STATE_STRAGGLER" and
                  w.get("likelyCause") == "LIKELY_CAUSE_HOST", "worker %d: %r" % (HOGGED_RANK, w))
            row = [line.split() for line in table.splitlines()[1:]
                   if line.split() and line.split()[0] == str(HOGGED_RANK)]
            check(row and row[0][2] == "host", "stragglerctl workers:\n%s" % table)
            print("stragglerctl workers:\n%s" % table)
            check(agent.stop() == 0, "agent did not exit 0")
        except TestFailure:
            print_log_tails(work, ["agent.log", "stragglerd.log"] +
                            ["rank%d.log" % r for r in range(WORLD)])
            raise
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
            for p in ranks.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int)
    parser.add_argument("--socket")
    parser.add_argument("--start-at", type=float)
    parser.add_argument("--hold")
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument("--stragglerd")
    parser.add_argument("--agent")
    parser.add_argument("--ctl")
    parser.add_argument("--no-hog", action="store_true")
    parsed = parser.parse_args()
    if parsed.rank is not None:
        rank_main(parsed)
    else:
        main(lambda: test(parsed))
