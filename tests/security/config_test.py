#!/usr/bin/env python3
"""An operator's config mistakes against the real stragglerd (issue 15, item 6).

1. --config naming a directory: exit 2 naming the path (it ran on defaults).
2. A key given twice: exit 2 naming the key and both lines (one was dropped).
3. A token file others can read, or a short token: a warning at start naming
   the file and the mode or length.
4. SIGHUP naming a tls.cert_file that does not exist: the reload is refused
   naming the file (the next restart would have failed).
5. SIGHUP changing a restart-only key (persistence.synchronous,
   http.threads): a warning naming each key with its old and new value.

    config_test.py --stragglerd PATH
"""

import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import Daemon, check, in_workdir, run, wait_for, run_main  # noqa: E402


def write(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def refused(args, what, extra, expected):
    res = run([args.stragglerd, *extra, "--grpc-address", "127.0.0.1:0",
               "--http-address", "127.0.0.1:0"], 30)
    out = res.stdout + res.stderr
    check(res.returncode == 2, "%s: exit %d, expected 2:\n%s" % (what, res.returncode, out))
    check(expected in out, "%s: the error lacks %r:\n%s" % (what, expected, out))
    print("%s: refused" % what)


def log_of(daemon):
    with open(daemon.log_path) as f:
        return f.read()


def test(args):
    def body(workdir):
        # 1, 2.
        refused(args, "--config DIRECTORY", ["--config", workdir],
                "config file %s is a directory, not a YAML file" % workdir)
        dup = write(os.path.join(workdir, "dup.yaml"),
                    "policy:\n  limit: 5\n  threshold_factor: 2\n  limit: 50\n", 0o644)
        refused(args, "duplicate key", ["--config", dup],
                "%s:4: duplicate key 'limit' (first given on line 2)" % dup)

        # 3.
        token = write(os.path.join(workdir, "token"), "abc\n", 0o644)
        state = os.path.join(workdir, "state.db")
        text = ("auth:\n  token_file: %s\npersistence:\n  path: %s\n" % (token, state))
        config = write(os.path.join(workdir, "stragglerd.yaml"), text, 0o644)
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            log = log_of(d)
            check("auth.token_file %s has mode 0644: group or others may read the token" % token
                  in log, "no warning about the token file's mode:\n%s" % log)
            check("auth.token_file %s holds a 3-character token" % token in log,
                  "no warning about the short token:\n%s" % log)
            check("abc" not in log.replace(workdir, ""), "the token appears in the log")
            print("token file 0644, 3 characters: warned")

            # 4.
            missing = os.path.join(workdir, "no-such-cert.pem")
            write(config, text + "tls:\n  cert_file: %s\n  key_file: %s\n" % (missing, missing),
                  0o644)
            d.proc.send_signal(signal.SIGHUP)
            wait_for("the refused reload", lambda: "SIGHUP: config rejected, keeping the running "
                     "one: " in log_of(d) and missing in log_of(d), timeout=15)
            print("SIGHUP with a missing tls.cert_file: refused")

            # 5.
            write(config, "auth:\n  token_file: %s\npersistence:\n  path: %s\n  synchronous: full\n"
                  "http:\n  threads: 9\n" % (token, state), 0o644)
            d.proc.send_signal(signal.SIGHUP)
            wait_for("the restart warnings", lambda: "config reloaded from" in log_of(d),
                     timeout=15)
            log = log_of(d)
            for key in ("persistence.synchronous (normal -> full)", "http.threads (4 -> 9)"):
                check("reload: %s needs a restart to take effect" % key in log,
                      "no restart warning for %s:\n%s" % (key, d.log_tail()))
            print("SIGHUP changing restart-only keys: warned by name")
            check(d.stop() == 0, "stragglerd did not exit 0")

    in_workdir('stragglerd-sec-config-', body)


if __name__ == "__main__":
    run_main(test, "stragglerd")
