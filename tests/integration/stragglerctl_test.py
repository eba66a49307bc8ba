#!/usr/bin/env python3
"""stragglerctl against the real stragglerd while a short straggler-sim job runs.

Covers every subcommand in table and JSON form, the admin round trips (a policy
set is what GetJob then shows; a forced exclusion appears in the membership and
the running sim follows it without disagreement), and the error contract:
bad rank -> nonzero exit naming the rank, unknown job -> exit 1 "not found",
unreachable daemon -> exit 3. `export --format csv` of the finished job is a
trace straggler-replay accepts.

With a real straggler-agent: a trainer's STRAGGLER_ENDPOINT naming the agent's
socket is not read (STRAGGLERCTL_DAEMON is), and --daemon pointed at the socket
exits 1 with an UNIMPLEMENTED message that names the endpoint and says it is
not stragglerd (gRPC's own message for it is empty).

    stragglerctl_test.py --stragglerd PATH --sim PATH --ctl PATH --replay PATH --agent PATH
"""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, TestFailure, check, check_memberships_agreed, run,  # noqa: E402
                     run_main, wait_for)
from agent_test import Agent  # noqa: E402

RANKS = 4
CTL_TIMEOUT_S = 15
FORCED_RANK = 2


class Ctl:
    def __init__(self, binary, address):
        self.binary = binary
        self.address = address

    def __call__(self, *args, output="table", expect_rc=0):
        cmd = [self.binary, "--daemon", self.address, "--output", output] + list(args)
        result = run(cmd, CTL_TIMEOUT_S)
        if expect_rc is not None:
            check(result.returncode == expect_rc,
                  "%s exited with %d, expected %d\nstdout:\n%s\nstderr:\n%s"
                  % (" ".join(cmd), result.returncode, expect_rc, result.stdout, result.stderr))
        return result

    def json(self, *args):
        out = self(*args, output="json").stdout
        try:
            return json.loads(out)
        except json.JSONDecodeError as e:
            raise TestFailure("stragglerctl %s: output is not JSON (%s):\n%s"
                              % (" ".join(args), e, out))


def check_event_filters(ctl, job):
    """events --kind/--rank: the daemon filters; the run above made overrides of FORCED_RANK."""
    overrides = ctl.json("events", job, "--kind", "override").get("events", [])
    check(len(overrides) >= 2 and all(e["kind"] == "EVENT_KIND_OVERRIDE" and
                                      e["rank"] == FORCED_RANK for e in overrides),
          "events --kind override: %s" % overrides)
    ranked = ctl.json("events", job, "--rank", str(FORCED_RANK)).get("events", [])
    check(ranked and all(e.get("rank") == FORCED_RANK for e in ranked),
          "events --rank %d: %s" % (FORCED_RANK, ranked))
    both = ctl.json("events", job, "--kind", "override,state_change", "--rank", "0")
    check(all(e.get("rank") == 0 and e["kind"] in ("EVENT_KIND_OVERRIDE",
                                                   "EVENT_KIND_STATE_CHANGE")
              for e in both.get("events", [])), "events --kind .. --rank 0: %s" % both)
    table = ctl("events", job, "--kind", "membership").stdout.splitlines()
    check(len(table) >= 3 and all(line.split()[2] == "membership" for line in table[1:-1]),
          "events --kind membership (table):\n%s" % "\n".join(table))
    ctl("events", job, "--kind", "nonsense", expect_rc=2)


