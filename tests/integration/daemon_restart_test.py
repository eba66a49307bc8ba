#!/usr/bin/env python3
"""A daemon restarted without a state database under a running job with an
exclusion in force: straggler-sim (4 ranks, each its own client, straight to
the daemon) with rank 3 forced out, the daemon killed with SIGKILL mid-run
and started again on the same port with nothing on disk.

The new daemon knows only what the clients' hellos carry: the version they
hold with its excluded ranks (StreamHello.known_excluded) and how far they
are (StreamHello.reported_iteration). Its first version must

  * keep rank 3 out (republishing "everyone" would readmit it at an iteration
    the job has passed, while ranks not yet reconnected keep it out), and
  * take effect after the iterations the ranks reached while it was down
    (not at the old version's effective iteration + 1, long passed).

Checked: the sim finishes every iteration with no agreement violation (no
two ranks ran a step with different active sets) and no collective timeout;
the new daemon's first version excludes rank 3 and takes effect after the
highest iteration the old daemon saw. Rank 3 is held as a straggler, not as
forced: a hello needs no token, so it cannot create an operator's override
(docs/security.md); with no state database the override is gone, and the
held rank is released by the normal rules (here at once: exclusion_enabled
is false), so at the end no rank is out and rank 3 has no override.
Ranks that reconnect later than others may run some steps on the old version
number with the same active set (version_splits): harmless, and reported.
"""

import json
import os
import subprocess
import tempfile
import time

from agent_test import free_port, http_get, http_put, wait_for
from harness import Daemon, check, finish, run_main

JOB = "restart-no-db"
RANKS = 4
ITERATIONS = 700
OUT = 3


def get(daemon, path):
    return json.loads(http_get(daemon.http_address, path))


def highest(daemon):
    return int(get(daemon, "/v1/jobs/" + JOB).get("highestIteration", "0"))


def test(args):
    with tempfile.TemporaryDirectory(prefix="daemon-restart-") as work:
        config = os.path.join(work, "stragglerd.yaml")
        with open(config, "w") as f:
            # Only the test's override excludes ranks.
            f.write("policy:\n  exclusion_enabled: false\n")
        address = "127.0.0.1:%d" % free_port()
        old = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-1",
                     extra_args=["--config", config])
        new = Daemon(args.stragglerd, work, grpc_address=address, name="stragglerd-2",
                     extra_args=["--config", config])
        report = os.path.join(work, "sim.json")
        sim = None
        try:
            old.start()
            sim = subprocess.Popen(
                [args.sim, "--daemon", address, "--job", JOB, "--ranks", str(RANKS),
                 "--iterations", str(ITERATIONS), "--iteration-ms", "20", "--noise", "0.05",
                 "--seed", "11", "--membership-timeout-ms", "100", "--quiet",
                 "--report", report],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            wait_for("iteration 60", lambda: highest(old) >= 60)
            excl = http_put(old.http_address, "/v1/jobs/%s/workers/%d/override" % (JOB, OUT),
                            {"override": "force_exclude", "reason": "test"})
            v_excl, e_excl = int(excl["version"]), int(excl["effectiveIteration"])
            # Well past the exclusion's effective iteration: in force on every rank.
            wait_for("iteration %d" % (e_excl + 40), lambda: highest(old) >= e_excl + 40)

            seen_by_old = highest(old)
            old.proc.kill()  # SIGKILL: nothing is written anywhere (no --state-db)
            old.proc.wait()
            time.sleep(1.5)  # the ranks go on meanwhile, well past what the old daemon saw
            check(sim.poll() is None, "the sim ended while the daemon was down")
            new.start()

            _, err = finish(sim, "the sim (a collective hung?)", 180)
            with open(report) as f:
                rep = json.load(f)
            check(rep["iterations"] == ITERATIONS,
                  "the sim finished %d of %d iterations" % (rep["iterations"], ITERATIONS))
            for key in ("agreement_violations", "collective_timeouts", "rejoined_behind",
                        "reports_rejected"):
                check(rep.get(key, 0) == 0, "sim: %s = %r\n%s" % (key, rep.get(key), err))
            check(rep["membership_timeouts"] > 0,
                  "no MembershipFor timed out: the outage was not felt")

            after = [m for m in rep["memberships"] if m["version"] > v_excl]
            check(after, "no rank received a version of the restarted daemon: %r"
                  % rep["memberships"])
            floor = min(after, key=lambda m: m["version"])
            check([e["rank"] for e in floor["excluded"]] == [OUT],
                  "the restarted daemon's first version v%d excludes %r, expected [%d]"
                  % (floor["version"], floor["excluded"], OUT))
            check(floor["effective_iteration"] > seen_by_old,
                  "the restarted daemon's first version v%d takes effect at %d, not after "
                  "iteration %d, which the ranks had passed before the restart"
                  % (floor["version"], floor["effective_iteration"], seen_by_old))
            check(floor["applied_at"], "no rank applied v%d" % floor["version"])

            m = get(new, "/v1/jobs/%s/membership" % JOB)
            check(not m.get("excluded"),
                  "the restarted daemon still excludes %r at the end: a hello's forced "
                  "exclusion must not become an override" % m.get("excluded"))
            w = get(new, "/v1/jobs/%s/workers/%d" % (JOB, OUT))
            check(w.get("override", "RANK_OVERRIDE_UNSPECIFIED") != "RANK_OVERRIDE_FORCE_EXCLUDE",
                  "rank %d has an override after the restart without a state database: %r"
                  % (OUT, w))
            print("old daemon saw iteration %d (exclusion v%d at %d); the restarted daemon's "
                  "first version v%d keeps rank %d out from iteration %d (held, then released); "
                  "%d version splits, 0 agreement violations"
                  % (seen_by_old, v_excl, e_excl, floor["version"], OUT,
                     floor["effective_iteration"], rep.get("version_splits", 0)))
            check(new.stop() == 0, "the restarted daemon did not exit 0")
        finally:
            if sim is not None and sim.poll() is None:
                sim.kill()
            old.__exit__(None, None, None)
            new.__exit__(None, None, None)


if __name__ == "__main__":
    run_main(test, "stragglerd", "sim")
