#!/usr/bin/env python3
"""The default policy over seeds no scenario file holds (Python 3 standard library only).

  seed_sweep.py --replay build/tools/straggler-replay/straggler-replay [--seeds 20] [--dump DIR]

Writes families of 16-rank, 1500-iteration scenarios (issue 17's cases: noise, spikes of one
step in 20, global slowdowns and checkpoints, warm-up, an undeclared generation, ±30%
variation, 1.3x and 2x stragglers, a ramp, 2.5x on 4 steps of 5; issue 33's ranks a little
slower for good and a rank that recovers only to 1.1x), `--seeds` seeds each, into
a temporary directory (each family its own seeds, so no two share a noise draw), replays each
with the daemon's defaults (no --policy; --set changes a field) and prints, per
family, how many seeds meet issue 17's criteria, the spread of the detection latencies of all
its episodes, how many are within 10 iterations of their onset, the slowest recovery of each
seed, and the failures. BENCHMARKS.md quotes it.
"""
import argparse
import json
import math
import os
import subprocess
import tempfile

CHECKPOINTS = "".join("  - {type: global, factor: 5.0, from: %d, to: %d}\n" % (i, i + 1)
                      for i in range(99, 1500, 100))
WARMUP = "".join("  - {type: global, factor: %.2f, from: %d, to: %d}\n" % (4 - 0.4 * i, i, i + 1)
                 for i in range(8))
TWO = "  - {type: slow, ranks: [3], factor: %s, from: 200, to: 400}\n" \
      "  - {type: slow, ranks: [9], factor: %s, from: 700, to: 1000}\n"
# Issue 33: three ranks persistently 1.05-1.1x slower than their peers, with stretches of 5-15
# steps at 1.15-1.2x (truth from 1.15x: a stretch may be flagged, the steady level not), and a
# real straggler at 1.7-2.35x (scenarios/gray-zone-stretches.yaml).
GRAY = ("  - {type: slow, rank: 2, factor: 1.05}\n"
        "  - {type: slow, rank: 7, factor: 1.08}\n"
        "  - {type: slow, rank: 11, factor: 1.10}\n"
        "  - {type: slow, rank: 2, factor: 1.143, from: 93, to: 100}\n"
        "  - {type: slow, rank: 2, factor: 1.124, from: 219, to: 228}\n"
        "  - {type: slow, rank: 2, factor: 1.095, from: 424, to: 437}\n"
        "  - {type: slow, rank: 2, factor: 1.143, from: 625, to: 635}\n"
        "  - {type: slow, rank: 2, factor: 1.124, from: 830, to: 842}\n"
        "  - {type: slow, rank: 2, factor: 1.143, from: 974, to: 989}\n"
        "  - {type: slow, rank: 2, factor: 1.124, from: 1067, to: 1076}\n"
        "  - {type: slow, rank: 2, factor: 1.124, from: 1215, to: 1228}\n"
        "  - {type: slow, rank: 2, factor: 1.143, from: 1301, to: 1315}\n"
        "  - {type: slow, rank: 7, factor: 1.111, from: 55, to: 65}\n"
        "  - {type: slow, rank: 7, factor: 1.065, from: 187, to: 193}\n"
        "  - {type: slow, rank: 7, factor: 1.065, from: 334, to: 343}\n"
        "  - {type: slow, rank: 7, factor: 1.065, from: 419, to: 429}\n"
        "  - {type: slow, rank: 7, factor: 1.111, from: 571, to: 579}\n"
        "  - {type: slow, rank: 7, factor: 1.065, from: 708, to: 718}\n"
        "  - {type: slow, rank: 7, factor: 1.111, from: 868, to: 881}\n"
        "  - {type: slow, rank: 7, factor: 1.093, from: 1018, to: 1031}\n"
        "  - {type: slow, rank: 7, factor: 1.111, from: 1190, to: 1197}\n"
        "  - {type: slow, rank: 7, factor: 1.093, from: 1285, to: 1290}\n"
        "  - {type: slow, rank: 7, factor: 1.065, from: 1381, to: 1387}\n"
        "  - {type: slow, rank: 7, factor: 1.093, from: 1470, to: 1476}\n"
        "  - {type: slow, rank: 11, factor: 1.073, from: 27, to: 38}\n"
        "  - {type: slow, rank: 11, factor: 1.045, from: 187, to: 195}\n"
        "  - {type: slow, rank: 11, factor: 1.091, from: 354, to: 366}\n"
        "  - {type: slow, rank: 11, factor: 1.091, from: 547, to: 557}\n"
        "  - {type: slow, rank: 11, factor: 1.073, from: 754, to: 766}\n"
        "  - {type: slow, rank: 11, factor: 1.045, from: 950, to: 956}\n"
        "  - {type: slow, rank: 11, factor: 1.073, from: 1139, to: 1150}\n"
        "  - {type: slow, rank: 11, factor: 1.091, from: 1302, to: 1308}\n"
        "  - {type: slow, rank: 11, factor: 1.091, from: 1430, to: 1435}\n"
        "  - {type: slow, rank: 5, factor: 2.0, from: 700, to: 760}\n"
        "  - {type: slow, rank: 5, factor: 1.7, from: 760, to: 780}\n"
        "  - {type: slow, rank: 5, factor: 2.35, from: 780, to: 840}\n")
