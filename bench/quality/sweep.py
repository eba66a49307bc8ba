#!/usr/bin/env python3
"""Sweeps policy settings over the scenario suite with straggler-replay and
prints one summary row per setting over the issue-6 scenarios (the evidence
behind BENCHMARKS.md "Default settings"); with --criteria, one row per policy of issue 17's
criteria over the whole suite (BENCHMARKS.md "Criteria by policy"). Python 3
standard library only.

  bench/quality/sweep.py --replay build/tools/straggler-replay/straggler-replay \
      --scenarios scenarios [--criteria]
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


# The sweep judges dynamic's and ewma's settings on the suite they were chosen
# on (issue 6); issue 17's scenarios (topology, mild stragglers, ...) are
# judged per policy by criteria_rows below.
ISSUE6_SCENARIOS = [
    "global-slowdown", "healthy-noise-02", "healthy-noise-05", "healthy-noise-10",
    "healthy-noise-15", "multi-stragglers", "profiling-window-straggler", "recovery-relapse",
    "silent-rank", "slow-4-of-5", "slow-then-fast", "slowdown-1.2x", "slowdown-1.5x",
    "slowdown-2x", "slowdown-3x", "slowdown-5x", "spikes-3x-rare", "thermal-ramp",
    "two-generations",
]


HEADER = ("| policy | settings | FP/1k on the no-straggler scenarios (mean / worst) | "
          "scenarios with any FP (FP/1k) | episodes detected | mean F1 | det. latency mean | "
          "rec. latency mean | detections |")


def rows(replay, scenarios):
    """The table's rows, one per entry of SETTINGS (also used by
    tests/quality/replay_suite.py to check BENCHMARKS.md's copy), over the
    issue-6 scenarios."""
    files = [os.path.join(scenarios, name + ".yaml") for name in ISSUE6_SCENARIOS]
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


CRITERIA_HEADER = ("| policy | scenarios meeting the criteria | episodes in time | late | missed | "
                   "false alarms | flaps | stuck | wrong cause | scenarios that miss them |")


def criteria_rows(replay, scenarios):
    """One row per policy of --policy all: issue 17's criteria (criteria.h)
    summed over the suite (also checked against BENCHMARKS.md by
    tests/quality/replay_suite.py)."""
    files = sorted(glob.glob(os.path.join(scenarios, "*.yaml")))
    totals = {}
    for f in files:
        p = subprocess.run([replay, f, "--policy", "all", "--format", "json"],
                           capture_output=True, text=True, check=True)
        d = json.loads(p.stdout)
        for x in d["policies"]:
            c = x["criteria"]
            t = totals.setdefault(x["policy"], {"pass": 0, "in_time": 0, "episodes": 0, "late": 0,
                                                "missed": 0, "false_alarms": 0, "flaps": 0,
                                                "stuck": 0, "wrong_cause": 0, "failing": []})
            t["pass"] += c["pass"]
            for k in ("in_time", "episodes", "late", "missed", "false_alarms", "flaps", "stuck"):
                t[k] += c[k]
            t["wrong_cause"] += c.get("wrong_cause", 0)  # where the scenario names a cause
            if not c["pass"]:
                t["failing"].append(d["name"])
    return [f"| {policy} | {t['pass']}/{len(files)} | {t['in_time']}/{t['episodes']} | {t['late']} | "
            f"{t['missed']} | {t['false_alarms']} | {t['flaps']} | {t['stuck']} | {t['wrong_cause']} | "
            f"{', '.join(t['failing']) or '-'} |"
            for policy, t in totals.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", required=True)
    ap.add_argument("--scenarios", required=True)
    ap.add_argument("--criteria", action="store_true")
    a = ap.parse_args()
    if a.criteria:
        print(CRITERIA_HEADER)
        print("|---|---|---|---|---|---|---|---|---|---|")
        for row in criteria_rows(a.replay, a.scenarios):
            print(row)
        return
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows(a.replay, a.scenarios):
        print(row)


if __name__ == "__main__":
    main()
