#!/usr/bin/env python3
"""Sweeps policy settings over the scenario suite with straggler-replay and
prints one summary row per setting (the evidence behind BENCHMARKS.md
"Default settings"). Python 3 standard library only.

  bench/quality/sweep.py --replay build/tools/straggler-replay/straggler-replay \
      --scenarios scenarios
"""
import argparse
import glob
import json
import os
import subprocess

SETTINGS = [
    ("dynamic", []),
    ("dynamic", ["limit=3"]),
    ("dynamic", ["limit=8"]),
    ("dynamic", ["threshold_factor=1.5"]),
    ("dynamic", ["threshold_factor=1.75"]),
    ("dynamic", ["threshold_factor=2.5"]),
    ("dynamic", ["profile_iterations=10"]),
    ("dynamic", ["rejoin_mark=4"]),
    ("ewma", []),
    ("ewma", ["ewma_ratio=1.3"]),
    ("ewma", ["ewma_ratio=2.0"]),
]


HEADER = ("| policy | settings | FP/1k on the no-straggler scenarios (mean / worst) | "
          "scenarios with any FP (FP/1k) | episodes detected | mean F1 | det. latency mean | "
          "rec. latency mean | detections |")


def rows(replay, scenarios):
    """The table's rows, one per entry of SETTINGS (also used by
    tests/quality/replay_suite.py to check BENCHMARKS.md's copy)."""
    files = sorted(glob.glob(os.path.join(scenarios, "*.yaml")))
    out = []
    for policy, sets in SETTINGS:
        cmd_sets = sum((["--set", s] for s in sets), [])
        fp_rates, fp_names, f1s, lat, rec = [], [], [], [], []
        episodes = detected = flips = 0
        for f in files:
            p = subprocess.run([replay, f, "--policy", policy, "--format", "json"] + cmd_sets,
                               capture_output=True, text=True, check=True)
            d = json.loads(p.stdout)
            s = d["scores"]
            flips += sum(len(r["detected_at"]) for r in d["ranks"])
            if s["episodes"] == 0:
                fp_rates.append(s["false_positives_per_1000"])
                if s["false_positives"] > 0:
                    fp_names.append(f'{d["name"]} {s["false_positives_per_1000"]:.1f}')
            else:
                f1s.append(s["f1"])
                episodes += s["episodes"]
                detected += s["detected"]
                lat += s["detection_latency"]["per_episode"]
                if s["recovery_latency"]["mean"] is not None:
                    rec.append(s["recovery_latency"]["mean"])
        mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
        out.append(f"| {policy} | {' '.join(sets) or 'defaults'} | "
                   f"{mean(fp_rates):.2f} / {max(fp_rates):.2f} | {len(fp_names)} ({', '.join(fp_names)}) | "
                   f"{detected}/{episodes} | {mean(f1s):.3f} | {mean(lat):.1f} | {mean(rec):.1f} | {flips} |")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", required=True)
    ap.add_argument("--scenarios", required=True)
    a = ap.parse_args()
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows(a.replay, a.scenarios):
        print(row)


if __name__ == "__main__":
    main()
