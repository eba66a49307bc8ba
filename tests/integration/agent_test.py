#!/usr/bin/env python3
"""straggler-agent end to end: the real stragglerd, the real agent, two
straggler-sim processes (ranks 0-3 and 4-7 of one job) reporting through the
agent's unix socket.

1. The daemon is killed with SIGKILL mid-run and restarted on the same port.
   The sims never block on Report (they finish, no report dropped or
   rejected), and every report is counted exactly once by the two daemons
   together: per rank, what the old daemon acknowledged (the agent's
   straggler_agent_rank_* metrics, read once the upstream stream is down and
   so final) plus what the restarted daemon holds (its export) is every
   report the agent received, with no iteration in both (an acknowledged
   report replayed would be). A membership published by the restarted
   daemon (a forced exclusion) reaches all 8 ranks through the agent, which
   apply it at its effective iteration.
2. The agent is restarted (SIGTERM, flushes) under a running sim: the client
   reconnects, the sim finishes, and the daemon has every report exactly once.

While the daemon is down the agent tells its clients (upstream_unavailable),
so MembershipFor waits its full timeout once per outage, not every step; the
sims still run with --membership-timeout-ms 100 to keep that one wait short.
"""

import json
import os
import re
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.request

from harness import (Daemon, TestFailure, check, file_tail, finish, print_log_tails, run_main,
                     wait_for)

JOB = "agent-e2e"
WORLD = 8
ITERATIONS = 500


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(address, path):
    with urllib.request.urlopen("http://%s%s" % (address, path), timeout=5) as r:
        return r.read().decode()


def http_put(address, path, body):
    req = urllib.request.Request("http://%s%s" % (address, path), data=json.dumps(body).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read().decode())


class Agent:
    def __init__(self, binary, workdir, socket_path, upstream, name="agent", extra_args=(),
                 env=None):
        self.binary = binary
        self.extra_args = list(extra_args)
        self.env = env  # None: inherit
        self.socket_path = socket_path
        self.upstream = upstream
        self.ready_file = os.path.join(workdir, name + ".ready.json")
        self.log_path = os.path.join(workdir, name + ".log")
        self.proc = None

    def start(self):
        if os.path.exists(self.ready_file):
            os.unlink(self.ready_file)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [self.binary, "--listen", "unix://" + self.socket_path, "--upstream", self.upstream,
             "--http-address", "127.0.0.1:0", "--ready-file", self.ready_file,
             "--log-level", "info"] + self.extra_args, stdout=self.log, stderr=subprocess.STDOUT,
            env=self.env)

        def ready():
            if self.proc.poll() is not None:
                raise TestFailure("straggler-agent exited with %d:\n%s"
                                  % (self.proc.returncode, self.log_tail()))
            with open(self.ready_file) as f:
                return json.load(f)
        r = wait_for("the agent's ready file", ready, timeout=15)
        check(r["pid"] == self.proc.pid, "ready file pid %r != %d" % (r["pid"], self.proc.pid))
        check(r["listen"] == "unix://" + self.socket_path, "ready listen %r" % r["listen"])
        self.http = r["http_address"]

    def metrics(self):
        """{(name, frozenset(labels)): value} of the straggler_agent_* samples."""
        out = {}
        for line in http_get(self.http, "/metrics").splitlines():
            m = re.match(r'^(straggler_agent_\w+)(?:\{(.*)\})? (\S+)$', line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
                out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
        return out

    def job_metric(self, name, job=JOB, **labels):
        key = (name, frozenset(dict(job=job, **{k: str(v) for k, v in labels.items()}).items()))
        return self.metrics().get(key)

    def per_rank(self, name, job=JOB):
        out = {}
        for (n, labels), v in self.metrics().items():
            d = dict(labels)
            if n == name and d.get("job") == job:
                out[int(d["rank"])] = int(v)
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise TestFailure("straggler-agent did not exit within 15 s of SIGTERM:\n%s"
                              % self.log_tail())
        self.log.close()
        return rc

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines=40):
        return file_tail(self.log_path, lines, "(no agent log)")


def sim_cmd(args, endpoint, query, job, first, ranks, world, iterations, report, extra=()):
    return [args.sim, "--daemon", endpoint, "--query-daemon", query, "--job", job,
            "--first-rank", str(first), "--ranks", str(ranks), "--world-size", str(world),
            "--iterations", str(iterations), "--iteration-ms", "20", "--noise", "0.05",
            "--seed", str(7 + first), "--membership-timeout-ms", "100", "--quiet",
            "--report", report] + list(extra)


def export(daemon, job):
    """{rank: [iterations]} the daemon accepted for the job."""
    body = json.loads(http_get(daemon.http_address, "/v1/jobs/%s/reports" % job))
    check(int(body.get("droppedBefore", "0")) == 0, "export ring dropped reports: %r"
          % body.get("droppedBefore"))
    out = {}
    for r in body.get("reports", []):
        out.setdefault(int(r.get("rank", 0)), []).append(int(r["iteration"]))
    return out


