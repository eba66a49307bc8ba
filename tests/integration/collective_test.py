#!/usr/bin/env python3
"""The collective layer end to end: 4 real rank processes (straggler-collective-
driver: the real client + a Gloo PartialAllReduce) and the real stragglerd on
loopback. Exclusions are forced with `stragglerctl override` so the test is
deterministic; the daemon's own detection is switched off (a busy CI machine
must not add exclusions of its own).

  exclusion_rejoin  rank 3 (a slow rank) is forced out mid-run, then back in:
                    every rank switches at each version's effective iteration,
                    the averages equal the active ranks' mean exactly, rank 3
                    receives the parameters by broadcast when it rejoins, and
                    all ranks end with the same parameters as a reference run.
  far_behind_rejoin the same with rank 3 10x slower: it falls far behind while
                    out and skips straight to the iteration that readmits it.
  late_directive    rank 2's directives are held back by a proxy across the
                    switch iteration: it waits (bounded) instead of guessing,
                    and every rank still switches at the effective iteration.
  daemon_killed     the daemon is killed mid-run: training goes on with the
                    last applied membership on every rank (certain = false).

--backend nccl runs a case on the NCCL backend, one GPU per rank and as many
ranks as GPUs (at most 4; the last rank is the one excluded). With fewer than
2 GPUs it exits 77 (ctest: skipped) and says why. NCCL's ncclAvg multiplies
by 1/n before summing, so its averages are compared within float rounding
(relative 1e-5) instead of exactly.
"""

import argparse
import os
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, RankProcesses, check, ctl, main, run  # noqa: E402

WORLD = 4  # 4 on Gloo; the number of GPUs (2..4) on NCCL
ELEMENTS = 8
BACKEND = "gloo"
SKIPPED = 77
JOB = "collective"
DEADLINE_S = 150


def grad(rank, it, k):
    return 12 * (rank + 1) + 12 * k + 12 * (it % 7)


def same(got, want):
    """Exact on Gloo (sum, then divide); within float rounding on NCCL (ncclAvg)."""
    if BACKEND == "gloo":
        return got == want
    return abs(got - want) <= 1e-5 * max(1.0, abs(want))