# Issue 31's input pipeline: 5% of a healthy step's own time is input wait; phase: input
# effects multiply it (x21: own time 2x, x41: 3x, compute normal).
INPUT = "input: {share: 0.05, noise: 0.2}\n"
TWO_INPUT = "  - {type: slow, ranks: [3], factor: %s, from: 200, to: 400, phase: input}\n" \
            "  - {type: slow, ranks: [9], factor: %s, from: 700, to: 1000, phase: input}\n"
HOST = "host: {run_delay: 0.005}\n"
TWO_HOST = "  - {type: slow, ranks: [3], factor: %s, from: 200, to: 400, phase: host}\n" \
           "  - {type: slow, ranks: [9], factor: %s, from: 700, to: 1000, phase: host}\n"
WORK = "work: {sequences: 8, sigma: %s, attention: 1.0, overhead: 0.2, report: %s}\n"
FAMILIES = {
    "noise 10%": "noise: 0.10\neffects: []\n",
    "noise 15%": "noise: 0.15\neffects: []\n",
    "spikes 6x p=0.05": "noise: 0.05\neffects:\n"
                        "  - {type: spike, ranks: all, factor: 6.0, probability: 0.05}\n",
    "spikes 5x p=0.05, noise 10%": "noise: 0.10\neffects:\n"
                                   "  - {type: spike, ranks: all, factor: 5.0, probability: 0.05}\n",
    "global 2x, 0.6x, checkpoints": "noise: 0.10\neffects:\n"
                                    "  - {type: global, factor: 2.0, from: 300, to: 500}\n"
                                    "  - {type: global, factor: 0.6, from: 900}\n" + CHECKPOINTS,
    "warm-up 4x": "noise: 0.10\neffects:\n" + WARMUP,
    "undeclared generation 6/16 at 1.5x": "noise: 0.05\neffects:\n"
                                          "  - {type: generation, ranks: [\"10-15\"], factor: 1.5}\n",
    "variation 30%": "noise: 0\nvariation: 0.3\neffects: []\n",
    "1.3x, noise 10%": "noise: 0.10\ntruth_min_factor: 1.3\neffects:\n" + TWO % (1.3, 1.3),
    "1.3x, variation 30%": "noise: 0\nvariation: 0.3\ntruth_min_factor: 1.3\neffects:\n"
                           + TWO % (1.3, 1.3),
    "2x, noise 10%": "noise: 0.10\neffects:\n" + TWO % (2.0, 2.0),
    "2x, variation 30%": "noise: 0\nvariation: 0.3\neffects:\n"
                         + TWO % (2.0, 2.0),
    "ramp to 2x": "noise: 0.10\neffects:\n"
                  "  - {type: ramp, ranks: [5], from: 200, to: 300, end_factor: 2.0, hold_until: 500}\n",
    "2.5x on 4 of 5": "noise: 0.05\neffects:\n"
                      "  - {type: slow, ranks: [6], factor: 2.5, from: 300, to: 800, pattern: 4/5}\n",
    "gray zone: 1.05-1.1x, stretches at 1.15-1.2x, one 2x": "noise: 0.05\ntruth_min_factor: 1.15\n"
                                                           "effects:\n" + GRAY,
    "recovers only to 1.1x": "noise: 0.05\ntruth_min_factor: 1.3\neffects:\n"
                             "  - {type: slow, ranks: [3], factor: 1.4, from: 200, to: 400}\n"
                             "  - {type: slow, ranks: [3], factor: 1.1, from: 400}\n"
                             "  - {type: slow, ranks: [9], factor: 2.0, from: 700, to: 1000}\n"
                             "  - {type: slow, ranks: [9], factor: 1.1, from: 1000}\n",
    # Issue 31: per-step work from 8 log-normal sequence lengths with an attention term
    # (about +-30% per step), time = (overhead + work) x factor x (1 + 5% noise).
    "work σ0.6 reported, 1.3x": "noise: 0.05\ntruth_min_factor: 1.3\n" + WORK % (0.6, "cost")
                                + "effects:\n" + TWO % (1.3, 1.3),
    "work σ0.9 reported, 1.3x": "noise: 0.05\ntruth_min_factor: 1.3\n" + WORK % (0.9, "cost")
                                + "effects:\n" + TWO % (1.3, 1.3),
    "work σ0.6 as tokens (cost has Σs²), 1.3x": "noise: 0.05\ntruth_min_factor: 1.3\n"
                                                + WORK % (0.6, "tokens") + "effects:\n"
                                                + TWO % (1.3, 1.3),
    "work σ0.9 as tokens, 1.3x": "noise: 0.05\ntruth_min_factor: 1.3\n" + WORK % (0.9, "tokens")
                                 + "effects:\n" + TWO % (1.3, 1.3),
    "work σ0.6 reported, spikes 6x p=0.05, 2x": "noise: 0.05\n" + WORK % (0.6, "cost")
                                                + "effects:\n" + TWO % (2.0, 2.0)
                                                + "  - {type: spike, ranks: all, factor: 6.0, "
                                                  "probability: 0.05}\n",
    "work σ0.6 not reported, 1.3x": "noise: 0.05\ntruth_min_factor: 1.3\n"
                                    + WORK % (0.6, "none") + "effects:\n" + TWO % (1.3, 1.3),
    "work σ0.9 reported, healthy": "noise: 0.05\n" + WORK % (0.9, "cost") + "effects: []\n",
    "work σ0.9 as tokens, healthy": "noise: 0.05\n" + WORK % (0.9, "tokens") + "effects: []\n",
    # Issue 31: a rank's input pipeline (appended: the families above keep their seeds). The
    # replay attributes each detection as the daemon does; `cause` makes a detection with
    # another likely cause a failure of the criteria.
    "input 2x (input wait 5% -> 52% of own time)": "noise: 0.05\n" + INPUT
                                                   + "cause: input_pipeline\neffects:\n"
                                                   + TWO_INPUT % (21, 21),
    "input 3x (input wait 5% -> 68%)": "noise: 0.05\n" + INPUT + "cause: input_pipeline\n"
                                       "effects:\n" + TWO_INPUT % (41, 41),
    "input wait ramp to 1.55x own time": "noise: 0.05\n" + INPUT + "cause: input_pipeline\n"
                                         "effects:\n  - {type: ramp, ranks: [5], from: 200, "
                                         "to: 300, end_factor: 12, hold_until: 500, "
                                         "phase: input}\n",
    "input stalls 40x p=0.01 on every rank, healthy": "noise: 0.05\n" + INPUT + "effects:\n"
                                                      "  - {type: spike, ranks: all, "
                                                      "factor: 40, probability: 0.01, "
                                                      "phase: input}\n",
    # Issue 31: CPU contention on one rank's node (a noisy neighbour): its compute slower, its
    # process's run delay (a trace column, the agent's telemetry) up by 1 - 1/factor s/s.
    "host 2x (run delay 0.005 -> 0.505 s/s)": "noise: 0.05\n" + HOST + "cause: host\neffects:\n"
                                              + TWO_HOST % (2, 2),
    "host 1.5x (run delay -> 0.34 s/s)": "noise: 0.05\n" + HOST + "cause: host\neffects:\n"
                                         + TWO_HOST % (1.5, 1.5),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", required=True)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a policy field over the defaults, passed on to straggler-replay")
    ap.add_argument("--family", action="append", default=[],
                    help="only the families whose name contains this (repeatable)")
    ap.add_argument("--dump", metavar="DIR",
                    help="also write each replay's JSON report (per-rank detections) to DIR, "
                         "so two engines can be compared exactly with diff -r")
    a = ap.parse_args()
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="seed-sweep-") as d:
        print("| family | seeds meeting the criteria | detection latency: median / 90th pct / max "
              "| within 10 | recovery latency, slowest per seed: median / max | failures |")
        print("|---|---|---|---|---|---|")
        for k, (family, body) in enumerate(FAMILIES.items()):
            if a.family and not any(f in family for f in a.family):
                continue
            ok, fails, lat, rec = 0, [], [], []
            for seed in range(a.seeds):
                path = os.path.join(d, "f%d-%d.yaml" % (k, seed))
                with open(path, "w") as f:
                    f.write("name: f%d-%d\nranks: 16\niterations: 1500\nbase_seconds: 0.25\n"
                            "seed: %d\n%s" % (k, seed, 1000 + seed * 7919 + k * 104729, body))
                sets = [x for kv in a.set for x in ("--set", kv)]
                p = subprocess.run([a.replay, path, "--format", "json"] + sets, capture_output=True,
                                   text=True, timeout=120, check=True)
                out = json.loads(p.stdout)
                if a.dump:  # without the temporary directory's name
                    with open(os.path.join(a.dump, "f%d-%d.json" % (k, seed)), "w") as f:
                        json.dump({x: v for x, v in out.items() if x != "input"}, f, indent=1,
                                  sort_keys=True)
                c = out["criteria"]
                lat += out["scores"]["detection_latency"].get("per_episode", [])
                if out["scores"]["recovery_latency"].get("max") is not None:
                    rec.append(out["scores"]["recovery_latency"]["max"])
                if c["pass"]:
                    ok += 1
                else:
                    fails += ["seed %d: %s" % (seed, x) for x in c["failures"][:2]]
            print("| %s | %d/%d | %s | %s | %s | %s |" % (
                family, ok, a.seeds, spread(lat, (0.5, 0.9, 1.0)),
                "%d/%d" % (sum(x <= 10 for x in lat), len(lat)) if lat else "-",
                spread(rec, (0.5, 1.0)),
                "; ".join(fails[:3]) + (" (+%d)" % (len(fails) - 3) if len(fails) > 3 else "")))


def spread(values, quantiles):
    """"a / b / c": the values' nearest-rank quantiles, "-" for none."""
    if not values:
        return "-"
    v = sorted(values)
    return " / ".join(str(v[min(len(v) - 1, max(0, int(math.ceil(q * len(v))) - 1))])
                      for q in quantiles)


if __name__ == "__main__":
    main()