def check_follower(follower):
    """The --follow started before the last override prints it, and exits 0 on SIGINT."""
    try:
        ready, _, _ = select.select([follower.stdout], [], [], 10.0)
        check(ready, "events --follow printed nothing within 10 s of an override")
        line = follower.stdout.readline()
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise TestFailure("events --follow: not one JSON event per line: %r" % line)
        check(event["kind"] == "EVENT_KIND_OVERRIDE" and event["rank"] == 1,
              "events --follow: first event %s, expected the override of rank 1" % event)
        follower.send_signal(signal.SIGINT)
        rc = follower.wait(timeout=5)
        rest = follower.stdout.read()
        check(rc == 0, "events --follow exited with %d after SIGINT: %s" % (rc, follower.stderr.read()))
        check(rest.strip() == "", "events --follow printed more than the new override: %r" % rest)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def check_agent_endpoint(args, workdir, daemon, job):
    """A trainer's environment on an agent node: STRAGGLER_ENDPOINT is the agent's socket."""
    sock = os.path.join(workdir, "agent.sock")
    agent = Agent(args.agent, workdir, sock, daemon.address)
    try:
        agent.start()
        env = dict(os.environ, STRAGGLER_ENDPOINT="unix://" + sock,
                   STRAGGLERCTL_DAEMON=daemon.address)
        res = run([args.ctl, "jobs"], CTL_TIMEOUT_S, env=env)
        check(res.returncode == 0 and job in res.stdout,
              "jobs with STRAGGLER_ENDPOINT=agent socket, STRAGGLERCTL_DAEMON=daemon: rc %d\n%s%s"
              % (res.returncode, res.stdout, res.stderr))
        res = run([args.ctl, "--daemon", "unix://" + sock, "jobs"], CTL_TIMEOUT_S)
        expected = ("stragglerctl: UNIMPLEMENTED: unix://%s is not a stragglerd query/admin "
                    "service" % sock)
        check(res.returncode == 1 and res.stderr.startswith(expected),
              "jobs against the agent's socket: rc %d, stderr %r, expected it to start with %r"
              % (res.returncode, res.stderr, expected))
        helped = run([args.ctl, "--help"], CTL_TIMEOUT_S).stdout
        check("$STRAGGLERCTL_DAEMON" in helped and "default: $STRAGGLER_ENDPOINT" not in helped,
              "--help does not name STRAGGLERCTL_DAEMON as --daemon's default:\n%s" % helped)
    finally:
        agent.kill()