class DelayProxy:
    """TCP forwarder; while `hold_until` is in the future, bytes from the
    server to the client are held back (then delivered in order)."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.hold_until = 0.0
        self.held_bytes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src, dst, to_client):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if to_client:
                    wait = self.hold_until - time.monotonic()
                    if wait > 0:
                        self.held_bytes += len(data)
                        time.sleep(wait)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Ranks(RankProcesses):
    """Starts the drivers (one per rank) and follows their JSON lines."""

    def __init__(self, driver, daemon_address, workdir, iterations, step_ms, report_endpoints=None,
                 membership_timeout_ms=10000, jump_to_rejoin=()):
        self.go_file = os.path.join(workdir, "go")
        cmds = []
        for r in range(WORLD):
            cmd = [driver, "--daemon", daemon_address, "--job", JOB, "--rank", str(r),
                   "--world-size", str(WORLD), "--iterations", str(iterations),
                   "--step-ms", str(step_ms[r]), "--elements", str(ELEMENTS),
                   "--membership-timeout-ms", str(membership_timeout_ms),
                   "--collective-timeout-ms", "20000", "--go-file", self.go_file,
                   "--backend", BACKEND]
            if report_endpoints and report_endpoints.get(r):
                cmd += ["--report-endpoint", report_endpoints[r]]
            if r in jump_to_rejoin:
                cmd += ["--jump-to-rejoin"]
            cmds.append(cmd)
        super().__init__(cmds, workdir, DEADLINE_S)
        with open(self.go_file, "w") as f:
            f.write("go\n")


def check_iterations(ranks, iterations, may_skip=()):
    """Per iteration: participants agree on the version; the averages are exact.
    Ranks in `may_skip` may have skipped iterations (a jump to their rejoin),
    but only ones at which they were not in the active set."""
    by_it = {r: {row["it"]: row for row in ranks.lines[r]} for r in range(WORLD)}
    for r in range(WORLD):
        if r in may_skip:
            check(len(by_it[r]) == len(ranks.lines[r]) and iterations - 1 in by_it[r],
                  "rank %d printed iterations %s" % (r, [row["it"] for row in ranks.lines[r]]))
        else:
            check(len(ranks.lines[r]) == iterations,
                  "rank %d printed %d iterations, expected %d"
                  % (r, len(ranks.lines[r]), iterations))
    for it in range(iterations):
        # A rank that skipped `it` is missing here; were it in the active set,
        # the participants would not match it below.
        rows = {r: by_it[r][it] for r in range(WORLD) if it in by_it[r]}
        participants = [r for r in rows if rows[r]["participated"]]
        check(participants, "iteration %d: no rank took part" % it)
        versions = {rows[r]["version"] for r in participants}
        check(len(versions) == 1, "iteration %d: participants applied versions %s" % (it, versions))
        active = rows[participants[0]]["active"]
        check(active == participants,
              "iteration %d: active set %s but ranks %s took part" % (it, active, participants))
        for r in rows:
            if r in participants:
                for k in range(ELEMENTS):
                    want = sum(grad(a, it, k) for a in active) // len(active)
                    check(same(rows[r]["avg"][k], want) and same(rows[r]["avg64"][k], 2 * want),
                          "iteration %d rank %d element %d: average %r (double %r), expected %d"
                          % (it, r, k, rows[r]["avg"][k], rows[r]["avg64"][k], want))
            else:
                check(rows[r]["avg"][0] == grad(r, it, 0),
                      "iteration %d: excluded rank %d's buffer changed" % (it, r))


def switch_iterations(ranks, version):
    """The first iteration at which each rank applied `version`."""
    first = {}
    for r in range(WORLD):
        for row in ranks.lines[r]:
            if row["version"] >= version:
                first[r] = (row["it"], row["version"], row["effective_iteration"])
                break
    return first


def check_switch(ranks, version, label):
    first = switch_iterations(ranks, version)
    check(len(first) == WORLD, "%s: only ranks %s reached version %d" % (label, sorted(first), version))
    its = {v[0] for v in first.values()}
    check(len(its) == 1, "%s: ranks switched to version %d at different iterations: %s"
          % (label, version, first))
    it, v, eff = next(iter(first.values()))
    check(v == version and it == eff,
          "%s: version %d applied at %d, effective at %d" % (label, v, it, eff))
    return it


def reference_params(ranks, iterations):
    """Rank 0's initial parameters moved by every average the active group took."""
    params = [float(k) for k in range(ELEMENTS)]
    for it in range(iterations):
        row = ranks.lines[0][it]  # rank 0 is never excluded in these tests
        params = [p + a for p, a in zip(params, row["avg"])]
    return params


