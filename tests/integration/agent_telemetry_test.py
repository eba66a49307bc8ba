#!/usr/bin/env python3
"""GPU telemetry through straggler-agent, end to end: the real stragglerd, the
real agent loading a stand-in NVML library (tests/nvml/fake_nvml.c, readings
from a state file) through dlopen, and straggler-sim reporting through the
agent (each rank's LOCAL_RANK is its rank, so rank r maps to NVML GPU r).

1. Rank 2 is 4x slow and its GPU is thermally throttled (HW thermal slowdown,
   91 C): GetWorker (REST) of a rank shows its GPU readings, and the
   detection event of rank 2 says likely_cause THERMAL_THROTTLE.
2. The state file turns every GPU healthy; a second job with the same slow
   rank gets likely_cause NONE_VISIBLE (telemetry seen, nothing in it).
3. Both jobs end; with jobs.idle_timeout_ms at 1 s the agent removes them.
4. An agent whose NVML library cannot be loaded (a GPU-less host), with host
   telemetry off, says so in one log line, runs, reports telemetry off in
   /metrics, and a third job's detection carries likely_cause UNSPECIFIED (no
   telemetry).
5. SIGHUP on that agent: a bad config file is rejected and the running one
   kept (the finished job stays under the 10-minute idle timeout); a good
   one with jobs.idle_timeout_ms 200 applies live (the job is removed).
"""

import json
import os
import signal
import tempfile
import time

from agent_test import Agent, http_get, wait_for
from harness import Daemon, TestFailure, check, print_log_tails, run, run_main

GPUS = 4


def state_text(hot_rank=None):
    lines = ["count %d" % GPUS]
    for i in range(GPUS):
        hot = i == hot_rank
        lines += ["%d uuid GPU-%08d-1111-2222-3333-444444444444" % (i, i),
                  "%d sm %d" % (i, 1100 if hot else 1770), "%d max_sm 1980" % i, "%d mem 1593" % i,
                  "%d temp %d" % (i, 91 if hot else 60), "%d power_mw 250000" % i,
                  "%d limit_mw 300000" % i, "%d util_gpu 95" % i, "%d util_mem 40" % i,
                  "%d reasons %s" % (i, "0x40" if hot else "0x0")]
    return "\n".join(lines) + "\n"


def write_state(path, text):
    # rename(): the fake library re-reads the file on every call.
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def run_sim(args, work, endpoint, query, job):
    report = os.path.join(work, job + ".json")
    # Rank 2 computes 4x slower from iteration 20 on; the default policy
    # (peer) flags it within a few iterations.
    r = run([args.sim, "--daemon", endpoint, "--query-daemon", query, "--job", job, "--ranks",
             str(GPUS), "--iterations", "120", "--iteration-ms", "10", "--noise", "0.02",
             "--seed", "3", "--slow", "2:4:20:120", "--membership-timeout-ms", "2000", "--quiet",
             "--report", report], timeout=120)
    check(r.returncode == 0, "sim of job %s exited %d:\n%s\n%s"
          % (job, r.returncode, r.stdout, r.stderr))


def detection(daemon, job, rank):
    body = json.loads(http_get(daemon.http_address, "/v1/jobs/%s/events" % job))
    for e in body.get("events", []):
        if (e.get("kind") == "EVENT_KIND_STATE_CHANGE" and e.get("to") == "WORKER_STATE_STRAGGLER"
                and int(e.get("rank", 0)) == rank):
            return e
    raise TestFailure("no straggler detection of rank %d in job %s: %r" % (rank, job, body))


def worker(daemon, job, rank):
    body = json.loads(http_get(daemon.http_address, "/v1/jobs/%s/workers/%d" % (job, rank)))
    return body.get("worker", body)