def test(args):
    workdir = tempfile.mkdtemp(prefix="straggler-ctl-it-")
    job = "ctl-it-%d" % os.getpid()
    report_path = os.path.join(workdir, "sim.json")
    with Daemon(args.stragglerd, workdir) as daemon:
        ctl = Ctl(args.ctl, daemon.address)

        # A second daemon on the same gRPC port must refuse to start: with
        # gRPC's default SO_REUSEPORT it started and the kernel split new
        # connections between the two (a test's restarted daemon once took
        # over a port another test's daemon was serving).
        second = run([args.stragglerd, "--grpc-address", daemon.address,
                      "--http-address", "127.0.0.1:0", "--log-level", "warn"], 30)
        said = second.stdout + second.stderr
        check(second.returncode != 0 and "cannot listen on grpc_address" in said,
              "a second stragglerd on %s: exit %d\n%s%s" % (daemon.address, second.returncode,
                                                            second.stdout, second.stderr))

        # Long enough (~12 s) to outlive every command below.
        sim = subprocess.Popen(
            [args.sim, "--daemon", daemon.address, "--job", job, "--ranks", str(RANKS),
             "--iterations", "600", "--iteration-ms", "20", "--noise", "0.05",
             "--seed", "7", "--report", report_path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # jobs: table and JSON list the running job.
            wait_for("job %s in `jobs`" % job,
                     lambda: any(j["jobId"] == job for j in ctl.json("jobs").get("jobs", [])))
            table = ctl("jobs").stdout
            check(table.splitlines()[0].split()[:2] == ["JOB", "WORLD"],
                  "jobs: unexpected header:\n%s" % table)
            check(job in table, "jobs: %s not in table:\n%s" % (job, table))

            # workers / worker: every rank, lowercase states, ms units.
            workers = wait_for("all %d ranks reporting" % RANKS, lambda: (
                lambda w: w if len(w) == RANKS and all(x.get("reportsTotal", "0") != "0" for x in w)
                else None)(ctl.json("workers", job).get("workers", [])))
            check(sorted(w["rank"] for w in workers) == list(range(RANKS)),
                  "workers: ranks %s" % [w["rank"] for w in workers])
            table = ctl("workers", job).stdout
            lines = table.splitlines()
            check(lines[0].split()[0] == "RANK" and len(lines) == RANKS + 1,
                  "workers: expected a header and %d rows:\n%s" % (RANKS, table))
            check(" ms" in table and any(s in table for s in ("healthy", "straggler", "pending")),
                  "workers: no lowercase state or ms unit:\n%s" % table)
            worker = ctl.json("worker", job, "2")
            check(worker["rank"] == 2 and worker["jobId"] == job, "worker: %s" % worker)
            check("rank" in ctl("worker", job, "2").stdout, "worker table")

            # membership / events.
            m = ctl.json("membership", job)
            check(m["jobId"] == job and m["worldSize"] == RANKS, "membership: %s" % m)
            check("effective at iteration" in ctl("membership", job).stdout, "membership table")
            events = ctl.json("events", job)
            check("lastSequence" in events, "events: %s" % events)
            ctl("events", job, "--since-sequence", "0", "--limit", "5")

            # policy: set three fields (a flag per PolicyConfig field, the peer
            # policy's too); GetJob shows them, the rest keep defaults.
            before = ctl.json("job", job)["policy"]
            ctl("policy", job, "--limit", "7", "--threshold-factor", "2.5",
                "--peer-exit-rows", "6", "--exclusion-enabled", "true")
            after = ctl.json("job", job)["policy"]
            check(after["limit"] == 7 and after["thresholdFactor"] == 2.5
                  and after["peerExitRows"] == 6 and after["exclusionEnabled"] is True,
                  "policy not applied: %s" % after)
            check(after["profileIterations"] == before["profileIterations"]
                  and after["cooldownIterations"] == before["cooldownIterations"],
                  "policy: fields not given changed: before %s after %s" % (before, after))
            shown = ctl.json("policy", job)
            check(shown["limit"] == 7, "policy (show): %s" % shown)
            # The table shows every field (made from the message's descriptor,
            # as the flags are): each set field by its name with its value.
            table = ctl("policy", job).stdout
            rows = {l.split()[0]: l.split()[1:] for l in table.splitlines()[1:] if l.split()}
            check(rows.get("limit") == ["7"] and float(rows["threshold_factor"][0]) == 2.5,
                  "policy table: limit/threshold_factor rows:\n%s" % table)
            for field in ("peer_exit_rows", "min_active_replicas", "exclusion_enabled", "kind"):
                check(field in rows, "policy table has no %s row:\n%s" % (field, table))
            ctl("policy", job, "--kind", "nonsense", expect_rc=2)

            # watch: first version printed, exits 0 on SIGINT.
            watcher = subprocess.Popen([args.ctl, "--daemon", daemon.address, "watch", job],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            ready, _, _ = select.select([watcher.stdout], [], [], 10.0)
            if not ready:
                watcher.kill()
                raise TestFailure("watch printed nothing within 10 s")
            first = watcher.stdout.readline()
            check("effective at iteration" in first, "watch: first line %r" % first)
            watcher.send_signal(signal.SIGINT)
            try:
                rc = watcher.wait(timeout=5)
            except subprocess.TimeoutExpired:
                watcher.kill()
                raise TestFailure("watch did not exit within 5 s of SIGINT")
            check(rc == 0, "watch exited with %d after SIGINT: %s" % (rc, watcher.stderr.read()))

            # override: forced exclusion shows in the membership; then cleared.
            res = ctl("override", job, str(FORCED_RANK), "exclude", "--reason", "it",
                      output="json")
            check("withheld" not in res.stderr,
                  "override while every rank streams: a withheld note:\n%s" % res.stderr)
            forced = json.loads(res.stdout)
            check(any(e["rank"] == FORCED_RANK and e["reason"] == "EXCLUSION_REASON_FORCED"
                      for e in forced.get("excluded", [])),
                  "override exclude: rank %d not forced out: %s" % (FORCED_RANK, forced))
            m = ctl.json("membership", job)
            check(any(e["rank"] == FORCED_RANK for e in m.get("excluded", [])),
                  "membership after override: %s" % m)
            check(str(FORCED_RANK) in ctl("membership", job).stdout, "membership table")
            time.sleep(1.0)  # let the sim run a while with rank 2 in shadow mode
            cleared = ctl.json("override", job, str(FORCED_RANK), "none")
            check(not any(e["rank"] == FORCED_RANK and e["reason"] == "EXCLUSION_REASON_FORCED"
                          for e in cleared.get("excluded", [])),
                  "override none: rank %d still forced out: %s" % (FORCED_RANK, cleared))

            # Errors.
            bad = ctl("worker", job, "99", expect_rc=1)
            check("99" in bad.stderr and bad.stderr.startswith("stragglerctl: "),
                  "bad rank: stderr does not name it: %r" % bad.stderr)
            bad = ctl("override", job, "99", "exclude", expect_rc=None)
            check(bad.returncode != 0 and "99" in bad.stderr,
                  "override of rank 99: rc %d stderr %r" % (bad.returncode, bad.stderr))
            missing = ctl("workers", "no-such-job-%d" % os.getpid(), expect_rc=1)
            check("not found" in missing.stderr.lower()
                  and missing.stderr.startswith("stragglerctl: NOT_FOUND: "),
                  "unknown job: %r" % missing.stderr)
        finally:
            try:
                out, err = sim.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                sim.kill()
                out, err = sim.communicate()
                raise TestFailure("straggler-sim did not finish within 60 s:\n%s" % err)
        sys.stdout.write(out)
        check(sim.returncode == 0, "straggler-sim exited with %d:\n%s" % (sim.returncode, err))
        with open(report_path) as f:
            report = json.load(f)
        # The sim followed the forced exclusion and its clearing in agreement.
        check_memberships_agreed(report, "sim under stragglerctl")
        forced_rank = report["ranks"][FORCED_RANK]
        check(len(forced_rank["excluded_at"]) >= 1 and len(forced_rank["readmitted_at"]) >= 1,
              "rank %d was not excluded and readmitted by the override: %s"
              % (FORCED_RANK, forced_rank))

        # export: the job's reports as straggler-replay's CSV, and as JSON.
        csv_path = os.path.join(workdir, "trace.csv")
        ctl("export", job, "--format", "csv", "--output-file", csv_path)
        with open(csv_path) as f:
            lines = f.read().splitlines()
        check(lines and lines[0] == "epoch,iteration,rank,compute_seconds",
              "export csv: header %r" % (lines[:1],))
        rows = [tuple(line.split(",")) for line in lines[1:]]
        keys = [(int(it), int(rank)) for _, it, rank, _ in rows]
        check(len(rows) >= RANKS * 100, "export csv: only %d rows" % len(rows))
        check(keys == sorted(keys) and len(set(keys)) == len(keys),
              "export csv: not sorted by (iteration, rank) without duplicates")
        check({rank for _, rank in keys} == set(range(RANKS)), "export csv: ranks %s"
              % sorted({rank for _, rank in keys}))
        check(all(float(c) > 0 for _, _, _, c in rows), "export csv: a compute_seconds <= 0")
        check(ctl("export", job).stdout.splitlines() == lines,
              "export to stdout differs from --output-file")
        replay_report = os.path.join(workdir, "replay.json")
        replay = run([args.replay, csv_path, "--policy", "dynamic", "--report", replay_report],
                     CTL_TIMEOUT_S * 4)
        check(replay.returncode == 0, "straggler-replay of the exported CSV exited with %d:\n%s"
              % (replay.returncode, replay.stderr))
        with open(replay_report) as f:
            replayed = json.load(f)
        check(len(replayed.get("ranks", [])) == RANKS, "replay report ranks: %s"
              % replayed.get("ranks"))
        since = keys[len(keys) // 2][0]
        page = ctl.json("export", job, "--since-iteration", str(since), "--limit", "3")
        check([(int(r["iteration"]), r["rank"]) for r in page["reports"]]
              == [k for k in keys if k[0] >= since][:3], "export json page: %s" % page)
        check(page["droppedBefore"] == "0", "export json: droppedBefore %s" % page)
        missing = ctl("export", "no-such-job-%d" % os.getpid(), expect_rc=1)
        check(missing.stderr.startswith("stragglerctl: NOT_FOUND: "),
              "export of an unknown job: %r" % missing.stderr)

        # reset, after the job ran: everyone included again.
        job_after = ctl.json("reset", job)
        check(job_after["jobId"] == job, "reset: %s" % job_after)
        check(ctl.json("membership", job).get("excluded", []) == [],
              "membership after reset still excludes ranks")

        check_event_filters(ctl, job)

        # events --follow from the newest sequence: the override below, and
        # nothing older, arrives as one JSON line; SIGINT ends it with 0.
        newest = ctl.json("events", job, "--limit", "10000")["lastSequence"]
        follower = subprocess.Popen(
            [args.ctl, "--daemon", daemon.address, "--output", "json", "events", job, "--follow",
             "--since-sequence", newest, "--kind", "override", "--interval-ms", "100"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        # override after the sim ended: no rank has a stream, so the daemon
        # withholds the change (membership gate) and stragglerctl says so.
        res = ctl("override", job, "1", "exclude", output="json")
        check("membership change is withheld" in res.stderr and "%d of %d ranks" % (RANKS, RANKS)
              in res.stderr, "override of a job without streams: no withheld note:\n%s"
              % res.stderr)
        check(json.loads(res.stdout).get("excluded", []) == [],
              "override of a job without streams changed the membership: %s" % res.stdout)
        check(ctl.json("worker", job, "1").get("override") == "RANK_OVERRIDE_FORCE_EXCLUDE",
              "the withheld override is not on the worker")
        check_follower(follower)

        check_agent_endpoint(args, workdir, daemon, job)

        unreachable = run([args.ctl, "--daemon", "127.0.0.1:1", "--timeout-ms", "2000", "jobs"],
                          CTL_TIMEOUT_S)
        check(unreachable.returncode == 3 and "UNAVAILABLE" in unreachable.stderr,
              "unreachable daemon: rc %d stderr %r" % (unreachable.returncode,
                                                        unreachable.stderr))

        rc = daemon.stop()
        check(rc == 0, "stragglerd exited with %d after SIGTERM:\n%s" % (rc, daemon.log_tail()))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_main(test, "stragglerd", "sim", "ctl", "replay", "agent", description=__doc__.splitlines()[0])