def run_out_and_back(args, workdir, config, iterations, step_ms, out_after, jump_to_rejoin=()):
    """The last rank is excluded by an override once every rank is past
    `out_after` and readmitted once the others are past 70. Checks what every
    such run must show (each iteration's agreement and exact averages, the
    two switches at their effective iterations, the active group's parameters
    and step counter on every rank at the end) and returns (ranks, out_at,
    back_at)."""
    last = WORLD - 1
    with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
        ranks = Ranks(args.driver, d.address, workdir, iterations, step_ms,
                      jump_to_rejoin=jump_to_rejoin)
        try:
            ranks.wait_all_past(out_after)
            ctl(args.ctl, d.address, "override", JOB, str(last), "exclude", "--reason", "test")
            ranks.wait_all_past(70, ranks=range(last))
            ctl(args.ctl, d.address, "override", JOB, str(last), "include", "--reason", "test")
            ranks.finish()
        finally:
            ranks.kill()
        check(d.stop() == 0, "stragglerd did not exit cleanly")
    check_iterations(ranks, iterations, may_skip=jump_to_rejoin)
    versions = sorted({row["version"] for row in ranks.lines[0]})
    check(len(versions) == 3, "expected versions 0, exclusion, readmission; saw %s" % versions)
    out_at = check_switch(ranks, versions[1], "exclusion")
    back_at = check_switch(ranks, versions[2], "readmission")
    want = reference_params(ranks, iterations)
    for r in range(WORLD):
        check(all(same(g, w) for g, w in zip(ranks.final[r]["final"], want)),
              "rank %d ended with parameters %s, the active group's are %s"
              % (r, ranks.final[r]["final"], want))
    check(ranks.final[last]["steps_taken"] == ranks.final[0]["steps_taken"],
          "rank %d's step counter %d was not taken from the group (%d)"
          % (last, ranks.final[last]["steps_taken"], ranks.final[0]["steps_taken"]))
    return ranks, out_at, back_at


def test_exclusion_rejoin(args, workdir, config):
    iterations = 140
    last = WORLD - 1
    # The last rank is the slow one (2x): while it is left out the others
    # stop waiting for it, and it never runs ahead of the group it rejoins.
    ranks, out_at, back_at = run_out_and_back(args, workdir, config, iterations,
                                              [20] * last + [40], out_after=25)
    check(ranks.lines[last][out_at]["participated"] is False,
          "rank %d still took part after exclusion" % last)
    check(ranks.lines[last][back_at]["participated"] and ranks.lines[last][back_at]["synced"],
          "rank %d did not rejoin with a parameter broadcast at iteration %d" % (last, back_at))
    for r in range(last):
        check(ranks.lines[r][back_at]["synced"], "rank %d skipped the rejoin broadcast" % r)
        check(not ranks.lines[r][out_at]["synced"], "rank %d broadcast on a shrink" % r)
    print("%s: exclusion at iteration %d, rejoin at %d; %d iterations right on %d ranks"
          % (BACKEND, out_at, back_at, iterations, WORLD))


def test_far_behind_rejoin(args, workdir, config):
    """The excluded rank is 10x slower, so it falls far behind the group in
    shadow; when it is readmitted it skips straight to the readmission's
    effective iteration (StepPlan.rejoin_iteration), where MembershipFor is
    certain for it at once, and takes the group's parameters there."""
    iterations = 100
    last = WORLD - 1
    ranks, _, back_at = run_out_and_back(args, workdir, config, iterations, [20] * last + [200],
                                         out_after=12, jump_to_rejoin=(last,))
    its = [row["it"] for row in ranks.lines[last]]
    at = its.index(back_at)
    check(at > 0 and back_at - its[at - 1] > 1,
          "rank %d did not skip to its rejoin at %d: it ran iterations %s"
          % (last, back_at, its))
    before = ranks.lines[last][at - 1]
    check(before["rejoin_iteration"] == back_at and not before["participated"],
          "rank %d's last shadow iteration %d planned a rejoin at %s, not %d"
          % (last, before["it"], before["rejoin_iteration"], back_at))
    row = ranks.lines[last][at]
    check(row["certain"] and row["participated"] and row["synced"],
          "rank %d at its rejoin %d: %s" % (last, back_at, row))
    check(all(r["certain"] for r in ranks.lines[last]),
          "rank %d guessed (certain = false) although the daemon was up" % last)
    print("%s: rank %d skipped from iteration %d to its rejoin at %d"
          % (BACKEND, last, its[at - 1], back_at))


