#!/usr/bin/env python3
"""Faults (issue 7): the real stragglerd under kill -9, a watcher that never
reads, SIGTERM during heavy ingest and SIGHUP with a broken config.

    fault_test.py CASE --stragglerd PATH --sim PATH --ctl PATH --loadgen PATH

kill9_restart   A daemon on a state database runs a straggler-sim job with a
                rank excluded. Another process holds the database's write lock
                while an admin call journals events (they reach clients but
                not the disk: the writes fail and straggler_state_db_errors_total
                counts them); then kill -9, and a new daemon on the same
                database and port. The sim finishes (no hang); every rank saw
                membership versions only grow, the excluded rank stayed out under
                a new version (or was released by one); the journal holds the
                pre-kill events with their sequences, no sequence a client saw
                is reused for another event (the lost ones included), and
                since_sequence paging from the last pre-kill sequence returns
                exactly the new events.
silent_watcher  stragglerctl watch, then SIGSTOP: a WatchMembership client that
                never reads. Hundreds of large membership versions of its job
                (1 500 of 2 000 ranks force-excluded; a slow loadgen keeps
                every rank attached so the versions go out) while
                straggler-loadgen ingests another job: the loadgen run is
                unaffected, the daemon skips versions for the watcher
                (straggler_watch_versions_skipped_total) instead of buffering
                them (VmRSS growth far below what the versions add up to), and
                SIGTERM still ends the daemon with exit 0 with the watcher
                stopped: its connection may hold gRPC's drain, which the
                daemon cuts at its limit (7 s) after flushing its state.
sigterm_ingest  SIGTERM while straggler-loadgen sends as fast as it can and a sim
                job has events and an exclusion: exit 0 within the drain
                timeout, the drain logged, and the state database closed
                cleanly (no WAL left) with every event and membership version
                clients saw.
sighup_bad_config
                A config file sets policy.limit 7. SIGHUP after breaking the
                file: the error is logged with file:line and the job keeps
                limit 7; SIGHUP after fixing it: the job gets limit 9.

Python 3 standard library only (sqlite3 included). No timing asserts: every
wait is a bounded poll for a condition.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, TestFailure, check, finish, main, run, wait_for  # noqa: E402

CTL_TIMEOUT_S = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(address, path, body=None, method=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://%s%s" % (address, path), data=data,
                                 method=method or ("PUT" if data else "GET"),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    return json.loads(text) if path != "/metrics" else text


def metric(address, name):
    """The value of an unlabelled metric from /metrics."""
    for line in http(address, "/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise TestFailure("metric %s not in /metrics" % name)


def ctl_json(args, address, *rest, timeout_s=CTL_TIMEOUT_S):
    cmd = [args.ctl, "--daemon", address, "--output", "json",
           "--timeout-ms", str(timeout_s * 1000)] + list(rest)
    res = run(cmd, timeout_s + 10)
    check(res.returncode == 0, "%s exited %d:\n%s%s" % (" ".join(cmd), res.returncode,
                                                        res.stdout, res.stderr))
    return json.loads(res.stdout)


def all_events(address, since=0):
    """Every journaled event after `since` (REST, daemon-wide), paging."""
    out = []
    while True:
        page = http(address, "/v1/events?since=%d&limit=10000" % since)
        events = page.get("events", [])
        out.extend(events)
        last = int(page.get("lastSequence", since))
        if not events or last <= since:
            return out
        since = last


def event_key(e):
    return (e.get("jobId"), e.get("kind"), e.get("rank"), e.get("iteration"), e.get("message"))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise TestFailure("no VmRSS for pid %d" % pid)


def sim_cmd(args, address, job, report, iterations, slow="3:4:20:1000000000", ranks=4):
    return [args.sim, "--daemon", address, "--job", job, "--ranks", str(ranks),
            "--iterations", str(iterations), "--iteration-ms", "10", "--seed", "7",
            "--slow", slow, "--report", report, "--quiet"]


def excluded_ranks(membership):
    return sorted(e["rank"] for e in membership.get("excluded", []))


# ---------------------------------------------------------------------------
SIM_ITERATIONS = 6000  # >= 60 s at 10 ms a step: outlasts the locked phase and the kill


def test_kill9_restart(args, work):
    db = os.path.join(work, "state.db")
    address = "127.0.0.1:%d" % free_port()
    job, aux = "fault-kill9", "fault-aux"
    report = os.path.join(work, "sim.json")
    first = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-1",
                   extra_args=["--state-db", db])
    second = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-2",
                    extra_args=["--state-db", db])
    sim = None
    try:
        first.start()
        # A second job for the admin call made while the database is locked,
        # so the sim's job never waits on the lock.
        aux_sim = run(sim_cmd(args, address, aux, os.path.join(work, "aux.json"), 30,
                              slow="0:1:0:1"), 120)
        check(aux_sim.returncode == 0, "aux sim failed:\n%s" % aux_sim.stderr)

        sim = subprocess.Popen(sim_cmd(args, address, job, report, SIM_ITERATIONS),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        before = wait_for("rank 3 excluded", lambda: (
            lambda m: m if 3 in excluded_ranks(m) else None)(
                http(first.http_address, "/v1/jobs/%s/membership" % job)))
        v_before = int(before["version"])

        # Every event so far is on disk (the writer is fast; poll the file).
        seen = all_events(first.http_address)
        check(seen, "no events before the kill")
        last_flushed = max(int(e["sequence"]) for e in seen)

        def on_disk():
            with sqlite3.connect(db, timeout=10) as c:
                return c.execute("SELECT max(sequence) FROM events").fetchone()[0] or 0
        wait_for("events on disk", lambda: on_disk() >= last_flushed)

        # Hold the write lock: the daemon's writes now fail after its busy
        # timeout (5 s), so the override's events reach clients but not the disk.
        errors_before = metric(first.http_address, "straggler_state_db_errors_total")
        lock = sqlite3.connect(db, timeout=10, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        # Each of its writes waits out the busy timeout (membership, overrides,
        # the event batch, and whatever else the daemon writes meanwhile): a
        # long deadline, as a hang guard.
        ctl_json(args, address, "override", aux, "1", "exclude", "--reason", "lost at kill -9",
                 timeout_s=180)
        errors_after = metric(first.http_address, "straggler_state_db_errors_total")
        check(errors_after >= errors_before + 2,
              "straggler_state_db_errors_total %s -> %s: the failed membership, override and "
              "event writes were not counted" % (errors_before, errors_after))
        seen = all_events(first.http_address)
        seen_by_seq = {int(e["sequence"]): e for e in seen}
        lost = sorted(s for s in seen_by_seq if s > last_flushed)
        check(lost, "the override journaled no event")
        last_seen = max(seen_by_seq)
        print("events %s seen by clients but not on disk; state_db_errors_total %s -> %s"
              % (lost, errors_before, errors_after))

        check(sim.poll() is None, "the sim finished before the kill: raise SIM_ITERATIONS")
        first.proc.kill()  # SIGKILL: no drain, no clean close
        first.proc.wait()
        lock.rollback()
        lock.close()
        check(on_disk() < min(lost), "the lost events reached the disk after all")

        second.start()
        finish(sim, "straggler-sim (after the restart)", 240, ":\n" + second.log_tail())
        with open(report) as f:
            rep = json.load(f)
        check(rep["iterations"] == SIM_ITERATIONS, "sim ran %d iterations" % rep["iterations"])
        check(rep["agreement_violations"] == 0,
              "%d agreement violations across the restart" % rep["agreement_violations"])

        # Versions grow for every rank: in the order a rank applied them.
        per_rank = {}
        for m in rep["memberships"]:
            for r, it in m["applied_at"].items():
                per_rank.setdefault(r, []).append((it, m["version"]))
        for r, applied in per_rank.items():
            versions = [v for _, v in sorted(applied)]
            check(versions == sorted(set(versions)),
                  "rank %s applied versions out of order: %s" % (r, sorted(applied)))
        after = [m for m in rep["memberships"] if m["version"] > v_before and m["applied_at"]]
        check(after, "no rank applied a version above v%d (the restart's)" % v_before)
        first_after = min(after, key=lambda m: m["version"])
        check(3 in [e["rank"] for e in first_after["excluded"]],
              "the first version after the restart (v%d) does not keep rank 3 out: %s"
              % (first_after["version"], first_after["excluded"]))
        now = ctl_json(args, address, "membership", job)
        check(int(now["version"]) > v_before, "membership v%s not above v%d"
              % (now["version"], v_before))

        # The journal: old events as they were, no sequence a client saw reused.
        events = all_events(second.http_address)
        by_seq = {int(e["sequence"]): e for e in events}
        for s, e in seen_by_seq.items():
            if s in lost:
                check(s not in by_seq or event_key(by_seq[s]) == event_key(e),
                      "sequence %d reused: %s before the kill, %s after" % (s, e, by_seq.get(s)))
            else:
                check(s in by_seq and event_key(by_seq[s]) == event_key(e),
                      "event %d lost or changed by the restart: %s vs %s" % (s, e, by_seq.get(s)))
        new = all_events(second.http_address, since=last_seen)
        check(new, "no event after the restart")
        check(all(int(e["sequence"]) > last_seen for e in new),
              "since_sequence=%d returned older events" % last_seen)
        check(any(e.get("jobId") == job for e in new),
              "the restored job journaled nothing new: %s" % new[:3])
        seqs = [int(e["sequence"]) for e in events]
        check(seqs == sorted(set(seqs)), "journal sequences not strictly ascending")
        print("restart: sim finished %d iterations; v%d -> v%d; %d new events from sequence %s"
              % (rep["iterations"], v_before, int(now["version"]), len(new), new[0]["sequence"]))
        check(second.stop() == 0, "second daemon did not exit 0 on SIGTERM")
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
        for d in (first, second):
            d.__exit__(None, None, None)


# ---------------------------------------------------------------------------
WATCH_RANKS = 2000
WATCH_FORCED = 1500  # ~160 KB per version
WATCH_VERSIONS = 600  # ~100 MB in all: more than socket buffers and flow control hold


def test_silent_watcher(args, work):
    job, load_job = "fault-watched", "fault-load"
    watcher = None
    loadgen = None
    holder = None
    with Daemon(args.stragglerd, work) as d:
        try:
            # The watched job: a slow loadgen run whose stream stays open for
            # the whole test, so every rank is attached and the overrides'
            # versions go out (the membership gate withholds a change while a
            # rank it concerns has no stream - docs/collective.md).
            holder = subprocess.Popen(
                [args.loadgen, "--ready-file", d.ready_file, "--ranks", str(WATCH_RANKS),
                 "--streams", "1", "--batch", str(WATCH_RANKS), "--rate", "4000",
                 "--duration", "300", "--job", job, "--quiet"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wait_for("every rank of %s attached" % job, lambda: int(http(
                d.http_address, "/v1/jobs/%s" % job).get("detachedRanks", 0)) == 0
                and holder.poll() is None, timeout=60)
            for r in range(WATCH_FORCED):  # every excluded rank makes each version larger
                http(d.http_address, "/v1/jobs/%s/workers/%d/override" % (job, r),
                     {"override": "force_exclude", "reason": "fault test"})

            watcher = subprocess.Popen([args.ctl, "--daemon", d.address, "watch", job],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for("the watch to be counted",
                     lambda: metric(d.http_address, "straggler_active_watches") == 1)
            os.kill(watcher.pid, signal.SIGSTOP)  # never reads again

            out = os.path.join(work, "loadgen.json")
            loadgen = subprocess.Popen(
                [args.loadgen, "--ready-file", d.ready_file, "--ranks", "1000", "--streams", "4",
                 "--batch", "250", "--rate", "50000", "--duration", "20", "--job", load_job,
                 "--json", out, "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)
            rss_before = rss_kib(d.proc.pid)
            rank = WATCH_FORCED
            for i in range(WATCH_VERSIONS):
                # Toggle one more rank: a new large version each time.
                http(d.http_address, "/v1/jobs/%s/workers/%d/override" % (job, rank),
                     {"override": "force_exclude" if i % 2 == 0 else "none"})
            m = http(d.http_address, "/v1/jobs/%s/membership" % job)
            size = len(json.dumps(m))
            rss_after = rss_kib(d.proc.pid)
            skipped = metric(d.http_address, "straggler_watch_versions_skipped_total")
            pushed_mib = WATCH_VERSIONS * size / 1048576.0
            growth_mib = (rss_after - rss_before) / 1024.0
            print("%d versions of ~%d KB (%.0f MiB) to a stopped watcher: %d skipped, daemon "
                  "VmRSS %d -> %d KiB" % (WATCH_VERSIONS, size // 1024, pushed_mib, skipped,
                                         rss_before, rss_after))
            check(skipped > 0, "no version skipped for the stopped watcher")
            # Generous: the point is that it does not scale with the versions.
            check(growth_mib < pushed_mib / 2,
                  "daemon VmRSS grew %.0f MiB for %.0f MiB of versions to a stopped watcher"
                  % (growth_mib, pushed_mib))

            lo, le = loadgen.communicate(timeout=120)
            check(loadgen.returncode == 0, "loadgen exited %d with a stopped watcher:\n%s%s"
                  % (loadgen.returncode, lo, le))
            with open(out) as f:
                r = json.load(f)
            check(r["accepted"] > 0 and r["rejected"] == 0, "loadgen result: %r" % r["steps"])
            print("loadgen alongside: %.0f reports/s accepted" % r["steps"][0]["accepted_per_s"])
            check(watcher.poll() is None, "the stopped watcher's stream ended")
            check(holder.poll() is None, "the loadgen holding %s's ranks exited:\n%s"
                  % (job, holder.stderr.read() if holder.poll() is not None else ""))
            holder.kill()  # the drain below is about the stopped watcher alone
            holder.wait()
            # The stopped watcher's connection holds gRPC's shutdown until
            # gRPC's own timers give up on it (0.4-18 s measured; README
            # "Faults"); the daemon cuts the drain at 7 s. The timeout is a
            # hang guard with room for a loaded machine, not a timing assert.
            t0 = time.monotonic()
            check(d.stop(timeout=30) == 0,
                  "stragglerd did not exit 0 on SIGTERM with a stopped watcher")
            log = d.log_tail(400)
            cut = "drain cut at its limit" in log
            print("SIGTERM to exit with a stopped watcher: %.1f s (%s)"
                  % (time.monotonic() - t0, "cut at the limit" if cut else "gRPC drained"))
            check("stragglerd stopped" in log, "no 'stragglerd stopped' line in the log")
        finally:
            if loadgen is not None and loadgen.poll() is None:
                loadgen.kill()
            if watcher is not None:
                watcher.kill()  # SIGKILL ends a stopped process too
                watcher.wait()
            if holder is not None:
                holder.kill()
                holder.wait()


# ---------------------------------------------------------------------------
def test_sigterm_ingest(args, work):
    db = os.path.join(work, "state.db")
    job, load_job = "fault-term", "fault-term-load"
    sim = loadgen = None
    with Daemon(args.stragglerd, work, extra_args=["--state-db", db]) as d:
        try:
            sim = subprocess.Popen(sim_cmd(args, d.address, job, os.path.join(work, "sim.json"),
                                           100000), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            loadgen = subprocess.Popen(
                [args.loadgen, "--ready-file", d.ready_file, "--ranks", "1000", "--streams", "4",
                 "--batch", "1000", "--rate", "0", "--duration", "60", "--job", load_job,
                 "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for("rank 3 excluded", lambda: 3 in excluded_ranks(
                http(d.http_address, "/v1/jobs/%s/membership" % job)))
            wait_for("heavy ingest", lambda: metric(
                d.http_address, "straggler_reports_accepted_total") >= 200000, timeout=120)
            # More events and versions right before the signal.
            for i in range(10):
                http(d.http_address, "/v1/jobs/%s/workers/1/override" % job,
                     {"override": "force_exclude" if i % 2 == 0 else "none"})
            seen = all_events(d.http_address)
            version = int(http(d.http_address, "/v1/jobs/%s/membership" % job)["version"])
            accepted = metric(d.http_address, "straggler_reports_accepted_total")
            rc = d.stop()  # SIGTERM; fails the test past 10 s (the drain grace is 5 s)
            check(rc == 0, "stragglerd exited %d after SIGTERM under load:\n%s"
                  % (rc, d.log_tail()))
            log = open(d.log_path).read()
            for line in ("SIGTERM received", "stragglerd draining", "stragglerd stopped",
                         "state database %s flushed" % db):
                check(line in log, "no '%s' in the daemon log:\n%s" % (line, d.log_tail()))
            check(not re.search(r"\] \[(error|critical)\]", log),
                  "errors logged during the drain:\n%s" % d.log_tail())
        finally:
            for p in (sim, loadgen):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
    # Closed cleanly: the last connection checkpointed and removed the WAL.
    check(not os.path.exists(db + "-wal") or os.path.getsize(db + "-wal") == 0,
          "the WAL was left behind: the database was not closed")
    with sqlite3.connect(db) as c:
        stored = {row[0] for row in c.execute("SELECT sequence FROM events")}
        stored_version = c.execute("SELECT max(version) FROM memberships WHERE job_id = ?",
                                   (job,)).fetchone()[0]
    missing = sorted(int(e["sequence"]) for e in seen if int(e["sequence"]) not in stored)
    check(not missing, "events %s seen before SIGTERM are not in the database" % missing[:20])
    check(stored_version is not None and stored_version >= version,
          "membership v%d seen before SIGTERM, the database has v%s" % (version, stored_version))
    print("SIGTERM after %.0f reports: exit 0, %d events and v%d on disk, WAL checkpointed"
          % (accepted, len(seen), stored_version))


# ---------------------------------------------------------------------------
GOOD_CONFIG = """\
log_level: info
policy:
  kind: dynamic
  limit: %d
