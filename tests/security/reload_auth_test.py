#!/usr/bin/env python3
"""SIGHUP must not open the daemon by accident (issue 28, item 10), against
the real stragglerd.

The daemon starts with an admin token (auth.token_file) and limits.max_jobs 2.
Each reload below must be refused, logged at error ("SIGHUP: config rejected,
keeping the running one: ..."), counted in
straggler_config_reloads_total{result="rejected"}, and leave the token in
force (an admin REST call without it: 401) and max_jobs at 2 (a third job is
refused):

1. an empty file (before: every key back to its default, the token off, an
   info line only);
2. a file of comments only;
3. a file that leaves out the auth section (the token would go), named in
   the error.

Then the same file with `security: {allow_downgrade: true}` is applied: the
token is off (the call answers 404, no such job), said by a warning, counted
as applied.

    reload_auth_test.py --stragglerd PATH --probe PATH
"""

import os
import signal
import sys
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import (Daemon, check, daemon_metric, in_workdir, run, run_main,  # noqa: E402
                     wait_for)

REJECTED = "SIGHUP: config rejected, keeping the running one: "


def write(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def log_of(daemon):
    with open(daemon.log_path) as f:
        return f.read()


def admin_status(daemon):
    """The HTTP status of an admin call without a token (POST reset of a job
    that does not exist): 401 while the token is required, else 404."""
    request = urllib.request.Request("http://%s/v1/jobs/no-such-job/reset" % daemon.http_address,
                                     data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def jobs_admitted(args, daemon, job):
    """Opens one stream of `job` (stream_probe): 1 when the daemon took it,
    0 when it refused it (limits.max_jobs)."""
    res = run([args.probe, "--target", daemon.address, "--job", job, "--streams", "1",
               "--hold-seconds", "0", "--wait-seconds", "20"], 60)
    check(res.returncode in (0, 1), "stream_probe failed:\n%s%s" % (res.stdout, res.stderr))
    return 1 if "opened=1 " in res.stdout else 0


def reload(daemon):
    """SIGHUP, then waits for the reload's outcome in the log: 'rejected' or
    'applied'."""
    def outcomes():
        log = log_of(daemon)
        return log.count(REJECTED), log.count("config reloaded from")

    before = outcomes()
    daemon.proc.send_signal(signal.SIGHUP)
    after = wait_for("the reload's outcome in the log", lambda: outcomes() != before and
                     outcomes(), timeout=15)
    return "rejected" if after[0] > before[0] else "applied"


def reloads_counted(daemon, result):
    return daemon_metric(daemon, "straggler_config_reloads_total", {"result": result})


def test(args):
    def body(workdir):
        token = write(os.path.join(workdir, "token"), "0123456789abcdef0123456789abcdef\n")
        good = "auth:\n  token_file: %s\nlimits:\n  max_jobs: 2\n" % token
        config = write(os.path.join(workdir, "stragglerd.yaml"), good, 0o644)
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            check(admin_status(d) == 401, "the admin token is not in force at start")
            check(jobs_admitted(args, d, "job-a") == 1, "job-a refused")
            check(jobs_admitted(args, d, "job-b") == 1, "job-b refused")

            cases = [
                ("an empty file", "", "holds no key (empty or only comments)"),
                ("a file of comments only", "# rewritten by config management\n#\n",
                 "holds no key (empty or only comments)"),
                ("a file without the auth section", "limits:\n  max_jobs: 2\n",
                 "would turn off the admin token (auth.token_file=%s)" % token),
            ]
            rejected = 0
            for what, text, reason in cases:
                write(config, text, 0o644)
                outcome = reload(d)
                log = log_of(d)
                check(outcome == "rejected",
                      "%s: the reload was applied, not refused:\n%s" % (what, d.log_tail()))
                rejected += 1
                check(reloads_counted(d, "rejected") == rejected,
                      "%s: straggler_config_reloads_total{result=\"rejected\"} = %s, expected %d"
                      % (what, reloads_counted(d, "rejected"), rejected))
                lines = [line for line in log.splitlines() if REJECTED in line]
                check(len(lines) == rejected and reason in lines[-1] and "[error]" in lines[-1],
                      "%s: no error line naming %r:\n%s" % (what, reason, d.log_tail()))
                check(admin_status(d) == 401,
                      "%s: an admin call without the token was let through" % what)
                check(jobs_admitted(args, d, "job-c") == 0,
                      "%s: a third job was taken (limits.max_jobs back to its default)" % what)
                print("SIGHUP with %s: refused (%s)" % (what, reason))

            write(config, "limits:\n  max_jobs: 2\nsecurity:\n  allow_downgrade: true\n", 0o644)
            check(reload(d) == "applied",
                  "the reload that says allow_downgrade was refused:\n%s" % d.log_tail())
            check(reloads_counted(d, "applied") == 1, "the applied reload was not counted")
            check(admin_status(d) == 404,
                  "the token is still required after an allowed downgrade")
            check("reload: the admin token (auth.token_file=%s) turned off" % token in log_of(d),
                  "no warning for the allowed downgrade:\n%s" % d.log_tail())
            print("SIGHUP with security.allow_downgrade: applied, token off, warned")
            check(d.stop() == 0, "stragglerd did not exit 0")

    in_workdir("stragglerd-reload-auth-", body)


if __name__ == "__main__":
    run_main(test, "stragglerd", "probe")
