#!/usr/bin/env python3
"""Persistence across kill -9: the real stragglerd on a state database.

1. A daemon with --state-db; straggler-sim creates a 4-rank job and keeps
   running (its streams let the change out); stragglerctl forces rank 2 out (FORCE_EXCLUDE) and sets an ewma
   policy. The daemon is killed with SIGKILL (no drain, no clean close).
2. A new daemon on the same database (no client connects): the job is back
   with rank 2 excluded (forced, with its reason), the ewma policy, a
   membership version above every old one, and ListEvents / REST /v1/events
   return the old events with their sequences; a new event's sequence is
   above them.
3. A database path that is not a database, and one whose directory cannot be
   created, make stragglerd exit 2 with a message naming the path.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, check, run, wait_for, run_main  # noqa: E402

RANKS = 4
FORCED_RANK = 2
CTL_TIMEOUT_S = 15


def ctl_json(ctl, address, *args):
    cmd = [ctl, "--daemon", address, "--output", "json"] + list(args)
    result = run(cmd, CTL_TIMEOUT_S)
    check(result.returncode == 0, "%s exited with %d:\n%s%s"
          % (" ".join(cmd), result.returncode, result.stdout, result.stderr))
    return json.loads(result.stdout)


def http_json(http_address, path):
    with urllib.request.urlopen("http://%s%s" % (http_address, path), timeout=10) as r:
        return json.loads(r.read().decode())


def startup_error(stragglerd, db_path, workdir):
    """Runs stragglerd on db_path; it must exit 2 naming the path."""
    result = run([os.path.abspath(stragglerd), "--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0",
                  "--state-db", db_path], 30, cwd=workdir)
    output = result.stdout + result.stderr
    check(result.returncode == 2, "stragglerd on %s exited %d, expected 2:\n%s"
          % (db_path, result.returncode, output))
    check(db_path in output, "the startup error does not name %s:\n%s" % (db_path, output))
    return output


def test(args):
    workdir = tempfile.mkdtemp(prefix="straggler-persist-it-")
    db = os.path.join(workdir, "state", "stragglerd.db")  # the directory is created too
    job = "persist-it-%d" % os.getpid()
    sim = None
    try:
        first = Daemon(args.stragglerd, workdir, name="stragglerd-1",
                       extra_args=["--state-db", db])
        with first:
            # The sim runs on through the admin calls: the membership gate
            # publishes an exclusion only while the job's ranks have streams
            # (docs/collective.md). It is killed with the daemon.
            sim = subprocess.Popen(
                [args.sim, "--daemon", first.address, "--job", job, "--ranks", str(RANKS),
                 "--iterations", "1000000", "--iteration-ms", "5", "--seed", "3", "--quiet"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            wait_for("every rank of %s attached" % job, lambda: sim.poll() is None and int(
                http_json(first.http_address, "/v1/jobs/%s" % job).get("detachedRanks", 0)) == 0
                and "worldSize" in http_json(first.http_address, "/v1/jobs/%s" % job))
            ctl_json(args.ctl, first.address, "override", job, str(FORCED_RANK), "exclude",
                     "--reason", "ECC errors on gpu2")
            ctl_json(args.ctl, first.address, "policy", job, "--kind", "ewma")
            before = ctl_json(args.ctl, first.address, "membership", job)
            old_version = int(before["version"])
            check(any(e["rank"] == FORCED_RANK for e in before.get("excluded", [])),
                  "rank %d not excluded before the kill: %s" % (FORCED_RANK, before))
            old_events = ctl_json(args.ctl, first.address, "events", job,
                                  "--limit", "10000").get("events", [])
            check(len(old_events) >= 2, "expected the override and policy events: %s"
                  % old_events)
            # The admin calls returned, so their state is on disk: kill -9 now.
            first.proc.kill()
            first.proc.wait()
            sim.kill()
            sim.wait()

        second = Daemon(args.stragglerd, workdir, name="stragglerd-2",
                        extra_args=["--state-db", db])
        with second:
            got = ctl_json(args.ctl, second.address, "job", job)
            check(got.get("policy", {}).get("kind") == "POLICY_KIND_EWMA",
                  "policy not restored: %s" % got.get("policy"))
            m = ctl_json(args.ctl, second.address, "membership", job)
            check(int(m["version"]) > old_version,
                  "membership version %s is not above the old %d" % (m["version"], old_version))
            forced = [e for e in m.get("excluded", []) if e["rank"] == FORCED_RANK]
            check(len(forced) == 1 and "FORCED" in forced[0].get("reason", ""),
                  "rank %d is not force-excluded after the restart: %s" % (FORCED_RANK, m))
            workers = ctl_json(args.ctl, second.address, "worker", job, str(FORCED_RANK))
            check(workers.get("override") == "RANK_OVERRIDE_FORCE_EXCLUDE",
                  "rank override not restored: %s" % workers)

            # Old events with their sequences, over gRPC and REST.
            new_events = ctl_json(args.ctl, second.address, "events", job,
                                  "--limit", "10000").get("events", [])
            old_by_seq = {e["sequence"]: e for e in old_events}
            new_by_seq = {e["sequence"]: e for e in new_events}
            for seq, e in old_by_seq.items():
                check(seq in new_by_seq and new_by_seq[seq]["kind"] == e["kind"]
                      and new_by_seq[seq].get("message") == e.get("message"),
                      "event %s lost or changed by the restart: %s vs %s"
                      % (seq, e, new_by_seq.get(seq)))
            rest = http_json(second.http_address, "/v1/events?limit=10000")
            rest_seqs = {e["sequence"] for e in rest.get("events", [])}
            check(set(old_by_seq) <= rest_seqs, "REST /v1/events lacks old sequences %s"
                  % sorted(set(old_by_seq) - rest_seqs))
            max_old = max(int(s) for s in old_by_seq)
            # The restore itself journals a membership event above the old ones.
            restored = [e for e in new_events if int(e["sequence"]) > max_old]
            check(restored, "no new event after the restart: %s" % new_events[-3:])
            # And a new admin event keeps counting up.
            ctl_json(args.ctl, second.address, "override", job, "1", "include")
            latest = ctl_json(args.ctl, second.address, "events", job, "--limit", "10000")
            seqs = [int(e["sequence"]) for e in latest.get("events", [])]
            check(seqs == sorted(seqs) and len(set(seqs)) == len(seqs),
                  "sequences not strictly ascending: %s" % seqs)
            check(seqs[-1] > max(int(e["sequence"]) for e in restored),
                  "new event sequence %d not above the restored ones" % seqs[-1])
            check(second.stop() == 0, "second daemon did not exit 0 on SIGTERM")

        # 3. Startup errors name the path and exit 2.
        garbage = os.path.join(workdir, "garbage.db")
        with open(garbage, "wb") as f:
            f.write(b"not a database " * 1000)
        out = startup_error(args.stragglerd, garbage, workdir)
        check("not a database" in out, "no SQLite reason in:\n%s" % out)
        blocker = os.path.join(workdir, "blocker")
        with open(blocker, "w") as f:
            f.write("x")
        startup_error(args.stragglerd, os.path.join(blocker, "sub", "state.db"), workdir)
    finally:
        if sim is not None and sim.poll() is None:
            sim.kill()
            sim.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_main(test, "stragglerd", "sim", "ctl")