"""
# Line 4 has the error: yaml parses, the key does not exist.
BAD_CONFIG = """\
log_level: info
policy:
  kind: dynamic
  limitt: 3
"""


def test_sighup_bad_config(args, work):
    config = os.path.join(work, "stragglerd.yaml")
    with open(config, "w") as f:
        f.write(GOOD_CONFIG % 7)
    job = "fault-hup"
    with Daemon(args.stragglerd, work, extra_args=["--config", config]) as d:
        res = run([args.loadgen, "--ready-file", d.ready_file, "--ranks", "8", "--streams", "1",
                   "--batch", "8", "--rate", "800", "--duration", "0.5", "--job", job,
                   "--quiet"], 60)
        check(res.returncode == 0, "loadgen failed:\n%s" % res.stderr)

        def limit():
            return int(http(d.http_address, "/v1/jobs/" + job)["policy"]["limit"])
        check(limit() == 7, "policy.limit %d, expected 7 from the file" % limit())

        def log_lines(marker):
            with open(d.log_path) as f:
                return [l for l in f if marker in l]

        with open(config, "w") as f:
            f.write(BAD_CONFIG)
        d.proc.send_signal(signal.SIGHUP)
        rejected = wait_for("the rejection in the log",
                            lambda: log_lines("SIGHUP: config rejected"), timeout=30)
        check("%s:4:" % config in rejected[0] and "limitt" in rejected[0],
              "the rejection does not name %s:4 and the key: %s" % (config, rejected[0]))
        check(limit() == 7, "policy.limit %d after a rejected reload, expected 7" % limit())
        check(d.proc.poll() is None, "stragglerd exited on a bad reload")

        with open(config, "w") as f:
            f.write(GOOD_CONFIG % 9)
        d.proc.send_signal(signal.SIGHUP)
        wait_for("the reload", lambda: log_lines("config reloaded from %s" % config), timeout=30)
        wait_for("policy.limit 9", lambda: limit() == 9, timeout=10)
        print("logged: %s; limit 7 kept; the fixed file applied limit 9"
              % rejected[0].strip().split("] ", 2)[-1])
        check(d.stop() == 0, "stragglerd did not exit 0 on SIGTERM")


CASES = {
    "kill9_restart": test_kill9_restart,
    "silent_watcher": test_silent_watcher,
    "sigterm_ingest": test_sigterm_ingest,
    "sighup_bad_config": test_sighup_bad_config,
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--sim", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--loadgen", required=True)
    args = parser.parse_args()

    def test():
        work = tempfile.mkdtemp(prefix="straggler-fault-%s-" % args.case)
        try:
            CASES[args.case](args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    main(test)
