#!/usr/bin/env python3
"""limits.max_streams is the limit that applies, not gRPC's memory quota
(issue 28, item 12), against the real stragglerd.

10 500 ingest streams at once, multiplexed over 100 connections (cheap for a
2-core machine: ~3 KB a stream), one rank each of one job, against a daemon
with limits.max_streams 10000. Before, the 32 MiB quota could not hold 10 000
open streams: gRPC cut 37-7 396 of them with RST_STREAM ENHANCE_YOUR_CALM
(then GOAWAYs), and no stragglerd metric counted it. Now the quota is sized
from max_streams, so:

- exactly 10 000 streams are taken and stay open through the hold;
- the other 500 are refused by the daemon itself, RESOURCE_EXHAUSTED naming
  limits.max_streams, counted in
  straggler_streams_refused_total{reason="too_many_streams"};
- no stream ends any other way (no RST_STREAM, no GOAWAY), and
  straggler_streams_cancelled_total stays 0.

With the default max_streams (4096) the quota is the 32 MiB it was, which
security:oversize_memory holds to its bound.

    stream_quota_test.py --stragglerd PATH --probe PATH
"""

import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import (Daemon, check, daemon_get, daemon_metric, in_workdir, run,  # noqa: E402
                     run_main, wait_for)

MAX_STREAMS = 10000
EXTRA = 500
CONNECTIONS = 100


def test(args):
    def body(workdir):
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("limits:\n  max_streams: %d\n" % MAX_STREAMS)
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            res = run([args.probe, "--target", d.address, "--job", "many",
                       "--streams", str(MAX_STREAMS + EXTRA), "--connections", str(CONNECTIONS),
                       "--hold-seconds", "3", "--wait-seconds", "60"], 150)
            out = res.stdout + res.stderr
            print(out.strip())
            check(res.returncode == 0, "stream_probe exited %d:\n%s" % (res.returncode, out))
            m = re.search(r"opened=(\d+) open_after_hold=(\d+)", out)
            check(m is not None, "no counts from stream_probe:\n%s" % out)
            opened, held = int(m.group(1)), int(m.group(2))
            statuses = {s: int(n) for s, n in re.findall(r"^status (.*): (\d+)$", out, re.M)}
            # stream_probe prints a status's code and its message's first 60 characters.
            refused = "8 " + ("%d ingest streams are open (limits.max_streams=%d); retry later"
                              % (MAX_STREAMS, MAX_STREAMS))[:60]
            check(opened == MAX_STREAMS and held == MAX_STREAMS,
                  "%d streams taken and %d open after the hold, expected %d each "
                  "(gRPC cut some?):\n%s" % (opened, held, MAX_STREAMS, out))
            check(statuses == {refused: EXTRA},
                  "streams ended otherwise than refused by limits.max_streams: %s" % statuses)
            too_many = wait_for("the refusals counted", lambda: daemon_metric(
                d, "straggler_streams_refused_total", {"reason": "too_many_streams"}))
            check(too_many == EXTRA, "too_many_streams = %s, expected %d" % (too_many, EXTRA))
            m = re.search(r"^straggler_streams_cancelled_total (\S+)$",
                          daemon_get(d, "/metrics"), re.M)
            cancelled = float(m.group(1)) if m else None
            check(cancelled == 0, "straggler_streams_cancelled_total = %s, expected 0" % cancelled)
            print("%d streams: %d taken and held, %d refused by limits.max_streams, none cut"
                  % (MAX_STREAMS + EXTRA, MAX_STREAMS, EXTRA))
            check(d.stop() == 0, "stragglerd did not exit 0")

    in_workdir("stragglerd-stream-quota-", body)


if __name__ == "__main__":
    run_main(test, "stragglerd", "probe")
