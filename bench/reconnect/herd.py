#!/usr/bin/env python3
"""Reconnect herd (issue 28, item 7): N straggler-agents, each standing for
many ranks, reconnecting to a stragglerd that was killed (SIGKILL) and
restarted on the same address; loopback only. Sites with many ranks reach
the daemon through agents, so the herd is agents. (Direct clients are left
out: the clients of one process share one gRPC connection, so this process
could not stand for many ranks' own connections.)

Setup: stragglerd on 127.0.0.1:PORT (TLS with --tls: a CA and a server
certificate made with openssl), N agents on unix sockets with upstream to it
(TLS: upstream_tls.ca_file), and one trainer process (this one) holding one
straggler.Client per agent, each reporting --ranks-per-agent ranks of one job
every 200 ms.

Per round: once every client sees the daemon (connected, and its agent's
upstream up), the daemon is killed with SIGKILL, left down --down-s seconds
(the backoffs grow to their cap), and started again. Measured from the
moment its ready file exists: the time until every client sees it again
(its agent's upstream up, as the agent tells its trainers), the first, median and
last of them, and the daemon's CPU time over that window and over its first
5 s. One JSON line per round, then a summary line.

    herd.py --stragglerd build/daemon/stragglerd --agent build/agent/straggler-agent \\
            --pythonpath build/python [--agents 32] [--ranks-per-agent 64] [--tls]
            [--rounds 3] [--down-s 10] [--reconnect-max-ms MS]

--reconnect-max-ms sets the agents' reconnect.max_ms (default: the agent's
own default). --down-s: long enough for the agents' backoff to reach its cap.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))
from agent_test import Agent, free_port  # noqa: E402
from harness import Daemon, wait_for  # noqa: E402
from security_test import make_ca, make_cert  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


class Trainers:
    """One straggler.Client per endpoint, each reporting its ranks every
    200 ms from one thread."""

    def __init__(self, straggler, endpoints, ranks_per, job):
        world = len(endpoints) * ranks_per
        self.clients = [
            straggler.Client(endpoint=endpoint, job_id=job, world_size=world,
                             ranks=list(range(i * ranks_per, (i + 1) * ranks_per)))
            for i, endpoint in enumerate(endpoints)]
        self.ranks_per = ranks_per
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        it = 0
        while not self.stop.wait(0.2):
            for i, c in enumerate(self.clients):
                for r in range(i * self.ranks_per, (i + 1) * self.ranks_per):
                    c.report(0, it, 0.1 + 0.001 * (r % 7), rank=r)
            it += 1

    def up(self):
        """Per client: whether it sees the daemon now."""
        out = []
        for c in self.clients:
            s = c.stats()
            out.append(s.connected and not s.upstream_unavailable)
        return out

    def close(self):
        self.stop.set()
        self.thread.join()
        for c in self.clients:
            c.close()


def make_pki(workdir):
    make_ca(workdir, "ca")
    make_cert(workdir, "server", "ca",
              "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    return os.path.join(workdir, "ca.pem"), os.path.join(workdir, "server")


def one_round(daemon, trainers, down_s):
    wait_for("every client to see the daemon", lambda: all(trainers.up()), timeout=60)
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()
    wait_for("every client to see the daemon gone", lambda: not any(trainers.up()), timeout=30)
    time.sleep(down_s)
    daemon.start()  # returns once the ready file exists
    t0 = time.monotonic()
    cpu0 = cpu_seconds(daemon.proc.pid)
    back = [None] * len(trainers.clients)
    while not all(b is not None for b in back):
        now = time.monotonic()
        if now - t0 > 60:
            raise RuntimeError("only %d of %d clients back after 60 s"
                               % (sum(b is not None for b in back), len(back)))
        for i, up in enumerate(trainers.up()):
            if up and back[i] is None:
                back[i] = now - t0
        time.sleep(0.01)
    cpu_back = cpu_seconds(daemon.proc.pid) - cpu0
    time.sleep(max(0.0, 5.0 - (time.monotonic() - t0)))
    cpu_5s = cpu_seconds(daemon.proc.pid) - cpu0
    back.sort()
    return {"first_s": round(back[0], 3), "median_s": round(statistics.median(back), 3),
            "all_back_s": round(back[-1], 3), "daemon_cpu_s_until_all_back": round(cpu_back, 2),
            "daemon_cpu_s_first_5s": round(cpu_5s, 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stragglerd", required=True)
    p.add_argument("--agent", required=True)
    p.add_argument("--pythonpath", required=True)
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--ranks-per-agent", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--down-s", type=float, default=10.0)
    p.add_argument("--tls", action="store_true")
    p.add_argument("--reconnect-max-ms", type=int, default=0)
    a = p.parse_args()
    sys.path.insert(0, a.pythonpath)
    import straggler

    workdir = tempfile.mkdtemp(prefix="straggler-herd-")
    port = free_port()
    ca, server = make_pki(workdir) if a.tls else (None, None)
    extra = []
    if a.tls:
        with open(os.path.join(workdir, "stragglerd.yaml"), "w") as f:
            f.write("tls:\n  cert_file: %s.pem\n  key_file: %s.key\n" % (server, server))
        extra = ["--config", os.path.join(workdir, "stragglerd.yaml")]
    daemon = Daemon(a.stragglerd, workdir, grpc_address="127.0.0.1:%d" % port, extra_args=extra)
    daemon.start()
    agents = []
    trainers = None
    try:
        config = os.path.join(workdir, "agent.yaml")
        with open(config, "w") as f:
            f.write("log_level: warn\n")
            if a.reconnect_max_ms:
                f.write("reconnect:\n  max_ms: %d\n" % a.reconnect_max_ms)
            if a.tls:
                f.write("upstream_tls:\n  ca_file: %s\n" % ca)
        for i in range(a.agents):
            agent = Agent(a.agent, workdir, os.path.join(workdir, "a%d.sock" % i),
                          daemon.address, name="agent%d" % i, extra_args=["--config", config])
            agent.start()
            agents.append(agent)
        trainers = Trainers(straggler, ["unix://" + ag.socket_path for ag in agents],
                            a.ranks_per_agent, "herd")
        rounds = []
        for _ in range(a.rounds):
            r = one_round(daemon, trainers, a.down_s)
            print(json.dumps(r), flush=True)
            rounds.append(r)
        summary = {
            "agents": a.agents, "ranks": a.agents * a.ranks_per_agent, "tls": a.tls,
            "reconnect_max_ms": a.reconnect_max_ms or "default", "down_s": a.down_s,
            "all_back_s_median": statistics.median(r["all_back_s"] for r in rounds),
            "all_back_s_max": max(r["all_back_s"] for r in rounds),
            "daemon_cpu_s_until_all_back_median":
                statistics.median(r["daemon_cpu_s_until_all_back"] for r in rounds),
            "daemon_cpu_s_first_5s_median":
                statistics.median(r["daemon_cpu_s_first_5s"] for r in rounds)}
        print(json.dumps(summary), flush=True)
    finally:
        if trainers is not None:
            trainers.close()
        for agent in agents:
            if agent.proc.poll() is None:
                agent.proc.send_signal(signal.SIGKILL)
                agent.proc.wait()
        daemon.__exit__(None, None, None)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main())
