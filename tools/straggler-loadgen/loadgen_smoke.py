"""bench:loadgen_smoke - a real stragglerd (127.0.0.1:0, --ready-file) driven by
straggler-loadgen for ~3 s with 1000 ranks: exit 0, reports accepted, none
rejected, the JSON well-formed; --work-fields reports carry work and both
phases, which the daemon keeps (its export shows them); then the soak mode for 3 s (--soak-minutes
0.05 --soak-interval 1): one line and one JSON sample per second, each with
the daemon's VmRSS. Then what a user sees when things go wrong: --help shows
the defaults; an unreachable --daemon is named with the gRPC status; a daemon
with a tiny per-stream rate limit (stream_reports_burst 100 < --batch 250, so
the first batch of each stream is cut) ends --find-saturation with the rate
limit as the stop reason and one rate_limited line per run, not per stream;
the saturation JSON records the step duration, not --duration. No timing
asserts.

    loadgen_smoke.py --stragglerd PATH --loadgen PATH --harness-dir DIR

Python 3 standard library only (tests/integration/harness.py).
"""

import argparse
import json
import os
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stragglerd", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--harness-dir", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.harness_dir)
    import harness
    from harness import check

    def test():
        with tempfile.TemporaryDirectory() as tmp, harness.Daemon(args.stragglerd, tmp) as d:
            out = os.path.join(tmp, "loadgen.json")
            cmd = [args.loadgen, "--ready-file", d.ready_file, "--ranks", "1000",
                   "--streams", "4", "--batch", "250", "--rate", "100000",
                   "--duration", "3", "--job", "smoke", "--json", out]
            p = harness.run(cmd, timeout=60)
            print(p.stdout)
            check(p.returncode == 0, "straggler-loadgen exited %d:\n%s\n%s\ndaemon log:\n%s"
                  % (p.returncode, p.stdout, p.stderr, d.log_tail()))
            with open(out) as f:
                r = json.load(f)
            check(r["accepted"] > 0, "no report accepted: %r" % r)
            check(r["rejected"] == 0, "%d reports rejected" % r["rejected"])
            step = r["steps"][0]
            check(step["batches_acked"] > 0, "no batch acknowledged: %r" % step)
            check(r["memory"]["daemon_pid"] == d.proc.pid,
                  "the pid was not read from the ready file: %r" % r["memory"])
            check(r["memory"]["rss_after_kib"] is not None, "VmRSS not read: %r" % r["memory"])

            # --work-fields: every report carries work and both phases, and
            # the daemon keeps them (its export shows them).
            cmd = [args.loadgen, "--ready-file", d.ready_file, "--ranks", "1000",
                   "--streams", "2", "--batch", "250", "--rate", "20000", "--duration", "1",
                   "--job", "smoke-work", "--work-fields", "--quiet"]
            p = harness.run(cmd, timeout=60)
            check(p.returncode == 0, "straggler-loadgen --work-fields exited %d:\n%s\n%s"
                  % (p.returncode, p.stdout, p.stderr))
            kept = harness.daemon_get(d, "/v1/jobs/smoke-work/reports", limit=1)["reports"]
            check(kept and kept[0].get("work", 0) >= 4096 and "inputWaitSeconds" in kept[0]
                  and abs(kept[0].get("optimizerSeconds", 0) - 0.01) < 1e-6,  # kept as a float
                  "--work-fields: the daemon kept %r" % kept[:1])

            # The soak mode, shortened: 3 samples of 1 s, each with the
            # daemon's VmRSS (BENCHMARKS.md "Soak" has the 10-minute run).
            soak = os.path.join(tmp, "soak.json")
            cmd = [args.loadgen, "--ready-file", d.ready_file, "--ranks", "1000",
                   "--streams", "2", "--batch", "250", "--rate", "20000",
                   "--soak-minutes", "0.05", "--soak-interval", "1", "--job", "soak",
                   "--json", soak]
            p = harness.run(cmd, timeout=60)
            print(p.stdout)
            check(p.returncode == 0, "straggler-loadgen --soak-minutes exited %d:\n%s\n%s"
                  % (p.returncode, p.stdout, p.stderr))
            check(p.stdout.count("soak ") >= 3 and "daemon VmRSS" in p.stdout,
                  "no per-sample soak lines:\n%s" % p.stdout)
            with open(soak) as f:
                r = json.load(f)
            samples = r["soak"]["samples"]
            check(len(samples) == 3, "expected 3 soak samples: %r" % samples)
            check(all(s["rss_kib"] and s["accepted_per_s"] > 0 for s in samples),
                  "a soak sample without VmRSS or accepted reports: %r" % samples)
            check([s["elapsed_s"] for s in samples] == sorted(s["elapsed_s"] for s in samples),
                  "soak samples out of order: %r" % samples)
            check(r["soak"]["rss_growth_kib"] is not None, "no VmRSS growth: %r" % r["soak"])
            check(r["rejected"] == 0, "%d reports rejected in the soak" % r["rejected"])
            check(d.stop() == 0, "stragglerd did not exit 0 on SIGTERM")

        # --help tells the defaults (CLI11 prints them as "=VALUE").
        p = harness.run([args.loadgen, "--help"], timeout=30)
        check(p.returncode == 0, "--help exited %d" % p.returncode)
        for default in ("1048576]=1000", "256]=8", "10000]=256", "3600]=10", "1024]=8"):
            check(default in p.stdout, "--help lacks the default %r:\n%s" % (default, p.stdout))

        # Nothing listens on port 1: the error names the address and the status.
        p = harness.run([args.loadgen, "--daemon", "127.0.0.1:1", "--duration", "0.2"],
                        timeout=60)
        check(p.returncode == 1 and "127.0.0.1:1" in p.stderr and "UNAVAILABLE" in p.stderr,
              "unreachable daemon: exit %d, stderr %r" % (p.returncode, p.stderr))

        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "limited.yaml")
            with open(config, "w") as f:
                f.write("limits:\n  stream_reports_per_second: 100\n"
                        "  stream_reports_burst: 100\n")
            with harness.Daemon(args.stragglerd, tmp, extra_args=["--config", config]) as d:
                out = os.path.join(tmp, "sat.json")
                cmd = [args.loadgen, "--ready-file", d.ready_file, "--ranks", "100",
                       "--streams", "3", "--batch", "250", "--rate", "3000",
                       "--find-saturation", "--step-duration", "0.5", "--max-steps", "3",
                       "--job", "limited", "--json", out]
                p = harness.run(cmd, timeout=60)
                print(p.stdout)
                print(p.stderr)
                check(p.returncode == 1, "rate-limited run exited %d" % p.returncode)
                with open(out) as f:
                    r = json.load(f)
                check(r["rejected"] > 0, "no report rejected: %r" % r)
                reason = r["stop_reason"]
                check("rate limit" in reason
                      and "limits.stream_reports_per_second=100 per stream" in reason
                      and "stream_reports_per_second: 0" in reason,
                      "stop reason does not name the rate limit: %r" % reason)
                check(len(r["steps"]) == 1, "steps past the rate limit: %r" % r["steps"])
                lines = [l for l in p.stderr.splitlines() if "rate_limited" in l]
                check(len(lines) == 1 and "on 3 of 3 streams" in lines[0]
                      and "stream_reports_per_second: 0" in lines[0],
                      "expected one rate_limited line for the run:\n%s" % p.stderr)
                check("duration" not in r["config"] and r["config"]["step_duration"] == 0.5,
                      "saturation config: %r" % r["config"])
                check(d.stop() == 0, "stragglerd did not exit 0 on SIGTERM")

    harness.main(test)


if __name__ == "__main__":
    main()