def check_sim_report(path, label, iterations):
    with open(path) as f:
        report = json.load(f)
    check(report["iterations"] == iterations,
          "%s finished %d of %d iterations" % (label, report["iterations"], iterations))
    for key in ("reports_dropped", "reports_rejected", "agreement_violations",
                "collective_timeouts"):
        check(report.get(key, 0) == 0, "%s: %s = %r" % (label, key, report.get(key)))
    return report


def daemon_restart_phase(args, work):
    port = free_port()
    address = "127.0.0.1:%d" % port
    sock = os.path.join(work, "run", "straggler", "agent.sock")  # directory made by the agent
    old = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-1")
    new = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-2")
    agent = Agent(args.agent, work, sock, address)
    sims = []
    try:
        old.start()
        agent.start()
        mode = stat.S_IMODE(os.stat(sock).st_mode)
        check(mode == 0o660, "agent socket mode is %o, expected 660" % mode)

        reports = [os.path.join(work, "sim-a.json"), os.path.join(work, "sim-b.json")]
        for first, report in ((0, reports[0]), (4, reports[1])):
            sims.append(subprocess.Popen(
                sim_cmd(args, "unix://" + sock, address, JOB, first, 4, WORLD, ITERATIONS, report),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

        # One upstream stream carries both processes' ranks (a later hello).
        def job_view():
            j = json.loads(http_get(old.http_address, "/v1/jobs/" + JOB))
            return j if int(j.get("reportsTotal", "0")) >= WORLD * 60 else None
        j = wait_for("reports of every rank at the first daemon", job_view)
        check(j["streams"] == 1, "first daemon sees %r streams, expected the agent's 1"
              % j["streams"])
        wait_for("iteration 150", lambda: int(json.loads(http_get(
            old.http_address, "/v1/jobs/" + JOB)).get("highestIteration", "0")) >= 150)

        old.proc.kill()  # SIGKILL: no drain, acknowledgements in flight are lost
        old.proc.wait()
        down_since = time.monotonic()
        received_at_kill = sum(agent.per_rank("straggler_agent_rank_received_reports_total").values())
        wait_for("the agent to notice", lambda: agent.job_metric(
            "straggler_agent_upstream_connected") == 0)
        # Final for the old daemon: no acknowledgement arrives on a dead stream.
        acked_old = agent.per_rank("straggler_agent_rank_acked_reports_total")
        acked_high = agent.per_rank("straggler_agent_rank_acked_iteration")
        check(sorted(acked_old) == list(range(WORLD)),
              "old daemon acknowledged ranks %r" % sorted(acked_old))
        wait_for("reports to pile up in the agent", lambda: agent.job_metric(
            "straggler_agent_buffered_reports") >= WORLD * 5)
        time.sleep(1.0)  # some more downtime: the sims keep running meanwhile
        for s in sims:
            check(s.poll() is None, "a sim ended while the daemon was down")
        # The sims never block on the outage: their steps (20 ms) go on at
        # nearly their own pace. A client that waited its membership timeout
        # (100 ms) at every step would make a fifth of this progress.
        down = time.monotonic() - down_since
        progressed = (sum(agent.per_rank("straggler_agent_rank_received_reports_total").values())
                      - received_at_kill) / WORLD
        nominal = down / 0.020
        print("during %.2f s of daemon downtime each rank stepped %.0f times (%.0f at full pace)"
              % (down, progressed, nominal))
        check(progressed >= 0.4 * nominal,
              "the sims stepped only %.0f times in %.2f s of daemon downtime (%.0f at full pace): "
              "blocked on the outage?" % (progressed, down, nominal))

        new.start()
        wait_for("the agent to reconnect", lambda: agent.job_metric(
            "straggler_agent_upstream_connected") == 1)

        # Publish only once the restarted daemon has caught up (the agent's
        # buffer replayed): ranks that went on after a MembershipFor timeout
        # while it was down may be ahead of what it processed, and a version
        # effective behind them would split the job (issue 5's fallback).
        wait_for("the replay to finish", lambda: agent.job_metric(
            "straggler_agent_buffered_reports") == 0 and sum(agent.per_rank(
                "straggler_agent_rank_acked_reports_total").values()) > sum(acked_old.values()))
        time.sleep(0.5)
        v_new = int(http_put(new.http_address, "/v1/jobs/%s/workers/5/override" % JOB,
                             {"override": "force_exclude", "reason": "after restart"})["version"])

        for s, label in zip(sims, ("sim A", "sim B")):
            finish(s, label, 120)
        sim_reports = [check_sim_report(p, l, ITERATIONS)
                       for p, l in zip(reports, ("sim A", "sim B"))]

        # Directives after the restart reach every rank, applied in step.
        applied = {}
        eff = None
        for rep in sim_reports:
            for m in rep["memberships"]:
                if m["version"] == v_new:
                    eff = m["effective_iteration"]
                    check(any(e["rank"] == 5 for e in m["excluded"]),
                          "v%d does not exclude rank 5: %r" % (v_new, m["excluded"]))
                    applied.update({int(r): it for r, it in m["applied_at"].items()})
        check(sorted(applied) == list(range(WORLD)),
              "v%d (after the restart) was applied by ranks %r, expected all %d"
              % (v_new, sorted(applied), WORLD))
        check(all(it == eff for it in applied.values()),
              "v%d applied at %r, effective at %r" % (v_new, applied, eff))

        wait_for("the agent's buffer to drain", lambda: agent.job_metric(
            "straggler_agent_buffered_reports") == 0)
        check(agent.job_metric("straggler_agent_dropped_reports_total") == 0,
              "the agent dropped reports")
        received = agent.per_rank("straggler_agent_rank_received_reports_total")
        # What the trainers sent (Report() calls their clients took), not
        # only what the agent received: nothing may be lost on the way in.
        sent = {rank["rank"]: rank["reports_queued"] for rep in sim_reports
                for rank in rep["ranks"]}
        check(sorted(sent) == list(range(WORLD)), "sim reports cover ranks %r" % sorted(sent))
        for r in range(WORLD):
            check(received.get(r) == sent[r], "rank %d: the sims sent %d reports, the agent "
                  "received %r" % (r, sent[r], received.get(r)))
        exported = export(new, JOB)
        total_replayed = 0
        for r in range(WORLD):
            its = exported.get(r, [])
            check(len(its) == len(set(its)), "rank %d: the new daemon holds duplicates" % r)
            check(not its or min(its) > acked_high[r],
                  "rank %d: iteration %d was acknowledged by the old daemon (up to %d) and "
                  "counted again by the new one" % (r, min(its), acked_high[r]))
            check(acked_old[r] + len(its) == received[r],
                  "rank %d: old daemon acknowledged %d + new daemon holds %d = %d, but the "
                  "agent received %d reports" % (r, acked_old[r], len(its),
                                                 acked_old[r] + len(its), received[r]))
            total_replayed += len(its)
        check(total_replayed > 0, "nothing reached the restarted daemon")
        print("daemon restart: old daemon acknowledged %d, new daemon %d, of %d reports; "
              "v%d applied by all ranks at %d"
              % (sum(acked_old.values()), total_replayed, sum(received.values()), v_new, eff))
        check(agent.stop() == 0, "agent did not exit 0 on SIGTERM")
        check(not os.path.exists(sock), "the agent left its socket behind")
        check(new.stop() == 0, "restarted daemon did not exit 0")
    finally:
        for s in sims:
            if s.poll() is None:
                s.kill()
        agent.kill()
        old.__exit__(None, None, None)
        new.__exit__(None, None, None)


def agent_restart_phase(args, work):
    job = "agent-restart"
    iterations = 300
    sock = os.path.join(work, "agent2.sock")
    with Daemon(args.stragglerd, work, name="stragglerd-3") as d:
        first = Agent(args.agent, work, sock, d.address, name="agent-a")
        second = Agent(args.agent, work, sock, d.address, name="agent-b")
        sim = None
        try:
            first.start()
            report = os.path.join(work, "sim-restart.json")
            sim = subprocess.Popen(
                sim_cmd(args, "unix://" + sock, d.address, job, 0, 2, 2, iterations, report,
                        extra=["--no-exclusion"]),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for("the sim to report through the first agent", lambda: int(json.loads(
                http_get(d.http_address, "/v1/jobs/" + job)).get("highestIteration", "0")) >= 50)
            check(first.stop() == 0, "first agent did not exit 0 on SIGTERM")
            second.start()
            finish(sim, "the sim (across the agent restart)", 120)
            check_sim_report(report, "sim (agent restart)", iterations)
            check(second.job_metric("straggler_agent_rank_received_reports_total", job=job,
                                    rank=0) is not None,
                  "the client did not reconnect to the second agent")
            wait_for("the second agent's buffer to drain", lambda: second.job_metric(
                "straggler_agent_buffered_reports", job=job) == 0)
            exported = export(d, job)
            for r in range(2):
                check(sorted(exported.get(r, [])) == list(range(iterations)),
                      "rank %d: the daemon holds %d reports, expected iterations 0..%d once"
                      % (r, len(exported.get(r, [])), iterations - 1))
            check(second.stop() == 0, "second agent did not exit 0")
            print("agent restart: the client reconnected, all %d reports reached the daemon once"
                  % (2 * iterations))
        finally:
            if sim is not None and sim.poll() is None:
                sim.kill()
            first.kill()
            second.kill()
        check(d.stop() == 0, "daemon did not exit 0")


def test(args):
    with tempfile.TemporaryDirectory(prefix="agent-test-") as work:
        try:
            daemon_restart_phase(args, work)
            agent_restart_phase(args, work)
        except TestFailure:
            print_log_tails(work, ("agent.log", "stragglerd-1.log", "stragglerd-2.log",
                                   "agent-a.log", "agent-b.log"))
            raise


if __name__ == "__main__":
    run_main(test, "stragglerd", "agent", "sim")
