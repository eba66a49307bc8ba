#!/usr/bin/env python3
"""`stragglerctl top` on a pseudo-terminal against the real stragglerd fed by
straggler-sim with one straggler: the screen shows the straggler's row as
excluded with its ratio, and a Ctrl-C typed on the terminal (the byte 0x03,
turned into SIGINT by the terminal's line discipline) ends it with status 0.

    stragglerctl_top_test.py --stragglerd PATH --sim PATH --ctl PATH
"""

import argparse
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, TestFailure, check, daemon_get, excluded, main, wait_for  # noqa: E402

JOB = "top-demo"
SLOW_RANK = 3
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def read_until(fd, pid, pattern, timeout):
    """Reads the terminal until the newest frame matches `pattern` (a regex
    over one line); returns the text read."""
    text = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            text += chunk.decode("utf-8", "replace")
            frame = ANSI.sub("", text.rsplit("\x1b[2J", 1)[-1])
            if re.search(pattern, frame, re.M):
                return frame
    raise TestFailure("timed out waiting for /%s/ on stragglerctl top's terminal; last frame:\n%s"
                      % (pattern, ANSI.sub("", text.rsplit("\x1b[2J", 1)[-1])[-3000:]))


def test():
    p = argparse.ArgumentParser()
    for binary in ("stragglerd", "sim", "ctl"):
        p.add_argument("--" + binary, required=True, help="path of " + binary)
    args = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="stragglerctl_top_")
    try:
        with Daemon(args.stragglerd, workdir) as d:
            sim_log = open(os.path.join(workdir, "sim.log"), "w")
            # Slow for the whole run: the straggler stays excluded until the end.
            sim = subprocess.Popen(
                [args.sim, "--daemon", d.address, "--job", JOB, "--ranks", "8", "--iterations",
                 "400", "--iteration-ms", "30", "--noise", "0.05", "--seed", "11",
                 "--slow", "%d:3:20:400" % SLOW_RANK], stdout=sim_log, stderr=subprocess.STDOUT)
            try:
                wait_for("rank %d excluded" % SLOW_RANK,
                         lambda: SLOW_RANK in excluded(daemon_get(d, "/v1/jobs/" + JOB)),
                         timeout=90)
                pid, fd = pty.fork()
                if pid == 0:  # the child: the terminal is its stdin/stdout/stderr
                    os.environ["TERM"] = "xterm"
                    os.execv(args.ctl, [args.ctl, "--daemon", d.address, "top", JOB,
                                        "--interval-ms", "200"])
                try:
                    frame = read_until(fd, pid, r"^\s*%d\s.*\bexcluded\b.*\d\.\d\dx.*straggler"
                                       % SLOW_RANK, timeout=30)
                    print("stragglerctl top showed:\n" + frame)
                    check(re.search(r"^\s*0\s.*\bhealthy\b", frame, re.M),
                          "rank 0 is not shown healthy:\n" + frame)
                    check("last events:" in frame and "membership" in frame,
                          "the membership event is not among the last events:\n" + frame)
                    os.write(fd, b"\x03")  # Ctrl-C
                    deadline = time.monotonic() + 10
                    status = None
                    while time.monotonic() < deadline:
                        try:
                            os.read(fd, 65536)  # drain, so the child never blocks writing
                        except OSError:
                            pass
                        done, status = os.waitpid(pid, os.WNOHANG)
                        if done:
                            break
                        status = None
                        time.sleep(0.05)
                    check(status is not None, "stragglerctl top did not exit within 10 s of Ctrl-C")
                    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
                          "stragglerctl top ended with wait status %r after Ctrl-C, expected exit 0"
                          % status)
                    pid = None
                finally:
                    if pid is not None:
                        os.kill(pid, 9)
                        os.waitpid(pid, 0)
                    os.close(fd)
            finally:
                sim.wait(timeout=120)
            check(d.stop() == 0, "stragglerd did not exit cleanly")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(test)