def run_with_rank2_held(args, workdir, config, iterations, after, hold_s, **ranks_kwargs):
    """Once every rank is past `after`, holds rank 2's directives (acks and
    the new membership) for `hold_s` behind a proxy and excludes rank 3 by an
    override; returns the ranks when the run is over."""
    with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
        proxy = DelayProxy(d.address)
        ranks = Ranks(args.driver, d.address, workdir, iterations, [20, 20, 20, 20],
                      report_endpoints={2: proxy.address}, **ranks_kwargs)
        try:
            ranks.wait_all_past(after)
            proxy.hold_until = time.monotonic() + hold_s
            ctl(args.ctl, d.address, "override", JOB, "3", "exclude", "--reason", "test")
            ranks.finish()
        finally:
            ranks.kill()
        check(d.stop() == 0, "stragglerd did not exit cleanly")
    check(proxy.held_bytes > 0, "the proxy held nothing back: the test did not delay rank 2")
    return ranks, proxy


def test_late_directive(args, workdir, config):
    iterations = 80
    # Rank 2's directives held for 3 s, well past the switch iteration (2
    # iterations ahead) of the exclusion, within its membership_timeout.
    ranks, proxy = run_with_rank2_held(args, workdir, config, iterations, after=25, hold_s=3.0)
    # Rank 2 waited for its held directives inside BeginIteration (the switch
    # rule's bounded wait) instead of going on without them: the 3 s hold
    # shows as one long wait (a lower bound: load only makes it longer).
    longest = max(ranks.lines[2], key=lambda row: row["begin_ms"])
    check(longest["begin_ms"] >= 1000,
          "rank 2 never waited in BeginIteration (longest %.0f ms at iteration %d) although its "
          "directives were held for 3 s" % (longest["begin_ms"], longest["it"]))
    check_iterations(ranks, iterations)
    versions = sorted({row["version"] for row in ranks.lines[0]})
    check(len(versions) == 2, "expected versions 0 and the exclusion; saw %s" % versions)
    at = check_switch(ranks, versions[1], "late directive")
    check(all(row["certain"] for r in range(WORLD) for row in ranks.lines[r]),
          "a rank guessed (certain = false) although the daemon was up")
    print("rank 2's directives held %d bytes; it waited %.0f ms in BeginIteration(%d); every rank "
          "switched at iteration %d" % (proxy.held_bytes, longest["begin_ms"], longest["it"], at))


def test_daemon_killed(args, workdir, config):
    iterations = 90
    with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
        ranks = Ranks(args.driver, d.address, workdir, iterations, [20, 20, 20, 20],
                      membership_timeout_ms=1500)
        try:
            ranks.wait_all_past(15)
            ctl(args.ctl, d.address, "override", JOB, "3", "exclude", "--reason", "test")
            ranks.wait_all_past(40, ranks=[0, 1, 2])
            d.proc.kill()  # no drain: the daemon is simply gone
            d.proc.wait()
            ranks.finish()
        finally:
            ranks.kill()
    check_iterations(ranks, iterations)
    versions = sorted({row["version"] for row in ranks.lines[0]})
    check(len(versions) == 2, "expected versions 0 and the exclusion; saw %s" % versions)
    check_switch(ranks, versions[1], "before the kill")
    uncertain = [row["it"] for row in ranks.lines[0] if not row["certain"]]
    check(uncertain, "rank 0 never noticed the daemon was gone")
    for r in range(WORLD):
        tail = ranks.lines[r][-1]
        check(tail["version"] == versions[1] and not tail["certain"],
              "rank %d did not keep the last applied membership after the kill: %s" % (r, tail))
    print("daemon killed; iterations %d..%d ran on the last applied membership"
          % (uncertain[0], iterations - 1))


