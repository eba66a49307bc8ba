#!/usr/bin/env python3
"""Steps per second of a 4-rank PyTorch DDP job with the partial all-reduce
hook (README's exclusion recipe, tests/integration/torch_no_daemon_rank.py),
with stragglerd listening and with nothing listening at STRAGGLER_ENDPOINT,
alternated --runs times. Steps 50..299 of each run are timed (after DDP's
warm-up). BENCHMARKS.md "Training without a daemon".

    bench/client/no_daemon_pace.py --stragglerd build/daemon/stragglerd \\
        --python /usr/bin/python3 --pythonpath build/python --runs 2
"""

import argparse
import os
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "integration"))
import torch_no_daemon_test as nd  # noqa: E402
from harness import Daemon  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stragglerd", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--pythonpath", required=True)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    for n in range(args.runs):
        for mode in ("daemon", "none"):
            with tempfile.TemporaryDirectory() as work:
                address = "127.0.0.1:%d" % nd.free_port()
                daemon = Daemon(args.stragglerd, work, grpc_address=address)
                if mode == "daemon":
                    daemon.start()
                ranks = nd.start_ranks(args, work, address, "pace-%s-%d-%d" % (mode, n, os.getpid()),
                                       300)
                try:
                    ranks.finish()
                finally:
                    ranks.kill()
                    if mode == "daemon":
                        daemon.stop()
                t = max(ranks.lines[r][-1]["t"] - ranks.lines[r][49]["t"] for r in range(4))
                print("run %d, %-6s: steps 50..299 in %.2f s, %.1f steps/s"
                      % (n, mode, t, 250 / t), flush=True)


if __name__ == "__main__":
    main()
