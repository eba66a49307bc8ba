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

Then the defaults, each stream on its own connection (a rank of a direct
client each): 2 100 streams against max_streams 2048, whose quota is the 32
MiB it was (security:oversize_memory holds that to its bound). The ranks
never report, so after 1 s each turns unresponsive and a membership listing
the excluded ones goes to every stream at once (the moment that cut 3 809 of
4 200 such streams with a quota of 32 MiB): the 2048 taken must all stay
open, the 52 others be refused by the limit. Skipped, saying so, when the
open-file limit cannot be raised to ~2 200.

    stream_quota_test.py --stragglerd PATH --probe PATH
"""

import os
import re
import resource
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import (Daemon, check, daemon_get, daemon_metric, in_workdir, run,  # noqa: E402
                     run_main, wait_for)

MAX_STREAMS = 10000
EXTRA = 500
CONNECTIONS = 100
DEFAULT_MAX_STREAMS = 2048  # limits.max_streams' default
DEFAULT_EXTRA = 52


def run_probe(args, daemon, streams, connections, hold_s):
    """stream_probe's (opened, open after the hold, {status: count}, output)."""
    res = run([args.probe, "--target", daemon.address, "--job", "many",
               "--streams", str(streams), "--connections", str(connections),
               "--hold-seconds", str(hold_s), "--wait-seconds", "60"], 150)
    out = res.stdout + res.stderr
    print(out.strip())
    check(res.returncode == 0, "stream_probe exited %d:\n%s" % (res.returncode, out))
    m = re.search(r"opened=(\d+) open_after_hold=(\d+)", out)
    check(m is not None, "no counts from stream_probe:\n%s" % out)
    statuses = {s: int(n) for s, n in re.findall(r"^status (.*): (\d+)$", out, re.M)}
    return int(m.group(1)), int(m.group(2)), statuses, out


def check_limit_applies(args, daemon, limit, extra, connections, hold_s):
    """`limit` + `extra` streams: exactly `limit` taken and held, the rest
    refused by limits.max_streams (counted), none cut or cancelled."""
    opened, held, statuses, out = run_probe(args, daemon, limit + extra, connections, hold_s)
    # stream_probe prints a status's code and its message's first 60 characters.
    refused = "8 " + ("%d ingest streams are open (limits.max_streams=%d); retry later"
                      % (limit, limit))[:60]
    check(opened == limit and held == limit,
          "%d streams taken and %d open after the hold, expected %d each "
          "(gRPC cut some?):\n%s" % (opened, held, limit, out))
    check(statuses == {refused: extra},
          "streams ended otherwise than refused by limits.max_streams: %s" % statuses)
    too_many = wait_for("the refusals counted", lambda: daemon_metric(
        daemon, "straggler_streams_refused_total", {"reason": "too_many_streams"}))
    check(too_many == extra, "too_many_streams = %s, expected %d" % (too_many, extra))
    m = re.search(r"^straggler_streams_cancelled_total (\S+)$", daemon_get(daemon, "/metrics"),
                  re.M)
    cancelled = float(m.group(1)) if m else None
    check(cancelled == 0, "straggler_streams_cancelled_total = %s, expected 0" % cancelled)
    print("%d streams over %d connections: %d taken and held, %d refused by "
          "limits.max_streams, none cut" % (limit + extra, connections, limit, extra))


def raise_open_files(wanted):
    """Raises this process's (and so its children's) open-file limit to
    `wanted` when the hard limit allows; whether it is now at least that."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return True
    if hard != resource.RLIM_INFINITY and hard < wanted:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return True


def test(args):
    def body(workdir):
        config = os.path.join(workdir, "stragglerd.yaml")
        with open(config, "w") as f:
            f.write("limits:\n  max_streams: %d\n" % MAX_STREAMS)
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            check_limit_applies(args, d, MAX_STREAMS, EXTRA, CONNECTIONS, hold_s=3)
            check(d.stop() == 0, "stragglerd did not exit 0")

        if not raise_open_files(DEFAULT_MAX_STREAMS + DEFAULT_EXTRA + 200):
            print("SKIPPED the default limit on %d connections: the open-file limit is %s"
                  % (DEFAULT_MAX_STREAMS + DEFAULT_EXTRA,
                     resource.getrlimit(resource.RLIMIT_NOFILE)))
            return
        os.rename(d.log_path, d.log_path + ".1")
        with open(config, "w") as f:
            f.write("policy:\n  unresponsive_after_seconds: 1\n")
        with Daemon(args.stragglerd, workdir, extra_args=["--config", config]) as d:
            check_limit_applies(args, d, DEFAULT_MAX_STREAMS, DEFAULT_EXTRA,
                                DEFAULT_MAX_STREAMS + DEFAULT_EXTRA, hold_s=5)
            check(d.stop() == 0, "stragglerd did not exit 0")

    in_workdir("stragglerd-stream-quota-", body)


if __name__ == "__main__":
    run_main(test, "stragglerd", "probe")