def test_uncertain_rank(args, workdir, config):
    """The window a per-rank rule cannot close: at a version's effective
    iteration some ranks are certain of it and one is not - here rank 2,
    whose directives (acknowledgements and the version) a proxy holds past
    its membership_timeout, as if the daemon had died for it alone. Ranks 0,
    1 and 3 propose the exclusion, rank 2 the applied membership: the in-band
    agreement keeps all four on the applied one (without it, ranks 0 and 1
    switch alone and every rank fails within collective_timeout) until rank 2
    gets its directives, then all switch at the same iteration."""
    iterations = 60
    hold_s = 8.0
    ranks, _ = run_with_rank2_held(args, workdir, config, iterations, after=15, hold_s=hold_s,
                                   membership_timeout_ms=1500)
    check_iterations(ranks, iterations)
    versions = sorted({row["version"] for row in ranks.lines[0]})
    check(len(versions) == 2, "expected versions 0 and the exclusion; saw %s" % versions)
    v = versions[1]
    first = switch_iterations(ranks, v)
    check(len(first) == WORLD and len({f[0] for f in first.values()}) == 1,
          "ranks switched to version %d at different iterations: %s" % (v, first))
    switched, _, effective = first[0]
    check(switched > effective,
          "the switch came at its effective iteration %d although rank 2 was held" % effective)
    row2 = ranks.lines[2][effective]
    check(not row2["certain"], "rank 2 was certain at the effective iteration %d: %s" % (effective, row2))
    for r in (0, 1, 3):
        put_off = [row["it"] for row in ranks.lines[r] if row["deferred_version"] == v]
        check(put_off and put_off[0] == effective and put_off[-1] == switched - 1
              and len(put_off) == switched - effective,
              "rank %d put version %d off at %s; expected iterations %d..%d"
              % (r, v, put_off, effective, switched - 1))
    # Put off for long enough, the ranks say so on stderr, and when it ends.
    err0 = ranks.err(0)
    check("membership version %d put off since iteration %d" % (v, effective) in err0
          and "applied version %d at iteration %d" % (v, switched) in err0,
          "rank 0 did not report the put-off switch on stderr: %r" % err0[-600:])
    print("rank 2 held for %.0f s: the exclusion effective at iteration %d was put off by ranks "
          "0, 1, 3 (rank 2 uncertain) and applied by all four at iteration %d"
          % (hold_s, effective, switched))

def gpu_ranks(driver):
    """Ranks for the NCCL backend: one per visible GPU, 2..4; None if < 2."""
    res = run([driver, "--gpu-count"], timeout=60)
    check(res.returncode == 0, "%s --gpu-count failed: %s" % (driver, res.stderr))
    out = res.stdout.strip()
    # A driver that prints nothing is broken, not GPU-less: fail, do not skip.
    check(out.isdigit(), "%s --gpu-count printed %r, not a number: %s" % (driver, out, res.stderr))
    n = int(out)
    if n == 1 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1":
        # NCCL >= 2.30 lets two ranks share a GPU (experimental); the caller
        # (scripts/gpu-check.sh) set this only after checking the version.
        print("two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1): %s" % res.stderr.strip())
        return 2
    if n < 2:
        print("SKIPPED: the NCCL test needs >= 2 GPUs (NCCL refuses two ranks on one GPU "
              "before 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1); this machine has %d (%s)"
              % (n, res.stderr.strip() or "no reason given"))
        return None
    return min(4, n)


def test(args):
    global BACKEND, WORLD
    BACKEND = args.backend
    if BACKEND == "nccl":
        n = gpu_ranks(args.driver)
        if n is None:
            sys.exit(SKIPPED)
        WORLD = n
    with tempfile.TemporaryDirectory(prefix="collective-") as workdir:
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            # Only the test's overrides exclude ranks.
            f.write("policy:\n  exclusion_enabled: false\n")
        {"exclusion_rejoin": test_exclusion_rejoin, "far_behind_rejoin": test_far_behind_rejoin,
         "late_directive": test_late_directive,
         "daemon_killed": test_daemon_killed,
         "uncertain_rank": test_uncertain_rank}[args.case](args, workdir, config)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["exclusion_rejoin", "far_behind_rejoin", "late_directive",
                                         "daemon_killed", "uncertain_rank"])
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--driver", required=True)
    parser.add_argument("--ctl", required=True)
    args = parser.parse_args()
    main(lambda: test(args))
