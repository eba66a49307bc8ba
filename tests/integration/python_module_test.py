#!/usr/bin/env python3
"""The straggler Python module against the real stragglerd, in one process.

  * Two ranks of a 2-rank job run in two Python threads of this process. Each
    rank's begin_iteration / sync_parameters / all_reduce_average can only
    finish once the other rank has entered its own call, so this passes only
    if those calls release the GIL (holding it, the first thread in would wait
    for a peer that cannot run, and fail with CollectiveError after
    collective_timeout). Averages of numpy float32 and torch float64 buffers
    are exact (multiples of 2); sync_parameters overwrites rank 1's buffer
    with rank 0's.
  * Membership callbacks run on the client's thread: a forced exclusion
    (stragglerctl override) reaches both; a callback that raises is reported
    through sys.unraisablehook and the client keeps working.
  * Bad options raise, naming the value; a PartialAllReduce whose Client was
    closed raises instead of touching a destroyed client.
  * store=: with a torch.distributed Store for the rendezvous and no daemon,
    two ranks in two threads average on the full group (the store's
    callbacks take the GIL begin_iteration released), and a rank alone in a
    2-rank job gets a CollectiveError naming the store within
    collective_timeout, not the store's own timeout.
  * report()'s work and phases (issue 31) are taken by the daemon when
    valid and refused naming the value when not.
  * With --agent: a Client behind a straggler-agent whose daemon is
    unreachable shows it in stats().upstream_unavailable (False straight to
    the daemon).
"""

import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, TestFailure, check, main, run  # noqa: E402

JOB = "python-module"
ITERATIONS = 6


def rank_loop(client, reducer, rank, out, errors):
    import numpy as np
    import torch
    try:
        params = np.full(4, 100.0 * (rank + 1), dtype=np.float32)
        for it in range(ITERATIONS):
            plan = reducer.begin_iteration(it)
            if not plan.certain:
                raise RuntimeError("iteration %d: membership not certain" % it)
            if plan.rejoin_iteration is not None:  # only for an excluded rank
                raise RuntimeError("iteration %d: rejoin_iteration %r for a participating rank"
                                   % (it, plan.rejoin_iteration))
            client.report(0, it, 0.01)  # what makes the next iteration's membership certain
            synced = reducer.sync_parameters([params]) if plan.sync_parameters else False
            g32 = np.full(3, 2.0 * (rank + 1) + it, dtype=np.float32)
            g64 = torch.full((2, 2), 4.0 * (rank + 1) + it, dtype=torch.float64)
            r32 = reducer.all_reduce_average(g32)
            r64 = reducer.all_reduce_average(g64)
            out.append((it, plan.version, synced, r32, r64, g32.tolist(),
                        g64.reshape(-1).tolist(), params.tolist()))
    except Exception as e:  # noqa: BLE001 - reported by the main thread
        errors.append("rank %d: %s: %s" % (rank, type(e).__name__, e))


