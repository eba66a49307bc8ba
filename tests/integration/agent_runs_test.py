#!/usr/bin/env python3
"""Runs and job end through the node agent (docs/runs.md, "Through the
agent"): the real stragglerd, the real straggler-agent, straggler-sim
reporting on the agent's unix socket. The direct-to-daemon versions are
runs_test.py's new_run and finished.

Cases (--case):
  finished  An 8-rank sim that excludes its slow rank 3 and closes cleanly:
            the job is `finished`, every worker WORKER_STATE_FINISHED, and
            after twice unresponsive_after_seconds (the agent still running)
            no rank turned unresponsive, no guard_blocked event, the
            membership did not move. A sim killed with SIGKILL still turns
            unresponsive.
  run_id    Two consecutive sims under one job id (each its own random run
            id): the second has nobody flagged or excluded and nothing
            rejected, and the daemon's job is the second run. Then a third
            launch right after the second one is killed: the daemon refuses
            its run while the killed run's stream is open; the agent ends
            that stream once no trainer is left, retries the new run's hello
            and delivers everything it buffered meanwhile.

    agent_runs_test.py --case CASE --stragglerd PATH --agent PATH --sim PATH
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import Agent  # noqa: E402
from harness import (Daemon, TestFailure, check, check_ended_quietly, daemon_get as get,  # noqa: E402
                     daemon_metric as metric, excluded, flagged, main, print_log_tails,
                     run_sim, wait_for)

UNRESPONSIVE_S = 3.0
CONFIG = "policy:\n  unresponsive_after_seconds: %g\n" % UNRESPONSIVE_S


def killed_sim(args, endpoint, daemon, job, run_id, ranks=8):
    """Starts a long sim of run `run_id` through `endpoint`; returns the
    process once the daemon holds reports of that run."""
    cmd = [args.sim, "--daemon", endpoint, "--query-daemon", daemon.address, "--job", job,
           "--ranks", str(ranks), "--iterations", "100000", "--iteration-ms", "20",
           "--membership-timeout-ms", "100", "--quiet", "--run-id", run_id]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for("the sim reporting through the agent",
                 lambda: (lambda j: j.get("runId") == run_id
                          and int(j.get("reportsTotal", 0)) > 10 * ranks)(
                     get(daemon, "/v1/jobs/" + job)), timeout=30)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc


def test_finished(args, work, daemon, agent, endpoint):
    clean, killed = "agent-done-%d" % os.getpid(), "agent-killed-%d" % os.getpid()
    report = run_sim(args.sim, daemon, work, clean, "clean",
                     ["--iterations", "120", "--slow", "3:3:30:120"], endpoint=endpoint)
    check(report["ranks"][3]["excluded_at"], "rank 3 was never excluded")
    # The agent acknowledges the clients at once; the daemon hears of the
    # finish when the agent's buffer reaches it.
    job = wait_for("the job finished through the agent",
                   lambda: (lambda j: j if j.get("finished") is True else None)(
                       get(daemon, "/v1/jobs/" + clean)), timeout=15)
    check(metric(daemon, "straggler_job_running", {"job": clean}) == 0,
          "straggler_job_running is not 0 for the finished job")
    version = job["membership"].get("version")
    time.sleep(UNRESPONSIVE_S * 2 + 2)
    check(agent.proc.poll() is None, "the agent exited")
    check_ended_quietly(daemon, clean, version)
    print("finished through the agent: rank 3 excluded, every rank finished, nothing "
          "unresponsive after %.0f s" % (UNRESPONSIVE_S * 2 + 2))

    # Killed without closing: no finished marker, the ranks go unresponsive.
    proc = killed_sim(args, endpoint, daemon, killed, "killed-run", ranks=4)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for("the killed job's ranks unresponsive",
             lambda: get(daemon, "/v1/jobs/" + killed).get("unresponsiveRanks") == 4,
             timeout=UNRESPONSIVE_S * 4 + 10)
    check(not get(daemon, "/v1/jobs/" + killed).get("finished"), "the killed job is finished")
    check(metric(daemon, "straggler_job_running", {"job": killed}) == 1,
          "straggler_job_running is not 1 for the killed job")


def check_clean_run(report, label, iterations):
    check(flagged(report) == {},
          "%s: ranks flagged or excluded (rank: (detected, excluded)): %s"
          % (label, flagged(report)))
    check(report["reports_rejected"] == 0 and report["reports_dropped"] == 0,
          "%s: %d reports rejected, %d dropped"
          % (label, report["reports_rejected"], report["reports_dropped"]))
    check(report["iterations"] == iterations, "%s did %d of %d iterations"
          % (label, report["iterations"], iterations))
    check(all(not m["excluded"] for m in report["memberships"]),
          "%s applied memberships with exclusions: %s" % (label, report["memberships"]))


def test_run_id(args, work, daemon, agent, endpoint):
    job = "agent-runs-%d" % os.getpid()
    first = run_sim(args.sim, daemon, work, job, "first",
                    ["--iterations", "150", "--slow", "3:3:30:150"], endpoint=endpoint)
    check(first["ranks"][3]["excluded_at"] and not first["ranks"][3]["readmitted_at"],
          "first run: rank 3 should end excluded: %s" % first["ranks"][3])
    wait_for("the first run in the daemon",
             lambda: get(daemon, "/v1/jobs/" + job).get("runId") == first["run_id"], timeout=15)
    second = run_sim(args.sim, daemon, work, job, "second", ["--iterations", "150"],
                     endpoint=endpoint)
    print("runs: first %r, second %r" % (first["run_id"], second["run_id"]))
    check(first["run_id"] and second["run_id"] and first["run_id"] != second["run_id"],
          "each launch should have its own run id: %r, %r" % (first["run_id"], second["run_id"]))
    check_clean_run(second, "second run", 150)
    now = wait_for("the second run's reports in the daemon",
                   lambda: (lambda j: j if int(j.get("reportsTotal", 0)) >= 8 * 150 else None)(
                       get(daemon, "/v1/jobs/" + job)), timeout=15)
    check(now["runId"] == second["run_id"] and excluded(now) == [],
          "current run: %r, excluded %s" % (now.get("runId"), excluded(now)))
    check(first["run_id"] in now.get("earlierRuns", []),
          "earlier_runs %s lacks the first run" % now.get("earlierRuns"))
    then = get(daemon, "/v1/jobs/" + job, run=first["run_id"])
    check(excluded(then) == [3], "first run's last state: excluded %s" % excluded(then))

    # A killed run, then a new one at once: refused while the killed run's
    # stream is open, admitted once the agent ends it; nothing lost.
    proc = killed_sim(args, endpoint, daemon, job, "killed-run")
    refused_before = metric(daemon, "straggler_streams_refused_total", {"reason": "run_live"}) or 0
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    third = run_sim(args.sim, daemon, work, job, "third", ["--iterations", "150"],
                    endpoint=endpoint)
    check_clean_run(third, "run after the killed one", 150)
    now = wait_for("the third run's reports in the daemon",
                   lambda: (lambda j: j if j.get("runId") == third["run_id"]
                            and int(j.get("reportsTotal", 0)) >= 8 * 150 else None)(
                       get(daemon, "/v1/jobs/" + job)), timeout=30)
    check(int(now["reportsTotal"]) == 8 * 150,
          "the daemon holds %s reports of the third run, expected %d"
          % (now["reportsTotal"], 8 * 150))
    refused = (metric(daemon, "straggler_streams_refused_total", {"reason": "run_live"}) or 0) \
        - refused_before
    check(refused >= 1, "the new run was never refused while the killed run's stream was open")
    print("run after a killed run: refused %d times while the killed run's stream was open, "
          "then every report delivered" % refused)


CASES = {"finished": test_finished, "run_id": test_run_id}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--sim", required=True)
    args = parser.parse_args()

    def body():
        with tempfile.TemporaryDirectory(prefix="agent-runs-") as work:
            config = os.path.join(work, "stragglerd.yaml")
            with open(config, "w") as f:
                f.write(CONFIG)
            sock = os.path.join(work, "agent.sock")
            try:
                with Daemon(args.stragglerd, work, extra_args=["--config", config]) as daemon:
                    agent = Agent(args.agent, work, sock, daemon.address)
                    try:
                        agent.start()
                        CASES[args.case](args, work, daemon, agent, "unix://" + sock)
                        check(agent.stop() == 0, "agent did not exit 0 on SIGTERM")
                    finally:
                        agent.kill()
                    check(daemon.stop() == 0, "stragglerd did not exit cleanly")
            except TestFailure:
                print_log_tails(work, ("agent.log", "stragglerd.log"), lines=40)
                raise

    main(body)
