#!/usr/bin/env python3
"""Runs, restarts and job end (docs/runs.md), end to end: the real stragglerd,
straggler-sim and Python trainers (straggler.Client) over real gRPC.

Cases (--case):
  new_run       Two consecutive straggler-sim launches under one job id, the
                first ending with rank 3 excluded: the second trains to the
                end with nobody flagged or excluded and nothing rejected; the
                first run stays readable (GET /v1/jobs/J?run=, events ?run=).
  new_run_live  A hello of another run while the job's run is live is
                refused (straggler_streams_refused_total{reason="run_live"})
                and does not reset the job: the live run goes on to the end
                with its exclusion.
  checkpoint_restart
                A 4-rank Python job excludes its slow rank 3, is killed, and
                restarts (new processes, same run) from iteration 60: its
                reports are accepted (none rejected), rank 3 is back, and a new
                straggler (rank 1) is excluded.
  finished      A job whose clients close cleanly ends `finished`
                (straggler_job_running 0) and no rank turns unresponsive after
                unresponsive_after_seconds; a job killed without closing still
                turns unresponsive.
  finished_clean
                A finished job whose rank 3 was excluded to the end shows
                nobody excluded now (REST, workers, /metrics); its last
                version and events keep the exclusion.
  job_lost      Every rank of a job with rank 3 excluded killed (SIGKILL):
                with limits.job_lost_after_seconds 8 the job is lost (one
                job_lost event, straggler_job_running 0, straggler_job_lost 1,
                nobody excluded) and no guard_blocked event is logged for its
                silent ranks; relaunched in the same run it starts over and
                finishes.

    runs_test.py --case CASE --stragglerd PATH --sim PATH --pythonpath DIR [--keep DIR]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Daemon, check, check_ended_quietly, in_workdir, daemon_get as get, daemon_metric as metric,  # noqa: E402
                     excluded, flagged, main, run, run_sim, wait_for)

SIM_TIMEOUT_S = 120
# Short enough that a test waits for it, long against a loaded 2-core step.
UNRESPONSIVE_S = 3.0
CONFIG = "policy:\n  unresponsive_after_seconds: %g\n" % UNRESPONSIVE_S


def sim(args, daemon, workdir, job, name, extra, check_rc=True):
    return run_sim(args.sim, daemon, workdir, job, name, extra, check_rc=check_rc,
                   timeout=SIM_TIMEOUT_S)


def sim_slow_rank3(args, daemon, workdir, job, name, iterations):
    """A sim run of `iterations` whose rank 3 is 3x slow from iteration 30 to
    the end: it must end with rank 3 excluded. Returns its report."""
    report = sim(args, daemon, workdir, job, name,
                 ["--iterations", str(iterations), "--slow", "3:3:30:%d" % iterations])
    check(report["ranks"][3]["excluded_at"] and not report["ranks"][3]["readmitted_at"],
          "%s: rank 3 should end excluded: %s" % (name, report["ranks"][3]))
    return report


def test_new_run(args, workdir):
    job = "runs-new-%d" % os.getpid()
    with Daemon(args.stragglerd, workdir) as daemon:
        first = sim_slow_rank3(args, daemon, workdir, job, "first", 150)
        second = sim(args, daemon, workdir, job, "second", ["--iterations", "150"])
        print("runs: first %r, second %r" % (first["run_id"], second["run_id"]))
        check(first["run_id"] and second["run_id"] and first["run_id"] != second["run_id"],
              "each launch should have its own run id: %r, %r"
              % (first["run_id"], second["run_id"]))
        check(flagged(second) == {},
              "second run: ranks flagged or excluded (rank: (detected, excluded)): %s"
              % flagged(second))
        check(second["reports_rejected"] == 0 and second["reports_dropped"] == 0,
              "second run: %d reports rejected, %d dropped"
              % (second["reports_rejected"], second["reports_dropped"]))
        check(second["iterations"] == 150, "second run did %d of 150 iterations"
              % second["iterations"])
        check(all(not m["excluded"] for m in second["memberships"]),
              "second run applied memberships with exclusions: %s" % second["memberships"])

        now = get(daemon, "/v1/jobs/" + job)
        check(now["runId"] == second["run_id"] and excluded(now) == [],
              "current run: %s, excluded %s" % (now.get("runId"), excluded(now)))
        check(first["run_id"] in now.get("earlierRuns", []),
              "earlier_runs %s lacks the first run" % now.get("earlierRuns"))
        then = get(daemon, "/v1/jobs/" + job, run=first["run_id"])
        check(then["runId"] == first["run_id"] and excluded(then) == [3],
              "first run's last state: run %r excluded %s" % (then.get("runId"), excluded(then)))
        events = get(daemon, "/v1/jobs/%s/events" % job, run=first["run_id"])["events"]
        check(any(e.get("kind") == "EVENT_KIND_STATE_CHANGE" and e.get("rank") == 3
                  and e.get("to") == "WORKER_STATE_STRAGGLER" for e in events),
              "the first run's events lack rank 3's detection")
        check(all(e.get("runId") == first["run_id"] for e in events),
              "?run= returned events of another run")
        later = get(daemon, "/v1/jobs/%s/events" % job, run=second["run_id"])["events"]
        check(not any(e.get("to") == "WORKER_STATE_STRAGGLER" for e in later),
              "the second run has a straggler event: %s" % later)
        check(daemon.stop() == 0, "stragglerd did not exit cleanly")


def test_new_run_live(args, workdir):
    job = "runs-live-%d" % os.getpid()
    sys.path.insert(0, args.pythonpath)
    import straggler
    with Daemon(args.stragglerd, workdir) as daemon:
        report = os.path.join(workdir, "live.json")
        cmd = [args.sim, "--daemon", daemon.address, "--job", job, "--ranks", "8",
               "--iterations", "400", "--iteration-ms", "20", "--noise", "0.05", "--seed", "7",
               "--slow", "3:3:30:400", "--run-id", "live-run", "--report", report]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for("rank 3 excluded in the live run",
                     lambda: excluded(get(daemon, "/v1/jobs/" + job)) == [3], timeout=60)
            intruder = straggler.Client(endpoint=daemon.address, job_id=job, run_id="other-run",
                                        rank=0, world_size=8, backoff_initial=0.05,
                                        backoff_max=0.2)
            for i in range(5):
                intruder.report(0, i, 0.01)
            wait_for("the other run's hello refused",
                     lambda: (metric(daemon, "straggler_streams_refused_total",
                                     {"reason": "run_live"}) or 0) >= 1, timeout=30)
            now = get(daemon, "/v1/jobs/" + job)
            check(now["runId"] == "live-run" and excluded(now) == [3],
                  "the live job changed: run %r excluded %s" % (now.get("runId"), excluded(now)))
            intruder.close()
            out, err = proc.communicate(timeout=SIM_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        check(proc.returncode == 0, "the live run exited %d: %s" % (proc.returncode, err[-2000:]))
        with open(report) as f:
            live = json.load(f)
        check(live["iterations"] == 400 and live["reports_rejected"] == 0,
              "live run: %d iterations, %d rejected" % (live["iterations"], live["reports_rejected"]))
        check(list(flagged(live)) == [3], "live run flagged %s, expected rank 3 only"
              % flagged(live))
        check(daemon.stop() == 0, "stragglerd did not exit cleanly")


# A 4-rank "trainer" in one process: one straggler.Client per rank, compute
# times made up (rank SLOW 3x from SLOW_FROM), iterations FIRST..LAST.
TRAINER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import straggler
endpoint, job, first, last, slow, slow_from = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8])
clients = [straggler.Client(endpoint=endpoint, job_id=job, run_id="ckpt-run", rank=r,
                            world_size=4) for r in range(4)]
for it in range(first, last):
    for r, c in enumerate(clients):
        c.report(0, it, 0.03 if (r == slow and it >= slow_from) else 0.01)
    time.sleep(0.01)
    for c in clients:
        c.membership_for(it + 1, 2.0)
    print("at", it, flush=True)
for c in clients:
    c.flush(5.0)
stats = [c.stats() for c in clients]
print("STATS", [(s.acked, s.rejected, s.duplicates) for s in stats], flush=True)
for c in clients:
    c.close()
"""


