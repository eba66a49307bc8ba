"""bench:micro_smoke - runs each micro-benchmark binary briefly so none rots.

    micro_smoke.py [--filter BINARY=REGEX ...] BINARY...

Each binary runs with --benchmark_min_time=0.01 and JSON output; the test
fails when a binary exits non-zero, runs no benchmark, or a benchmark reports
an error (SkipWithError exits 0, so the JSON is checked). No timing asserts.
Python 3 standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

TIMEOUT_S = 120


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", action="append", default=[],
                    help="NAME=REGEX: --benchmark_filter for the binary named NAME")
    ap.add_argument("binaries", nargs="+")
    args = ap.parse_args()
    filters = dict(f.split("=", 1) for f in args.filter)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for binary in args.binaries:
            name = os.path.basename(binary)
            out = os.path.join(tmp, name + ".json")
            cmd = [binary, "--benchmark_min_time=0.01", "--benchmark_out=" + out,
                   "--benchmark_out_format=json"]
            if name in filters:
                cmd.append("--benchmark_filter=" + filters[name])
            print("$ " + " ".join(cmd), flush=True)
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                failures.append("%s: timed out after %d s" % (name, TIMEOUT_S))
                continue
            print(p.stdout)
            if p.returncode != 0:
                failures.append("%s exited %d:\n%s" % (name, p.returncode, p.stderr))
                continue
            try:
                with open(out) as f:
                    results = json.load(f)["benchmarks"]
            except (OSError, ValueError, KeyError) as e:
                failures.append("%s: no JSON results (%s)" % (name, e))
                continue
            if not results:
                failures.append("%s: ran no benchmark" % name)
            for b in results:
                if b.get("error_occurred"):
                    failures.append("%s: %s: %s" % (name, b["name"], b.get("error_message")))
    if failures:
        for f in failures:
            print("FAILED: " + f, file=sys.stderr)
        sys.exit(1)
    print("PASSED")


if __name__ == "__main__":
    main()