def test(args):
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIPPED: %s cannot import numpy/torch (%s)" % (sys.executable, e))
        sys.exit(77)
    sys.path.insert(0, args.pythonpath)
    import straggler

    for kwargs, needle, kind in [
            (dict(job_id="j", world_size=2), "ranks is empty", ValueError),
            (dict(job_id="j", rank=0, world_size=2, bogus=1), "unknown option 'bogus'", TypeError),
            (dict(job_id="j", rank=0, world_size=2, max_send_delay=-1.0), "max_send_delay=-1", ValueError)]:
        try:
            straggler.Client(**kwargs)
            raise TestFailure("Client(%s) was accepted" % kwargs)
        except kind as e:
            check(needle in str(e), "Client(%s) raised %r, not naming '%s'" % (kwargs, str(e), needle))

    # Through the node agent (unix://) the rendezvous needs the daemon named:
    # refused with what to set, then taken from STRAGGLER_RENDEZVOUS_ENDPOINT.
    os.environ.pop("STRAGGLER_RENDEZVOUS_ENDPOINT", None)
    via_agent = straggler.Client(endpoint="unix:///nonexistent/agent.sock", job_id="j", rank=0,
                                 world_size=2)
    try:
        straggler.PartialAllReduce(via_agent)
        raise TestFailure("a PartialAllReduce through the agent without a rendezvous endpoint "
                          "was accepted")
    except ValueError as e:
        check("STRAGGLER_RENDEZVOUS_ENDPOINT" in str(e), "no hint in %r" % str(e))
    os.environ["STRAGGLER_RENDEZVOUS_ENDPOINT"] = "127.0.0.1:1"
    try:
        straggler.PartialAllReduce(via_agent, collective_timeout=1.0)
        # agreement_interval is passed through and checked (0 would never switch).
        try:
            straggler.PartialAllReduce(via_agent, agreement_interval=0)
            raise TestFailure("agreement_interval=0 was accepted")
        except ValueError as e:
            check("agreement_interval=0" in str(e), "the error does not name the value: %r" % str(e))
        straggler.PartialAllReduce(via_agent, agreement_interval=8)
    finally:
        del os.environ["STRAGGLER_RENDEZVOUS_ENDPOINT"]
        via_agent.close()

    check_own_store(straggler)

    unraisable = []
    sys.unraisablehook = lambda u: unraisable.append(str(u.exc_value))

    with tempfile.TemporaryDirectory(prefix="python-module-") as workdir:
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("policy:\n  exclusion_enabled: false\n")
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            clients = [straggler.Client(endpoint=d.address, job_id=JOB, rank=r, world_size=2,
                                        node="node%d" % r) for r in range(2)]
            seen = {0: [], 1: []}
            # Registered first: callbacks run in registration order, so once
            # rank 0's event is set the raising one has run.
            def bad_callback(m):
                raise RuntimeError("callback failure for version %d" % m.version)
            clients[0].on_membership_change(bad_callback)
            changed = {0: threading.Event(), 1: threading.Event()}
            for r, c in enumerate(clients):
                c.on_membership_change(lambda m, r=r: (seen[r].append(m.version),
                                                        changed[r].set()))

            reducers = [straggler.PartialAllReduce(c, collective_timeout=20.0,
                                                   membership_timeout=10.0) for c in clients]
            outs, errors = {0: [], 1: []}, []
            threads = [threading.Thread(target=rank_loop,
                                        args=(clients[r], reducers[r], r, outs[r], errors))
                       for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            check(not errors, "the two ranks in two threads failed: %s" % errors)
            for r in range(2):
                check(len(outs[r]) == ITERATIONS, "rank %d ran %d iterations" % (r, len(outs[r])))
                for it, version, synced, r32, r64, g32, g64, params in outs[r]:
                    check(r32["participated"] and r64["active_ranks"] == 2,
                          "iteration %d rank %d: result %s %s" % (it, r, r32, r64))
                    check(g32 == [3.0 + it] * 3 and g64 == [6.0 + it] * 4,
                          "iteration %d rank %d: averages %s %s, expected %s and %s"
                          % (it, r, g32, g64, 3.0 + it, 6.0 + it))
                    check(params == [100.0] * 4,
                          "iteration %d rank %d: parameters %s, rank 0's are 100" % (it, r, params))
                check(outs[r][0][2], "rank %d did not broadcast at iteration 0" % r)

            for c in clients:
                check(c.flush(10.0), "flush did not complete: %s" % c.stats().last_rejection)
                st = c.stats()
                check(isinstance(st.report_wakes, int) and st.report_wakes <= st.enqueued,
                      "report_wakes %r of %d reports" % (st.report_wakes, st.enqueued))
                check(repr(st).startswith("ClientStats(enqueued=%d, dropped=%d, " % (
                          st.enqueued, st.dropped)) and ", connected=True, " in repr(st)
                      and repr(st).endswith(", last_rejection=%r)" % st.last_rejection),
                      "repr(ClientStats) does not list its fields: %r" % st)
            res = run([args.ctl, "--daemon", d.address, "override", JOB, "1", "exclude",
                       "--reason", "test"], timeout=30)
            check(res.returncode == 0, "stragglerctl override failed: %s" % res.stderr)
            for r in range(2):
                check(changed[r].wait(30), "rank %d's membership callback never ran" % r)
            m = clients[0].current_membership()
            check(m.version >= 1 and m.is_excluded(1) and m.active_ranks == [0],
                  "rank 0's membership after the override: %r" % m)
            check(clients[0].stats().connected, "rank 0's client lost its stream")
            check(seen[0] == [m.version], "rank 0's callback saw %s, not [%d]" % (seen[0], m.version))
            check(any("callback failure for version" in u for u in unraisable),
                  "the raising callback was not reported as unraisable: %s" % unraisable)

            # Readmission: rank 1 (excluded from m.effective_iteration on) learns
            # where it rejoins, and is certain there at once (timeout 0) though
            # its last report is far behind that iteration.
            out_at = m.effective_iteration
            check(clients[1].readmission_after(out_at) is None,
                  "readmission_after before any readmission: %r"
                  % clients[1].readmission_after(out_at))
            res = run([args.ctl, "--daemon", d.address, "override", JOB, "1", "none",
                       "--reason", "test"], timeout=30)
            check(res.returncode == 0, "stragglerctl override failed: %s" % res.stderr)
            deadline = time.monotonic() + 30
            while clients[1].readmission_after(out_at) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            back = clients[1].readmission_after(out_at)
            check(back is not None and not back.is_excluded(1)
                  and back.effective_iteration > out_at,
                  "rank 1's readmission after iteration %d: %r" % (out_at, back))
            check(clients[1].membership_for(back.effective_iteration, timeout=0.0).ok,
                  "rank 1 is not certain at its readmission %d at once" % back.effective_iteration)
            check(not clients[0].membership_for(back.effective_iteration, timeout=0.0).ok,
                  "rank 0, not readmitted, was certain at %d without its reports"
                  % back.effective_iteration)

            check(not clients[0].stats().upstream_unavailable,
                  "a client talking to the daemon itself says its upstream is unavailable")
            clients[1].close()
            try:
                reducers[1].begin_iteration(ITERATIONS)
                raise TestFailure("a PartialAllReduce of a closed Client still ran")
            except RuntimeError as e:
                check("Client was closed" in str(e), "closed client: %r" % str(e))
            clients[0].close()
            check_work_and_phases(straggler, d)
            check(d.stop() == 0, "stragglerd did not exit cleanly")
        if args.agent:
            check_upstream_unavailable(straggler, args.agent, workdir)
    print("2 ranks in 2 threads: %d exact iterations; callbacks saw %s" % (ITERATIONS, seen))


def check_work_and_phases(straggler, d):
    """Issue 31: report()'s work, input_wait_seconds and optimizer_seconds
    reach the real daemon, which takes valid ones and refuses a bad one,
    naming it (stats().last_rejection)."""
    c = straggler.Client(endpoint=d.address, job_id="python-phases", rank=0, world_size=1)
    check(c.report(0, 1, 0.1, work=4096.0, input_wait_seconds=0.01, optimizer_seconds=0.02,
                   step_seconds=0.2, collective_wait_seconds=0.03),
          "report() with work and phases was dropped")
    check(c.report(0, 2, 0.1), "a report without them was dropped")
    check(c.flush(10.0), "flush did not complete: %s" % c.stats().last_rejection)
    st = c.stats()
    check(st.acked == 2 and st.rejected == 0,
          "valid work and phases: acked %d, rejected %d (%s)" % (st.acked, st.rejected,
                                                                 st.last_rejection))
    for it, kwargs, needle in [(3, dict(work=0.0), "work=0 (must be a finite number > 0)"),
                               (4, dict(input_wait_seconds=-1.0),
                                "input_wait_seconds=-1 (must be a finite number >= 0)"),
                               (5, dict(optimizer_seconds=float("inf")),
                                "optimizer_seconds=inf (must be a finite number >= 0)")]:
        c.report(0, it, 0.1, **kwargs)
        c.flush(10.0)
        st = c.stats()
        check(st.last_rejection == "rank 0 iteration %d reported %s" % (it, needle),
              "report(%s): last_rejection %r" % (kwargs, st.last_rejection))
    check(c.stats().rejected == 3 and c.stats().acked == 2,
          "after three bad reports: %r" % c.stats())
    c.close()


def check_own_store(straggler):
    import datetime
    import numpy as np
    import torch.distributed as dist
    nowhere = "127.0.0.1:1"  # no daemon: the clients retry in the background
    store = dist.HashStore()
    clients = [straggler.Client(endpoint=nowhere, job_id="own-store", rank=r, world_size=2)
               for r in range(2)]
    reducers = [straggler.PartialAllReduce(c, store=store, collective_timeout=20.0,
                                           membership_timeout=0.2) for c in clients]
    out, errors = {0: [], 1: []}, []

    def loop(r):
        try:
            for it in range(3):
                plan = reducers[r].begin_iteration(it)
                g = np.full(3, 2.0 * (r + 1) + it, dtype=np.float32)
                res = reducers[r].all_reduce_average(g)
                out[r].append((plan.active_ranks, res["participated"], g.tolist()))
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append("rank %d: %s: %s" % (r, type(e).__name__, e))
    threads = [threading.Thread(target=loop, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "two ranks over a torch HashStore, no daemon: %s" % errors)
    for r in range(2):
        check(out[r] == [([0, 1], True, [3.0 + it] * 3) for it in range(3)],
              "rank %d over a torch HashStore, no daemon: %s" % (r, out[r]))
    for c in clients:
        c.close()

    alone = straggler.Client(endpoint=nowhere, job_id="own-store-alone", rank=0, world_size=2)
    lonely = dist.HashStore()
    lonely.set_timeout(datetime.timedelta(seconds=600))
    reducer = straggler.PartialAllReduce(alone, store=lonely, collective_timeout=1.0,
                                         membership_timeout=0.2)
    started = time.monotonic()
    try:
        reducer.begin_iteration(0)
        raise TestFailure("a rank alone in its store built a 2-rank context")
    except straggler.CollectiveError as e:
        check("the trainer's rendezvous store" in str(e), "the error names no store: %r" % str(e))
    # Bounded by collective_timeout (1 s), not the store's 600 s.
    check(time.monotonic() - started < 60, "the build waited %.0f s" % (time.monotonic() - started))
    alone.close()


def check_upstream_unavailable(straggler, agent_binary, workdir):
    from agent_test import Agent, wait_for
    sock = os.path.join(workdir, "agent.sock")
    # Port 1 on loopback: the agent's upstream is refused at once, so it tells
    # its trainer streams the daemon is unavailable.
    agent = Agent(agent_binary, workdir, sock, "127.0.0.1:1")
    agent.start()
    try:
        c = straggler.Client(endpoint="unix://" + sock, job_id=JOB + "-agent", rank=0,
                             world_size=1)
        wait_for("upstream_unavailable through the agent",
                 lambda: c.stats().upstream_unavailable, timeout=30)
        check(c.stats().connected, "the client behind the agent is not connected to it")
        c.close()
        check(agent.stop() == 0, "straggler-agent did not exit 0 on SIGTERM")
    finally:
        agent.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--pythonpath", required=True)
    parser.add_argument("--agent", help="straggler-agent binary (the upstream_unavailable check)")
    args = parser.parse_args()
    main(lambda: test(args))
