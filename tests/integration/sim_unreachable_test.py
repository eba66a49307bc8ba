#!/usr/bin/env python3
"""straggler-sim against an address where no daemon listens: it must not pass
as a success (it used to exit 0 after "cannot read the job's events"). Exit 3,
with a message naming the address. The port is bound here and never listened
on, so connections to it are refused and nothing else can take it meanwhile.

    sim_unreachable_test.py --sim PATH
"""

import os
import socket
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, run, run_main  # noqa: E402


def test(args):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))  # no listen(): connections are refused
        address = "127.0.0.1:%d" % s.getsockname()[1]
        # Few, short steps: every MembershipFor runs out its timeout here.
        cmd = [args.sim, "--daemon", address, "--ranks", "2", "--iterations", "3",
               "--iteration-ms", "1", "--membership-timeout-ms", "50", "--seed", "1"]
        res = run(cmd, 120)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    check(res.returncode == 3, "straggler-sim with no daemon exited %d, expected 3"
          % res.returncode)
    check("the daemon at %s was never reached" % address in res.stderr,
          "the message does not name %s:\n%s" % (address, res.stderr))


if __name__ == "__main__":
    run_main(test, "sim", description=__doc__.splitlines()[0])