def telemetry_phases(args, work, d):
    state = os.path.join(work, "nvml-state")
    write_state(state, state_text(hot_rank=2))
    config = os.path.join(work, "agent.yaml")
    with open(config, "w") as f:
        f.write("telemetry:\n  interval_ms: 100\njobs:\n  idle_timeout_ms: 1000\n")
    env = dict(os.environ, STRAGGLER_NVML_LIBRARY=args.fake_nvml, FAKE_NVML_STATE=state,
               STRAGGLER_AGENT_NODE="node-under-test")
    sock = os.path.join(work, "agent.sock")
    agent = Agent(args.agent, work, sock, d.address, name="agent", extra_args=["--config", config],
                  env=env)
    try:
        agent.start()
        m = agent.metrics()
        check(m.get(("straggler_agent_telemetry_enabled", frozenset())) == 1,
              "agent telemetry not on: %r" % m.get(("straggler_agent_telemetry_enabled",
                                                     frozenset())))
        check(m.get(("straggler_agent_gpus", frozenset())) == GPUS, "agent sees %r GPUs"
              % m.get(("straggler_agent_gpus", frozenset())))
        check(http_get(agent.http, "/readyz").strip() == "ready", "agent /readyz not ready")

        # 1. thermal throttling on the straggler's GPU.
        run_sim(args, work, "unix://" + sock, d.address, "tele-hot")
        w2 = worker(d, "tele-hot", 2)
        gpu = w2.get("gpu")
        check(gpu is not None, "GetWorker of rank 2 has no GPU readings: %r" % w2)
        check(gpu.get("uuid", "").startswith("GPU-00000002"), "rank 2 shows GPU %r" % gpu)
        check(float(gpu.get("temperatureCelsius", 0)) == 91.0, "rank 2 temperature %r" % gpu)
        check(int(gpu.get("clockEventReasons", 0)) == 0x40, "rank 2 reasons %r" % gpu)
        g0 = worker(d, "tele-hot", 0).get("gpu", {})
        check(g0.get("uuid", "").startswith("GPU-00000000") and
              float(g0.get("temperatureCelsius", 0)) == 60.0, "rank 0 shows GPU %r" % g0)
        ev = detection(d, "tele-hot", 2)
        cause = ev.get("evidence", {}).get("likelyCause")
        check(cause == "LIKELY_CAUSE_THERMAL_THROTTLE",
              "hot rank 2 detected with likely cause %r (%r)" % (cause, ev))
        print("thermal: rank 2 detected at iteration %s, cause %s: %s"
              % (ev.get("iteration"), cause, ev["evidence"].get("likelyCauseDetail")))

        # 2. the same slowness with healthy GPUs: nothing visible.
        write_state(state, state_text(hot_rank=None))
        # Not an assertion: the sampler (every 100 ms) has read the new file
        # long before rank 2 is detected (20 healthy steps and more later).
        time.sleep(0.3)
        run_sim(args, work, "unix://" + sock, d.address, "tele-cool")
        check(float(worker(d, "tele-cool", 2)["gpu"].get("temperatureCelsius", 0)) == 60.0,
              "rank 2 still hot after the state file changed")
        cause = detection(d, "tele-cool", 2).get("evidence", {}).get("likelyCause")
        check(cause == "LIKELY_CAUSE_NONE_VISIBLE",
              "healthy-GPU straggler detected with likely cause %r" % cause)
        check(agent.metrics()[("straggler_agent_telemetry_samples_sent_total", frozenset())] > 0,
              "no samples counted as sent")
        print("healthy GPUs: likely cause %s" % cause)

        # 3. idle jobs go away.
        wait_for("the agent to remove both idle jobs", lambda: agent.metrics().get(
            ("straggler_agent_jobs_removed_total", frozenset())) == 2 and agent.metrics().get(
                ("straggler_agent_jobs", frozenset())) == 0)
        check(agent.stop() == 0, "agent did not exit 0")
    finally:
        agent.kill()


def gpu_less_phase(args, work, d):
    env = dict(os.environ, STRAGGLER_NVML_LIBRARY=os.path.join(work, "no-such-libnvidia-ml.so.1"))
    sock = os.path.join(work, "agent-nogpu.sock")
    config = os.path.join(work, "agent-nogpu.yaml")
    with open(config, "w") as f:
        # Host telemetry off too: this phase is the rank with no telemetry at
        # all (a host sample, when it beats the detection, makes the cause
        # none_visible: "nothing in its host telemetry stands out").
        f.write("jobs:\n  idle_timeout_ms: 600000\nhost_telemetry:\n  enabled: false\n")
    agent = Agent(args.agent, work, sock, d.address, name="agent-nogpu", env=env,
                  extra_args=["--config", config])
    try:
        agent.start()
        check(agent.metrics().get(("straggler_agent_telemetry_enabled", frozenset())) == 0,
              "telemetry on without NVML")
        run_sim(args, work, "unix://" + sock, d.address, "tele-none")
        cause = detection(d, "tele-none", 2).get("evidence", {}).get("likelyCause",
                                                                      "LIKELY_CAUSE_UNSPECIFIED")
        check(cause == "LIKELY_CAUSE_UNSPECIFIED", "without telemetry, likely cause %r" % cause)

        # 5. SIGHUP: a bad file keeps the running config, a good one applies.
        def jobs():
            return agent.metrics().get(("straggler_agent_jobs", frozenset()))

        def log_has(text):
            with open(agent.log_path) as f:
                return text in f.read()
        check(jobs() == 1, "the finished job is gone under a 10-minute idle timeout: %r" % jobs())
        with open(config, "w") as f:
            f.write("jobs:\n  idle_timeout_ms: 0\n")
        agent.proc.send_signal(signal.SIGHUP)
        wait_for("the bad config to be rejected", lambda: log_has("config rejected"))
        check("jobs.idle_timeout_ms=0" in open(agent.log_path).read(),
              "the rejection does not name the bad value")
        check(agent.proc.poll() is None, "the agent exited on a bad config")
        check(jobs() == 1, "the job went away after a rejected reload")
        with open(config, "w") as f:
            f.write("jobs:\n  idle_timeout_ms: 200\n")
        agent.proc.send_signal(signal.SIGHUP)
        wait_for("the reloaded idle timeout to remove the job", lambda: jobs() == 0 and
                 agent.metrics().get(("straggler_agent_jobs_removed_total", frozenset())) == 1)
        check(log_has("SIGHUP: config reloaded"), "no reload line in the agent log")
        print("SIGHUP: bad config rejected and kept the old one; jobs.idle_timeout_ms applied live")
        check(agent.stop() == 0, "GPU-less agent did not exit 0")
        with open(agent.log_path) as f:
            lines = [l for l in f if "GPU telemetry off" in l]
        check(len(lines) == 1, "expected one 'GPU telemetry off' line, got %r" % lines)
        print("GPU-less agent: %s" % lines[0].strip())
    finally:
        agent.kill()


def test(args):
    with tempfile.TemporaryDirectory(prefix="agent-telemetry-") as work:
        with Daemon(args.stragglerd, work) as d:
            try:
                telemetry_phases(args, work, d)
                gpu_less_phase(args, work, d)
            except TestFailure:
                print_log_tails(work, ("agent.log", "agent-nogpu.log", "stragglerd.log"))
                raise
            check(d.stop() == 0, "daemon did not exit 0")


if __name__ == "__main__":
    run_main(test, "stragglerd", "agent", "sim", "fake-nvml")
