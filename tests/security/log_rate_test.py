#!/usr/bin/env python3
"""Log floods against the real stragglerd (issue 28, item 13): lines that one
client (or one large job) can repeat are rate-limited, and what was left out
is summed up, so the log neither floods nor loses count.

1. Refusals: with limits.max_jobs 1 taken, one client opens 3000 streams of
   another job (all refused, too_many_jobs). Before: 3000 warnings (99 000,
   15.5 MB, in the issue's run). Now at most 20 per 10 s are logged one by
   one, the rest in "N more ingest streams refused in the last 10 s" lines,
   and those lines account for every refusal
   straggler_streams_refused_total{reason="too_many_jobs"} counts.
2. A large job: 2000 streams, one rank each, open at once, never report
   (each rank turns unresponsive after 1 s: an event each, a guard_blocked
   for most), and close. Before: a line per stream and per event (~17 500
   in the issue's 10 000-stream run). Now the streams opened (20 per 10 s)
   and the job events (100 per 10 s) are bounded the same way, and the
   summaries account for every stream and every event
   straggler_events_total counts.

    log_rate_test.py --stragglerd PATH --probe PATH
"""

import os
import re
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import (Daemon, check, daemon_get, daemon_metric, in_workdir, run,  # noqa: E402
                     run_main, wait_for)

BURST, INTERVAL_S = 20, 10  # the daemon's budget: 20 lines per 10 s per kind...
EVENT_BURST = 100  # ...and 100 for job events
REFUSED_STREAMS = 3000
JOB_STREAMS = 2000


def log_lines(daemon):
    with open(daemon.log_path) as f:
        return f.read().splitlines()


def summed(lines, what):
    """The counts of the "N more <what> in the last 10 s" summary lines."""
    pattern = re.compile(r"\] (\d+) more %s in the last %d s" % (re.escape(what), INTERVAL_S))
    return sum(int(m.group(1)) for m in map(pattern.search, lines) if m)


def probe(args, daemon, job, streams, connections, hold_s=1):
    res = run([args.probe, "--target", daemon.address, "--job", job, "--streams", str(streams),
               "--connections", str(connections), "--hold-seconds", str(hold_s),
               "--wait-seconds", "60"], 120)
    check(res.returncode == 0, "stream_probe --job %s exited %d:\n%s%s"
          % (job, res.returncode, res.stdout, res.stderr[-2000:]))
    return res.stdout


def check_bounded(lines, what, is_one, started, total, burst=BURST):
    """At most `burst` lines that is_one(line) per started 10 s window since
    `started`, and those plus the summaries of `what` make `total`."""
    one_by_one = [line for line in lines if is_one(line)]
    windows = int((time.monotonic() - started) // INTERVAL_S) + 1
    check(len(one_by_one) <= burst * windows,
          "%d lines of %s one by one in %d windows of %d s (at most %d each):\n%s"
          % (len(one_by_one), what, windows, INTERVAL_S, burst, "\n".join(one_by_one[:5])))
    check(len(one_by_one) + summed(lines, what) == total,
          "%s: %d lines one by one + %d in summaries != %d"
          % (what, len(one_by_one), summed(lines, what), total))
    return len(one_by_one)


def events_total(daemon):
    """The sum of straggler_events_total over its kinds."""
    text = daemon_get(daemon, "/metrics")
    return sum(float(v) for v in re.findall(r"^straggler_events_total\{[^}]*\} (\S+)$", text,
                                            re.M))


def test(args):
    def body(workdir):
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("limits:\n  max_jobs: 1\n")
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            probe(args, d, "occupant", 1, 1)
            started = time.monotonic()
            out = probe(args, d, "flood", REFUSED_STREAMS, 20)
            check("opened=0 " in out, "streams of a second job were taken:\n%s" % out)
            refused = wait_for("the refusals counted", lambda: daemon_metric(
                d, "straggler_streams_refused_total", {"reason": "too_many_jobs"}))
            check(refused == REFUSED_STREAMS, "%s refusals counted, expected %d"
                  % (refused, REFUSED_STREAMS))
            warned = sum("ingest stream from" in line for line in log_lines(d))
            windows = int((time.monotonic() - started) // INTERVAL_S) + 1
            check(warned <= BURST * windows, "%d refusals logged one by one in %d s (a flood)"
                  % (warned, time.monotonic() - started))
            # The summary comes once the window that held them has ended.
            wait_for("the summary of the refusals",
                     lambda: summed(log_lines(d), "ingest streams refused") > 0,
                     timeout=INTERVAL_S * 3)
            n = check_bounded(log_lines(d), "ingest streams refused",
                              lambda line: "ingest stream from" in line, started,
                              REFUSED_STREAMS)
            print("%d refused streams: %d warnings one by one, the rest summed up"
                  % (REFUSED_STREAMS, n))

        # 2. A large job: a fresh daemon, so that the budget is its own. Its
        # ranks never report: after 1 s each turns unresponsive (an event
        # each, and a guard_blocked for most), as the 10 000 did after 30 s.
        os.rename(d.log_path, d.log_path + ".1")
        with open(config, "w") as f:
            f.write("policy:\n  unresponsive_after_seconds: 1\n")
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            started = time.monotonic()
            out = probe(args, d, "large", JOB_STREAMS, JOB_STREAMS // 10, hold_s=4)
            check("opened=%d " % JOB_STREAMS in out, "not every stream was taken:\n%s" % out)
            # Each rank's event, and the guard's, once the window has ended.
            wait_for("the summaries of the streams opened and the job events",
                     lambda: summed(log_lines(d), "ingest streams opened") > 0
                     and summed(log_lines(d), "job events") > 0, timeout=INTERVAL_S * 3)
            time.sleep(1.5)  # the tick that sums up the last window
            lines = log_lines(d)
            events = events_total(d)
            check(events >= JOB_STREAMS, "%d events, expected one per rank at least" % events)
            n = check_bounded(lines, "ingest streams opened",
                              lambda line: "job=large run='' stream from" in line, started,
                              JOB_STREAMS)
            e = check_bounded(lines, "job events",
                              lambda line: re.search(r"\[info\] job=large (?!run=')", line),
                              started, events, burst=EVENT_BURST)
            info = [line for line in lines if "[info]" in line]
            windows = int((time.monotonic() - started) // INTERVAL_S) + 1
            check(len(info) <= 20 + (BURST + EVENT_BURST + 2) * windows,
                  "%d info lines for a job of %d streams:\n%s"
                  % (len(info), JOB_STREAMS, "\n".join(info[:40])))
            print("%d streams of one job: %d info lines in all (%d of %d streams opened, %d of "
                  "%d events one by one; before: a line each)"
                  % (JOB_STREAMS, len(info), n, JOB_STREAMS, e, events))
            check(d.stop() == 0, "stragglerd did not exit 0")

    in_workdir("stragglerd-log-rate-", body)


if __name__ == "__main__":
    run_main(test, "stragglerd", "probe")
