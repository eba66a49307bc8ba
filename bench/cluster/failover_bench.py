#!/usr/bin/env python3
"""Issue 30's benchmarks of stragglerd replicas on etcd (docs/cluster.md);
numbers for BENCHMARKS.md, never asserted.

1. failover: 3 replicas, one straggler-agent listing all 3, one
   straggler-sim job of 8 ranks through it; the job's owner is killed with
   SIGKILL, then started again (same id) for the next run. Per run: SIGKILL
   -> a new owner in etcd (polled every 20 ms through etcd's JSON gateway)
   and SIGKILL -> the first directive from the new owner (the agent's
   straggler_agent_upstream_connected turning 1, polled every 20 ms; the
   agent counts a stream connected at its first directive). The difference
   is the agent's reconnect backoff (reconnect.initial_ms 100, max_ms 2000,
   +-20 % jitter, its defaults) after the job had an owner again.
2. spread: 30 jobs (straggler-sim, 2 ranks each) through one agent listing
   the 3 replicas; how many jobs each replica owns.
3. ingest: straggler-loadgen against one stragglerd alone and one replica
   of the cluster, alternating, in the same run.

    failover_bench.py --etcd PATH --stragglerd PATH --agent PATH --sim PATH
                      --loadgen PATH [--runs 10] [--loadgen-runs 2]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "cluster"))
from cluster_harness import Etcd, Replica, load_and_steal  # noqa: E402
from harness import Daemon, TestFailure, failures_exit, wait_for  # noqa: E402
from agent_test import Agent  # noqa: E402


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def start_cluster(args, work):
    etcd = Etcd(args.etcd, work)
    etcd.start()
    replicas = [Replica(args.stragglerd, work, etcd, "r%d" % i) for i in (1, 2, 3)]
    for r in replicas:
        r.start()
    sock = os.path.join(work, "agent.sock")
    agent = Agent(args.agent, work, sock, ",".join(r.address for r in replicas))
    agent.start()
    return etcd, replicas, agent, sock


def sim(args, sock, job, ranks, iterations, work):
    return subprocess.Popen(
        [args.sim, "--daemon", "unix://" + sock, "--job", job, "--ranks", str(ranks),
         "--world-size", str(ranks), "--iterations", str(iterations), "--iteration-ms", "20",
         "--noise", "0.05", "--membership-timeout-ms", "500", "--quiet",
         "--report", os.path.join(work, job + ".json")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def failover(args, work):
    etcd, replicas, agent, sock = start_cluster(args, work)
    by_id = {r.rid: r for r in replicas}
    owner_s, directive_s = [], []
    try:
        ttl = etcd.granted_ttl("r1")
        for n in range(args.runs):
            job = "failover-bench-%d" % n
            s = sim(args, sock, job, 8, 100000, work)
            try:
                old = wait_for("job owned", lambda: etcd.owner(job), timeout=30)
                wait_for("the agent's stream up", lambda: agent.job_metric(
                    "straggler_agent_upstream_connected", job=job) == 1, timeout=30)
                time.sleep(1.0)  # the owner's lease renewed at its usual pace
                victim = by_id[old]
                victim.sigkill()
                t0 = time.monotonic()
                wait_for("the agent to see the stream end", lambda: agent.job_metric(
                    "straggler_agent_upstream_connected", job=job) == 0, timeout=10,
                    interval=0.02)
                new = wait_for("a new owner", lambda: (lambda o: o if o and o != old else None)(
                    etcd.owner(job)), timeout=30, interval=0.02)
                t_owner = time.monotonic() - t0
                wait_for("the first directive from the new owner", lambda: agent.job_metric(
                    "straggler_agent_upstream_connected", job=job) == 1, timeout=30,
                    interval=0.02)
                t_directive = time.monotonic() - t0
                owner_s.append(t_owner)
                directive_s.append(t_directive)
                print("run %d: SIGKILL %s -> %s owns the job %.2f s, first directive %.2f s "
                      "(backoff after the take-over %.2f s)"
                      % (n, old, new, t_owner, t_directive, t_directive - t_owner), flush=True)
                # Again, with the same id and address (as a StatefulSet's pod):
                # its lease expired, nothing to wait out.
                victim.grpc_address = victim.address
                victim.start()
            finally:
                s.kill()
                s.wait()
        backoff = [d - o for d, o in zip(directive_s, owner_s)]
        print("failover over %d runs, granted TTL %d s: new owner median %.2f s max %.2f s; "
              "first directive median %.2f s max %.2f s; of it the agent's backoff after the "
              "take-over median %.2f s max %.2f s"
              % (len(owner_s), ttl, median(owner_s), max(owner_s), median(directive_s),
                 max(directive_s), median(backoff), max(backoff)))
    finally:
        agent.kill()
        for r in replicas:
            r.__exit__(None, None, None)
        etcd.remove()


def spread(args, work):
    etcd, replicas, agent, sock = start_cluster(args, work)
    sims = []
    try:
        jobs = ["spread-%02d" % i for i in range(30)]
        for job in jobs:
            sims.append(sim(args, sock, job, 2, 50, work))
        owners = wait_for("30 jobs owned", lambda: (lambda o: o if all(j in o for j in jobs)
                                                    else None)(etcd.owners()), timeout=120)
        count = {r.rid: 0 for r in replicas}
        for j in jobs:
            count[owners[j]] += 1
        print("3 replicas x 30 jobs through one agent: jobs owned %s (most %d)"
              % (", ".join("%s %d" % kv for kv in sorted(count.items())), max(count.values())))
        for s in sims:
            s.wait(timeout=120)
    finally:
        for s in sims:
            if s.poll() is None:
                s.kill()
        agent.kill()
        for r in replicas:
            r.__exit__(None, None, None)
        etcd.remove()


def ingest(args, work):
    config = os.path.join(work, "nolimit.yaml")
    with open(config, "w") as f:
        f.write("limits:\n  stream_reports_per_second: 0\n")
    etcd = Etcd(args.etcd, work)
    etcd.start()
    alone = Daemon(args.stragglerd, work, name="alone", extra_args=["--config", config])
    replica = Daemon(args.stragglerd, work, name="replica",
                     extra_args=["--config", config, "--etcd-endpoints", etcd.endpoint])
    try:
        alone.start()
        replica.start()
        rows = []
        for n in range(args.loadgen_runs):
            row = []
            for label, d in (("alone", alone), ("with etcd", replica)):
                out = os.path.join(work, "loadgen-%s-%d.json" % (label.replace(" ", "_"), n))
                subprocess.run([args.loadgen, "--daemon", d.address, "--daemon-pid",
                                str(d.proc.pid), "--job", "ingest-%d" % n, "--ranks", "1000",
                                "--streams", "8", "--duration", "5", "--quiet", "--json", out],
                               check=True, timeout=120)
                with open(out) as f:
                    step = json.load(f)["steps"][-1]
                row.append("%.2f M/s, p50 %.2f ms, p99 %.2f ms" % (
                    step["accepted_per_s"] / 1e6, step["p50_ms"], step["p99_ms"]))
            rows.append(row)
            print("ingest run %d: alone %s | with etcd %s" % (n + 1, row[0], row[1]), flush=True)
    finally:
        alone.__exit__(None, None, None)
        replica.__exit__(None, None, None)
        etcd.remove()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("etcd", "stragglerd", "agent", "sim", "loadgen"):
        parser.add_argument("--" + name, required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--loadgen-runs", type=int, default=2)
    parser.add_argument("--only", choices=("failover", "spread", "ingest"))
    parser.add_argument("--keep", action="store_true", help="keep the logs (named at the end)")
    args = parser.parse_args()

    def body():
        work = tempfile.mkdtemp(prefix="failover-bench-")
        try:
            print("before: %s" % load_and_steal(), flush=True)
            for name, fn in (("failover", failover), ("spread", spread), ("ingest", ingest)):
                if args.only in (None, name):
                    sub = os.path.join(work, name)
                    os.makedirs(sub)
                    fn(args, sub)
            print("after: %s" % load_and_steal())
        except TestFailure:
            print("workdir kept: %s" % work, file=sys.stderr)
            raise
        if args.keep:
            print("logs in %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)

    return failures_exit(body, "failover_bench")


if __name__ == "__main__":
    sys.exit(main())