def test_checkpoint_restart(args, workdir):
    job = "runs-ckpt-%d" % os.getpid()
    script = os.path.join(workdir, "trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    with Daemon(args.stragglerd, workdir) as daemon:
        cmd = [sys.executable, script, args.pythonpath, daemon.address, job]
        first = subprocess.Popen(cmd + ["0", "100000", "3", "20"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            wait_for("rank 3 excluded and iteration 90 reached before the crash",
                     lambda: (lambda j: excluded(j) == [3] and int(j.get("highestIteration", 0))
                              >= 90)(get(daemon, "/v1/jobs/" + job)), timeout=60)
        finally:
            first.send_signal(signal.SIGKILL)  # a crash: no clean close
            first.wait()
        # The restart resumes from a checkpoint at iteration 60, below the
        # iterations already reported; rank 1 is the slow one now.
        res = run(cmd + ["60", "260", "1", "120"], SIM_TIMEOUT_S)
        check(res.returncode == 0, "the restarted trainer exited %d:\n%s"
              % (res.returncode, res.stderr[-2000:]))
        stats = eval(res.stdout.split("STATS", 1)[1].strip())
        print("restart (acked, rejected, duplicates) per rank: %s" % stats)
        check(all(s[0] == 200 and s[1] == 0 and s[2] == 0 for s in stats),
              "after the restart not every report was accepted: %s" % stats)
        after = get(daemon, "/v1/jobs/" + job)
        check(excluded(after) == [1], "after the restart excluded %s, expected [1] (rank 3 back, "
              "rank 1 the new straggler)" % excluded(after))
        check(int(after["highestIteration"]) >= 250, "highest iteration %s after the restart"
              % after["highestIteration"])
        check(daemon.stop() == 0, "stragglerd did not exit cleanly")


def test_finished(args, workdir):
    config = os.path.join(workdir, "stragglerd.yaml")
    with open(config, "w") as f:
        f.write(CONFIG)
    clean, killed = "runs-done-%d" % os.getpid(), "runs-killed-%d" % os.getpid()
    with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as daemon:
        report = sim(args, daemon, workdir, clean, "clean",
                     ["--iterations", "120", "--slow", "3:3:30:120"])
        check(report["ranks"][3]["excluded_at"], "rank 3 was never excluded")
        job = get(daemon, "/v1/jobs/" + clean)
        check(job.get("finished") is True, "job not finished after a clean close: %s" % job)
        check(metric(daemon, "straggler_job_running", {"job": clean}) == 0,
              "straggler_job_running is not 0 for the finished job")
        version = job["membership"].get("version")
        time.sleep(UNRESPONSIVE_S * 2 + 2)
        check_ended_quietly(daemon, clean, version)

        # Killed without closing: still unresponsive, still alerting.
        cmd = [args.sim, "--daemon", daemon.address, "--job", killed, "--ranks", "4",
               "--iterations", "100000", "--iteration-ms", "20"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for("the killed job reporting",
                     lambda: int(get(daemon, "/v1/jobs/" + killed).get("reportsTotal", 0)) > 40,
                     timeout=30)
        except Exception:
            proc.kill()
            raise
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_for("the killed job's ranks unresponsive",
                 lambda: get(daemon, "/v1/jobs/" + killed).get("unresponsiveRanks") == 4,
                 timeout=UNRESPONSIVE_S * 4 + 10)
        check(metric(daemon, "straggler_job_running", {"job": killed}) == 1,
              "straggler_job_running is not 1 for the killed job")
        check(daemon.stop() == 0, "stragglerd did not exit cleanly")


def check_no_current_exclusion(daemon, job, world):
    """A job that ended (finished or lost) shows nobody excluded now in REST
    and /metrics, while its last membership version still names rank 3
    (docs/runs.md, "Job end")."""
    state = get(daemon, "/v1/jobs/" + job)
    check(int(state.get("excludedRanks", 0)) == 0 and int(state.get("activeRanks", 0)) == world,
          "the ended job shows excludedRanks %s, activeRanks %s"
          % (state.get("excludedRanks"), state.get("activeRanks")))
    check(excluded(state) == [3], "the last version should still exclude rank 3: %s"
          % excluded(state))
    workers = get(daemon, "/v1/jobs/%s/workers" % job)["workers"]
    out = [w["rank"] for w in workers if w.get("excluded")]
    check(out == [], "workers of the ended job shown excluded: %s" % out)
    for name, labels in (("straggler_job_excluded_ranks", {"job": job}),
                         ("straggler_job_excluded_replicas", {"job": job}),
                         ("straggler_job_running", {"job": job}),
                         ("straggler_rank_excluded", {"job": job, "rank": "3"})):
        value = metric(daemon, name, labels)
        check(value == 0, "%s%s is %s for the ended job, expected 0" % (name, labels, value))
    return state


def test_finished_clean(args, workdir):
    job = "runs-clean-%d" % os.getpid()
    with Daemon(args.stragglerd, workdir) as daemon:
        sim_slow_rank3(args, daemon, workdir, job, "clean", 120)
        state = check_no_current_exclusion(daemon, job, 8)
        check(state.get("finished") is True, "the job did not finish: %s" % state)
        # The history stays: the version that excluded rank 3, in the events.
        events = get(daemon, "/v1/jobs/%s/events" % job)["events"]
        check(any(e.get("kind") == "EVENT_KIND_MEMBERSHIP" and "excluded [3" in e.get("message", "")
                  for e in events), "no membership event excluding rank 3 in the history")
        print("finished_clean: rank 3 excluded until the end; finished job shows excludedRanks 0,"
              " straggler_job_excluded_ranks 0, last version v%s still excludes [3]"
              % state["membership"].get("version"))
        check(daemon.stop() == 0, "stragglerd did not exit cleanly")


# Short bounds so that the test waits for them; the lost bound well above
# the unresponsive one, as the defaults are (30 s, 120 s).
LOST_S = 8.0
LOST_CONFIG = CONFIG + "limits:\n  job_lost_after_seconds: %d\n" % LOST_S


def test_job_lost(args, workdir):
    config = os.path.join(workdir, "stragglerd.yaml")
    with open(config, "w") as f:
        f.write(LOST_CONFIG)
    job = "runs-lost-%d" % os.getpid()
    with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as daemon:
        cmd = [args.sim, "--daemon", daemon.address, "--job", job, "--ranks", "8",
               "--iterations", "100000", "--iteration-ms", "20", "--noise", "0.05",
               "--seed", "7", "--slow", "3:3:30:100000", "--run-id", "lost-run"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for("rank 3 excluded", lambda: excluded(get(daemon, "/v1/jobs/" + job)) == [3],
                     timeout=60)
        finally:
            proc.send_signal(signal.SIGKILL)  # every rank at once: no stream left, no close
            proc.wait()
        wait_for("the killed job's ranks unresponsive",
                 lambda: get(daemon, "/v1/jobs/" + job).get("unresponsiveRanks") == 8,
                 timeout=UNRESPONSIVE_S * 4 + 10)
        state = wait_for("the killed job lost",
                         lambda: (lambda j: j if j.get("lost") is True else None)(
                             get(daemon, "/v1/jobs/" + job)), timeout=LOST_S * 3 + 10)
        check(not state.get("finished"), "the lost job is finished: %s" % state)
        check(metric(daemon, "straggler_job_lost", {"job": job}) == 1,
              "straggler_job_lost is not 1 for the lost job")
        check_no_current_exclusion(daemon, job, 8)
        events = get(daemon, "/v1/jobs/%s/events" % job)["events"]
        lost = [e for e in events if e.get("kind") == "EVENT_KIND_JOB_LOST"]
        guards = [e for e in events if e.get("kind") == "EVENT_KIND_GUARD_BLOCKED"]
        check(len(lost) == 1 and "job_lost_after_seconds=%d" % LOST_S in lost[0].get("message", ""),
              "expected one job_lost event naming the bound: %s" % lost)
        check(not guards, "guard_blocked events for the killed job's silent ranks: %s" % guards)
        check(metric(daemon, "straggler_job_guard_blocks_total", {"job": job}) == 0,
              "straggler_job_guard_blocks_total counts the killed job's silent ranks")
        print("job_lost: killed job lost after %g s: %s" % (LOST_S, lost[0]["message"]))

        # The job relaunched in the same run (new processes): it starts over
        # (docs/runs.md) and runs, then finishes, never lost again.
        again = sim(args, daemon, workdir, job, "again",
                    ["--iterations", "60", "--run-id", "lost-run"])
        check(again["iterations"] == 60 and again["reports_rejected"] == 0,
              "relaunch: %d iterations, %d rejected" % (again["iterations"],
                                                        again["reports_rejected"]))
        state = get(daemon, "/v1/jobs/" + job)
        check(state.get("finished") is True and not state.get("lost"),
              "the relaunched run should end finished, not lost: %s" % state)
        check(metric(daemon, "straggler_job_lost", {"job": job}) == 0,
              "straggler_job_lost is not 0 once the run came back")
        check(daemon.stop() == 0, "stragglerd did not exit cleanly")


CASES = {"new_run": test_new_run, "new_run_live": test_new_run_live,
         "checkpoint_restart": test_checkpoint_restart, "finished": test_finished,
         "finished_clean": test_finished_clean, "job_lost": test_job_lost}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--sim", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    args = parser.parse_args()

    main(lambda: in_workdir("straggler-runs-", lambda workdir: CASES[args.case](args, workdir),
                            keep=args.keep))
