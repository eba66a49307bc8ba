#!/usr/bin/env python3
"""A hybrid job's exclusion across a daemon restart (docs/hybrid.md,
"A restarted daemon"): the real stragglerd on a state database, 8 ranks
(4 replicas x 2 pipeline stages, rank = replica + 4 * stage), each a Python
straggler.Client with its peer group and replica, reporting compute times
(values, no sleeps: the detection is the daemon's, default policy).

1. Rank 1 (replica 1, stage 0) reports 3x its peers: the daemon excludes
   replica 1 (ranks 1 and 5), culprit rank 1 of group stage0. The clients'
   Membership names it: straggler.ExcludedRank culprit, culprit_group,
   replica (also for rank 5, reason "replica").
2. kill -9; a new daemon on the same database, no client yet: REST shows the
   restored set with its culprit, group and replica for both ranks.
3. Every rank but the culprit comes back and reports (the culprit's process
   is late) until the culprit turns unresponsive, which makes the daemon plan
   again: replica 1 stays out - rank 5 is never readmitted without its
   culprit (before the culprit fields were stored, the restarted daemon saw
   rank 5 as a replica of its own without a culprit and readmitted it until
   rank 1's hello said otherwise).
4. Rank 1 comes back healthy: replica 1 is readmitted, both ranks in one
   version.
--no-db: no state database; the daemon comes back on the same port and the
set, culprit fields included, comes back with the 7 clients' hellos
(known_excluded); the same checks.
--agent PATH: every client talks to one straggler-agent, which relays the
hellos and the membership (with --no-db: the agent's own hello to the
restarted daemon carries the set, culprit fields included).
"""

import argparse
import os
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_test import Agent, free_port  # noqa: E402
from harness import Daemon, check, daemon_get, main, wait_for  # noqa: E402

REPLICAS, STAGES = 4, 2
WORLD = REPLICAS * STAGES
CULPRIT, MATE = 1, 5
JOB = "replica-restart"
RUN = "run-1"
STEP_S = 0.02


def compute(rank, it, slow):
    # A little deterministic noise, the same on every run.
    base = STEP_S * (1.0 + 0.02 * (((rank * 7 + it) % 5) - 2))
    return 3.0 * base if slow and rank == CULPRIT else base


