#!/usr/bin/env python3
"""Hostile durations through every entry point of a policy (issue 15, item 3).

unresponsive_after_seconds: 1e10 once passed every check and overflowed the
int64 nanoseconds of the engine's clock: every rank was declared unresponsive
on every tick. Against the real stragglerd, the value must be refused with a
message naming the value and its upper bound (604800 s, 7 days) through:

1. the config file at start (exit 2);
2. a SIGHUP reload (the running policy stays);
3. REST PUT /v1/jobs/{job}/policy (400);
4. gRPC AdminService.SetPolicy (stragglerctl policy, INVALID_ARGUMENT).
Then the job's healthy ranks are still healthy and its policy unchanged.

    policy_overflow_test.py --stragglerd PATH --ctl PATH --sim PATH
"""

import http.client
import json
import os
import signal
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import Daemon, check, in_workdir, run, wait_for, run_main  # noqa: E402

HOSTILE = "1e10"
REFUSAL = ("unresponsive_after_seconds=1e+10 is above its upper bound: must be <= 604800")


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def rest(address, method, path, body=None):
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, res.read().decode()
    finally:
        conn.close()


def log_of(daemon):
    with open(daemon.log_path) as f:
        return f.read()


def test(args):
    def body(workdir):
        # 1. The config file at start.
        bad = write(os.path.join(workdir, "bad.yaml"),
                    "policy:\n  limit: 5\n  unresponsive_after_seconds: %s\n" % HOSTILE)
        res = run([args.stragglerd, "--config", bad, "--grpc-address", "127.0.0.1:0",
                   "--http-address", "127.0.0.1:0"], 30)
        out = res.stdout + res.stderr
        check(res.returncode == 2, "config file: exit %d, expected 2:\n%s" % (res.returncode, out))
        check("%s:2: policy: %s" % (bad, REFUSAL) in out,
              "config file: the refusal lacks file, line, value or bound:\n%s" % out)
        print("config file: refused at start")

        good_text = "policy:\n  unresponsive_after_seconds: 30\n"
        config = write(os.path.join(workdir, "stragglerd.yaml"), good_text)
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            job = "overflow"
            sim = run([args.sim, "--daemon", d.address, "--job", job, "--ranks", "4",
                       "--iterations", "20", "--iteration-ms", "5", "--seed", "3", "--quiet"], 120)
            check(sim.returncode == 0, "straggler-sim failed:\n%s%s" % (sim.stdout, sim.stderr))

            # 2. SIGHUP with the hostile value: refused, the running config stays.
            write(config, "policy:\n  unresponsive_after_seconds: %s\n" % HOSTILE)
            d.proc.send_signal(signal.SIGHUP)
            wait_for("the SIGHUP refusal in the log",
                     lambda: "SIGHUP: config rejected, keeping the running one: %s:2: policy: %s"
                     % (config, REFUSAL) in log_of(d), timeout=15)
            write(config, good_text)
            print("SIGHUP: refused")

            # 3. REST PUT .../policy.
            status, body = rest(d.http_address, "PUT", "/v1/jobs/%s/policy" % job,
                                json.dumps({"unresponsiveAfterSeconds": 1e10}))
            check(status == 400, "REST: status %d, expected 400: %s" % (status, body))
            check(REFUSAL in body, "REST: the refusal lacks value or bound: %s" % body)
            print("REST PUT policy: 400")

            # 4. gRPC SetPolicy through stragglerctl.
            res = run([args.ctl, "--daemon", d.address, "--timeout-ms", "5000", "policy", job,
                       "--unresponsive-after-seconds", HOSTILE], 30)
            check(res.returncode != 0, "gRPC SetPolicy accepted %s:\n%s" % (HOSTILE, res.stdout))
            check(REFUSAL in res.stderr,
                  "gRPC: the refusal lacks value or bound:\n%s" % res.stderr)
            print("gRPC SetPolicy: refused")

            # The job kept its policy and its ranks.
            status, body = rest(d.http_address, "GET", "/v1/jobs/%s" % job)
            check(status == 200, "GET job: %d %s" % (status, body))
            job_json = json.loads(body)
            check(job_json["policy"]["unresponsiveAfterSeconds"] == 30,
                  "the policy changed: %s" % job_json["policy"])
            check("no report for" not in log_of(d),
                  "a rank was declared unresponsive:\n%s" % d.log_tail())
            check(d.stop() == 0, "stragglerd did not exit 0")

    in_workdir('stragglerd-sec-overflow-', body)


if __name__ == "__main__":
    run_main(test, "stragglerd", "ctl", "sim")