class Ranks:
    """One straggler.Client per rank, reporting one iteration at a time."""

    def __init__(self, straggler, address, ranks):
        self.clients = {r: straggler.Client(
            endpoint=address, job_id=JOB, run_id=RUN, rank=r, world_size=WORLD,
            node="node%d" % r, peer_group="stage%d" % (r // REPLICAS), replica=r % REPLICAS,
            max_send_delay=0.002) for r in ranks}

    def step(self, it, slow=False):
        for r, c in self.clients.items():
            c.report(0, it, compute(r, it, slow))
        time.sleep(STEP_S / 4)

    def membership(self, it, rank=0):
        m = self.clients[rank].membership_for(it, timeout=10.0)
        check(m.ok, "rank %d: no certain membership for iteration %d" % (rank, it))
        return m

    def close(self):
        for c in self.clients.values():
            c.close()


def replica_entries(entries):
    return {e["rank"]: e for e in entries}


def test(args):
    sys.path.insert(0, args.pythonpath)
    import straggler  # noqa: E402 - from the build tree

    with tempfile.TemporaryDirectory(prefix="replica-restart-") as workdir:
        db = os.path.join(workdir, "state.db")
        # The default policy; a silent rank is unresponsive after 1 s (step 3).
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("policy:\n  unresponsive_after_seconds: 1\n")
        # Without a database the daemon comes back on the same port: the
        # clients that stay reconnect and their hellos carry the set.
        # So does the agent's upstream.
        grpc = "127.0.0.1:%d" % free_port() if args.no_db or args.agent else "127.0.0.1:0"
        state = [] if args.no_db else ["--state-db", db]
        agent = None
        endpoint = None  # the clients': the agent's socket with --agent, else the daemon's
        if args.agent:
            sock = os.path.join(workdir, "agent.sock")
            agent = Agent(args.agent, workdir, sock, grpc)
            agent.start()
            endpoint = "unix://" + sock
        try:
            run(straggler, workdir, grpc, state, config, args, endpoint)
        finally:
            if agent is not None:
                agent.kill()


def run(straggler, workdir, grpc, state, config, args, endpoint):
    # 1. Detection and the culprit fields in the clients' Membership.
    it = 0
    with Daemon(args.stragglerd, workdir, name="stragglerd-1", grpc_address=grpc,
                extra_args=state + ["--config", config]) as d:
        ranks = Ranks(straggler, endpoint or d.address, range(WORLD))
        out = None
        while it < 400 and out is None:
            ranks.step(it, slow=it >= 30)
            m = ranks.clients[0].current_membership()
            if m.is_excluded(CULPRIT):
                out = m
            it += 1
        check(out is not None, "replica 1 was not excluded within 400 iterations")
        check([e.rank for e in out.excluded] == [CULPRIT, MATE],
              "excluded %s, expected replica 1's ranks %s" % (out.excluded, [CULPRIT, MATE]))
        e1, e5 = out.excluded
        check((e1.reason, e1.culprit, e1.culprit_group, e1.replica)
              == ("straggler", CULPRIT, "stage0", 1), "rank 1's entry: %r" % e1)
        check((e5.reason, e5.culprit, e5.culprit_group, e5.replica)
              == ("replica", CULPRIT, "stage0", 1), "rank 5's entry: %r" % e5)
        print("v%d excluded %r and %r (detected at iteration %d, slow from 30)"
              % (out.version, e1, e5, it - 1))
        # The version is durable before any client sees it; kill -9.
        d.proc.kill()
        d.proc.wait()
        if args.no_db:
            ranks.clients.pop(CULPRIT).close()  # the culprit's process is late
            kept = ranks
        else:
            ranks.close()

    # 2. Restored with the culprit fields, before any client is back
    # (without a database: from the first hello that comes back).
    with Daemon(args.stragglerd, workdir, name="stragglerd-2", grpc_address=grpc,
                extra_args=state + ["--config", config]) as d:
        if args.no_db:
            wait_for("a hello to bring the set back", lambda: daemon_get(
                d, "/v1/jobs/%s/membership" % JOB).get("excluded"), timeout=60)
        m = daemon_get(d, "/v1/jobs/%s/membership" % JOB)
        got = replica_entries(m.get("excluded", []))
        check(sorted(got) == [CULPRIT, MATE], "restored set %s" % m)
        for r in (CULPRIT, MATE):
            e = got[r]
            check(e.get("culpritRank") == CULPRIT and e.get("culpritPeerGroup") == "stage0"
                  and e.get("replica") == 1,
                  "restored entry of rank %d lost its culprit fields: %s" % (r, e))
        restored = int(m["version"])
        # Before its effective iteration a new client knows nothing else
        # (version 0); the ranks resume there.
        it = max(it, int(m["effectiveIteration"]))

        # 3. Everyone but the culprit reports; replica 1 stays out.
        ranks = kept if args.no_db else Ranks(straggler, endpoint or d.address,
                                              [r for r in range(WORLD) if r != CULPRIT])
        late = None
        try:
            first = it
            # Until the daemon has re-planned without the culprit's hello:
            # the culprit turns unresponsive (1 s of silence), a change of
            # state that makes the daemon plan again; then 30 more steps.
            # Through an agent the culprit's clean close was seen by the
            # agent, which tells the new daemon: finished, also a change.
            gone = ("WORKER_STATE_UNRESPONSIVE", "WORKER_STATE_FINISHED") if args.agent \
                else ("WORKER_STATE_UNRESPONSIVE",)
            for _ in range(3000):
                ranks.step(it)
                it += 1
                if it % 20 == 0 and daemon_get(d, "/v1/jobs/%s/workers/%d" % (JOB, CULPRIT)).get(
                        "state") in gone:
                    break
            culprit_state = daemon_get(d, "/v1/jobs/%s/workers/%d" % (JOB, CULPRIT)).get("state")
            check(culprit_state in gone, "rank 1 never turned %s (%s)"
                  % (" or ".join(gone), culprit_state))
            for _ in range(30):
                ranks.step(it)
                it += 1
            for i in range(first, it - 3):
                m = ranks.membership(i)
                check(m.is_excluded(CULPRIT) == m.is_excluded(MATE),
                      "iteration %d: version %d excludes %s: replica 1's rank %d without "
                      "its culprit %d" % (i, m.version, [e.rank for e in m.excluded], MATE,
                                           CULPRIT))
                check(m.is_excluded(MATE), "iteration %d: version %d readmitted replica 1 "
                      "while its culprit had not reported" % (i, m.version))
            mates = [e for e in ranks.membership(it - 4).excluded if e.rank == MATE]
            check(mates and mates[0].culprit == CULPRIT and mates[0].replica == 1,
                  "rank 5's entry after the restart: %s" % mates)

            # 4. The culprit comes back healthy: the whole replica returns.
            returned = it
            late = Ranks(straggler, endpoint or d.address, [CULPRIT])
            ranks.clients.update(late.clients)
            back = None
            for _ in range(300):
                ranks.step(it)
                it += 1
                m = ranks.clients[0].current_membership()
                if not m.is_excluded(CULPRIT) and not m.is_excluded(MATE):
                    back = m
                    break
            check(back is not None, "replica 1 not readmitted within 300 iterations of its "
                  "culprit's return (%s)" % ranks.clients[0].current_membership())
            while it < back.effective_iteration + 4:  # certain up to the switch
                ranks.step(it)
                it += 1
            for i in range(first, back.effective_iteration + 1):
                m = ranks.membership(i)
                check(m.is_excluded(CULPRIT) == m.is_excluded(MATE),
                      "iteration %d: version %d splits replica 1: %s"
                      % (i, m.version, m.excluded))
            print("restored v%d with the culprit fields; 7 ranks back without the culprit: "
                  "replica 1 kept out (rank 1 %s meanwhile); culprit back at iteration %d: "
                  "replica 1 readmitted in v%d from iteration %d"
                  % (restored, culprit_state, returned, back.version, back.effective_iteration))
        finally:
            ranks.close()
        check(d.stop() == 0, "stragglerd did not exit cleanly")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument("--agent", help="straggler-agent: the clients talk to it")
    parser.add_argument("--no-db", action="store_true",
                        help="no state database: the set comes back with the clients' hellos")
    args = parser.parse_args()
    main(lambda: test(args))
