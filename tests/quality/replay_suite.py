#!/usr/bin/env python3
"""straggler-replay over the scenario suite (Python 3 standard library only).

  replay_suite.py smoke --replay BIN --scenarios DIR
      every scenarios/*.yaml with --policy all: exit 0, a JSON report with
      per-rank detections and scores for all five policies.
  replay_suite.py criteria --replay BIN --scenarios DIR
      the default policy (no --policy: the daemon's default settings) over
      every scenario: issue 17's criteria (quality/ criteria.h) - no
      false alarm, no flap, every episode flagged by its deadline. Prints
      every scenario's result and each failure.
  replay_suite.py defaults --replay BIN --scenarios DIR --daemon-config FILE
      straggler-replay without --policy runs exactly the policy settings of
      deploy/stragglerd.yaml (every key of its `policy:` section), and gives
      the same detections as naming that policy.
  replay_suite.py gate --replay BIN --scenario FILE --expect no_fp|detect
      the default `dynamic` policy: no false positive at all (no_fp), or
      every straggler episode detected within 10 iterations with recall
      >= 0.9 (detect). Prints the numbers either way.
  replay_suite.py cli --replay BIN --scenarios DIR --workdir DIR
      CSV input (its markdown lists rank@iteration), --set, --report, the
      exit-2 error contract (errors name the value; too large inputs exit 2,
      not abort) and exit 1 when every report is rejected.
  replay_suite.py tables --replay BIN --scenarios DIR --benchmarks FILE
      regenerates BENCHMARKS.md's detection-quality table and its
      "Default settings" sweep (bench/quality/sweep.py) with the commands
      they document and fails on any row that differs: the replay is
      deterministic, so a stale table means the engine changed and the
      numbers published for it did not.
"""
import argparse
import glob
import json
import os
import resource
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench", "quality"))
import sweep  # noqa: E402  (the sweep's one row generator)

REFERENCE_RULES = ["nvrx", "greyhound"]


def policies(replay, scenario):
    """What --policy all runs: the engine's kinds, the default first, then the
    reference rules."""
    p = run([replay, scenario, "--policy", "all", "--format", "json"])
    if p.returncode != 0:
        fail(f"{scenario}: exit {p.returncode}: {p.stderr}")
    return [x["policy"] for x in json.loads(p.stdout)["policies"]]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def smoke(a):
    files = sorted(glob.glob(os.path.join(a.scenarios, "*.yaml")))
    if len(files) < 50:
        fail(f"expected the whole suite in {a.scenarios}, found {len(files)} scenarios")
    expected = policies(a.replay, files[0])
    if not {"dynamic", "ewma", "static"} <= set(expected) or expected[-2:] != REFERENCE_RULES:
        fail(f"--policy all runs {expected}")
    for f in files:
        p = run([a.replay, f, "--policy", "all", "--format", "json"])
        if p.returncode != 0:
            fail(f"{f}: exit {p.returncode}: {p.stderr}")
        doc = json.loads(p.stdout)
        got = [x["policy"] for x in doc["policies"]]
        if got != expected:
            fail(f"{f}: policies {got}")
        for x in doc["policies"]:
            if len(x["ranks"]) != doc["ranks_count"] or "scores" not in x or "criteria" not in x:
                fail(f"{f}: {x['policy']}: ranks, scores or criteria missing")
        s = doc["scores"]
        print(f"{os.path.basename(f)}: dynamic precision={s['precision']} recall={s['recall']} "
              f"FP/1k={s['false_positives_per_1000']:.2f} detected={s['detected']}/{s['episodes']}")
    print(f"ok: {len(files)} scenarios x {len(expected)} policies")


def criteria(a):
    files = sorted(glob.glob(os.path.join(a.scenarios, "*.yaml")))
    failed = []
    for f in files:
        p = run([a.replay, f, "--format", "json"])
        if p.returncode != 0:
            fail(f"{f}: exit {p.returncode}: {p.stderr}")
        doc = json.loads(p.stdout)
        c = doc["criteria"]
        print(f"{doc['name']} ({doc['policy']}): {c['summary']} "
              f"(episodes in time {c['in_time']}/{c['episodes']})")
        for line in c["failures"][:10]:
            print(f"    {line}")
        if not c["pass"]:
            failed.append(doc["name"])
    if failed:
        fail(f"the default policy misses issue 17's criteria on {len(failed)} of {len(files)} "
             f"scenarios: {', '.join(failed)}")
    print(f"ok: the default policy meets the criteria on all {len(files)} scenarios")


def policy_section(path):
    """{key: value text} of the `policy:` section of deploy/stragglerd.yaml
    (two-space indented `key: value  # comment` lines; standard library only)."""
    out, inside = {}, False
    for line in open(path):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            inside = line.startswith("policy:")
            continue
        if inside:
            key, _, value = line.strip().partition(":")
            out[key] = value.split("#", 1)[0].strip().strip('"')
    return out


def same(text, value):
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        return float(text) == float(value)
    return text == value


def defaults(a):
    shipped = policy_section(a.daemon_config)
    if len(shipped) < 15 or "kind" not in shipped:
        fail(f"{a.daemon_config}: read only {sorted(shipped)} from its policy section")
    scenario = os.path.join(a.scenarios, "slowdown-3x.yaml")
    p = run([a.replay, scenario, "--format", "json"])
    if p.returncode != 0:
        fail(f"exit {p.returncode}: {p.stderr}")
    doc = json.loads(p.stdout)
    settings = doc["settings"]
    if doc["policy"] != shipped["kind"]:
        fail(f"without --policy the replay runs {doc['policy']}, the daemon ships "
             f"kind: {shipped['kind']}")
    if set(settings) != set(shipped):
        fail(f"keys differ: replay only {sorted(set(settings) - set(shipped))}, "
             f"{a.daemon_config} only {sorted(set(shipped) - set(settings))}")
    differ = [f"{k}: replay {settings[k]!r}, shipped {shipped[k]!r}" for k in sorted(shipped)
              if not same(shipped[k], settings[k])]
    if differ:
        fail("the replay's default settings differ from the daemon's: " + "; ".join(differ))
    print(f"ok: no --policy runs {doc['policy']} with all {len(settings)} settings of "
          f"{a.daemon_config}")


def gate(a):
    p = run([a.replay, a.scenario, "--policy", "dynamic", "--format", "json"])
    if p.returncode != 0:
        fail(f"exit {p.returncode}: {p.stderr}")
    doc = json.loads(p.stdout)
    s = doc["scores"]
    flagged = {r["rank"]: r["detected_at"] for r in doc["ranks"] if r["detected_at"]}
    print(f"{doc['name']} (dynamic, defaults): FP={s['false_positives']} "
          f"FP/1k={s['false_positives_per_1000']:.2f} recall={s['recall']} "
          f"detected={s['detected']}/{s['episodes']} latency={s['detection_latency']} "
          f"detections={flagged}")
    if a.expect == "no_fp":
        if s["false_positives"] != 0:
            fail(f"{s['false_positives']} false-positive rank-iterations "
                 f"(ranks flagged: {sorted(flagged)})")
    else:
        if s["episodes"] == 0:
            fail("scenario has no straggler episode")
        if s["missed"] != 0:
            fail(f"{s['missed']} of {s['episodes']} episodes missed")
        if s["detection_latency"]["max"] > 10:
            fail(f"detection latency max {s['detection_latency']['max']} > 10 iterations")
        if s["recall"] < 0.9:
            fail(f"recall {s['recall']} < 0.9")
    print("ok")


def recorded(a):
    """A trace recorded from a real run (--scenario FILE.csv) in which
    --straggler was slow from its start to the end: the daemon's defaults
    flag it and never call it healthy again (issue 28, item 2: a recorded
    run in which the daemon of the day did, many times)."""
    p = run([a.replay, a.scenario, "--format", "json"])
    if p.returncode != 0:
        fail(f"exit {p.returncode}: {p.stderr}")
    doc = json.loads(p.stdout)
    r = next(r for r in doc["ranks"] if r["rank"] == a.straggler)
    others = {x["rank"]: x["detected_at"] for x in doc["ranks"]
              if x["rank"] != a.straggler and x["detected_at"]}
    print(f"{a.scenario}: rank {a.straggler} detected at {r['detected_at']}, "
          f"recovered at {r['recovered_at']}; others detected: {others}")
    if not r["detected_at"]:
        fail(f"rank {a.straggler}, slow all along, was never detected")
    if r["recovered_at"]:
        fail(f"rank {a.straggler}, slow all along, was called healthy again at "
             f"{r['recovered_at']} (false recoveries)")
    if others:
        fail(f"ranks that were never slow were flagged: {others}")
    print("ok")


def cli(a):
    os.makedirs(a.workdir, exist_ok=True)
    # A CSV trace: 4 ranks x 60 iterations, rank 2 at 3x from iteration 20,
    # columns in a different order, with epochs.
    csv = os.path.join(a.workdir, "trace.csv")
    with open(csv, "w") as f:
        f.write("epoch,rank,iteration,compute_seconds\n")
        for i in range(60):
            for r in range(4):
                t = 0.1 * (1 + 0.01 * ((i * 7 + r * 3) % 5))
                if r == 2 and i >= 20:
                    t *= 3
                f.write(f"{i // 30},{r},{i},{t:.6f}\n")
    report = os.path.join(a.workdir, "report.json")
    p = run([a.replay, csv, "--policy", "dynamic", "--report", report])
    if p.returncode != 0:
        fail(f"csv replay: exit {p.returncode}: {p.stderr}")
    doc = json.load(open(report))
    ranks = {r["rank"]: r for r in doc["ranks"]}
    if sorted(ranks) != [0, 1, 2, 3] or not ranks[2]["detected_at"]:
        fail(f"csv replay: rank 2 not detected: {doc['ranks']}")
    if not (20 <= ranks[2]["detected_at"][0] <= 30):
        fail(f"csv replay: rank 2 detected at {ranks[2]['detected_at']}")
    for r in (0, 1, 3):
        if ranks[r]["detected_at"]:
            fail(f"csv replay: healthy rank {r} detected")
    if "scores" in doc:
        fail("csv replay: a CSV trace has no ground truth, yet scores were written")
    # Deterministic: the same input gives the same report.
    report2 = os.path.join(a.workdir, "report2.json")
    run([a.replay, csv, "--policy", "all", "--report", report2])
    p2 = run([a.replay, csv, "--policy", "all", "--format", "json"])
    if json.load(open(report2)) != json.loads(p2.stdout):
        fail("two runs of the same trace differ")
    # --set takes effect: a limit of 20 delays detection.
    p = run([a.replay, csv, "--policy", "dynamic", "--set", "limit=20", "--set",
             "cooldown_iterations=0", "--format", "json"])
    d = json.loads(p.stdout)
    at = [r for r in d["ranks"] if r["rank"] == 2][0]["detected_at"]
    if not at or at[0] < 20 + 19:
        fail(f"--set limit=20 not applied: rank 2 detected at {at}")
    scenario = os.path.join(a.scenarios, "slowdown-3x.yaml")
    errors = [
        (["--set", "bogus=1"], "bogus"),
        (["--set", "limit=abc"], "limit=abc"),
        (["--set", "threshold_factor=0.5"], "threshold_factor"),
        (["--set", "kind=ewma"], "--policy"),
        (["--policy", "fastest"], "fastest"),
        (["--format", "xml"], "xml"),
        # Range errors name the value given, and a default they clash with.
        (["--set", "nvrx_threshold=2"], "--set nvrx_threshold=2 must be in (0, 1]"),
        (["--set", "greyhound_window=0"], "--set greyhound_window=0 must be >= 1"),
        (["--set", "greyhound_ratio=0.5"], "--set greyhound_ratio=0.5 must be > 1"),
        (["--set", "nvrx_window=5"], "nvrx_min_samples=10 (the default) must be in [1, "
                                     "nvrx_window=5]"),
    ]
    for extra, needle in errors:
        p = run([a.replay, scenario] + extra)
        if p.returncode != 2 or needle not in p.stderr:
            fail(f"{extra}: expected exit 2 naming '{needle}', got {p.returncode}: {p.stderr!r}")
    bad = os.path.join(a.workdir, "bad.csv")
    with open(bad, "w") as f:
        f.write("iteration,rank,compute_seconds\n0,0,0.1\n1,0,fast\n")
    p = run([a.replay, bad])
    if p.returncode != 2 or "bad.csv:3" not in p.stderr or "'fast'" not in p.stderr:
        fail(f"bad CSV: expected exit 2 naming line 3 and 'fast': {p.returncode} {p.stderr!r}")
    p = run([a.replay, os.path.join(a.workdir, "missing.yaml")])
    if p.returncode != 2:
        fail(f"missing file: exit {p.returncode}")

    # A sparse rank id would size a 1e6-rank world: refused, naming rank and line.
    sparse = os.path.join(a.workdir, "sparse.csv")
    with open(sparse, "w") as f:
        f.write("iteration,rank,compute_seconds\n0,0,0.1\n1,999999,0.1\n")
    p = run([a.replay, sparse])
    if p.returncode != 2 or "sparse.csv:3" not in p.stderr or "'999999'" not in p.stderr:
        fail(f"sparse ranks: expected exit 2 naming line 3 and '999999': {p.returncode} "
             f"{p.stderr!r}")
    # Input whose matrices do not fit in memory (here: 2 GiB of address space
    # for 8 GB of compute times) exits 2 with a message; it used to abort on
    # an uncaught std::bad_alloc.
    huge = os.path.join(a.workdir, "huge.yaml")
    with open(huge, "w") as f:
        f.write("name: huge\nranks: 100000\niterations: 10000\nbase_seconds: 1\nnoise: 0\n"
                "seed: 1\n")
    limit = 2 << 30
    p = run([a.replay, huge],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    if p.returncode != 2 or "out of memory" not in p.stderr:
        fail(f"too large input: expected exit 2 and 'out of memory': {p.returncode} "
             f"{p.stderr!r}")

    # A scenario's declared topology reaches the engine (JobEngine::SetTopology):
    # the report shows each rank's topology as the engine holds it after the run.
    for name, rank, want in (("pipeline-4x2x2-stage1.6", 9, ("stage1", 0, "")),
                             ("pipeline-2x2x4-first1.5", 6, ("stage1", 0, "")),
                             ("generations-declared", 12, ("", None, "A100"))):
        p = run([a.replay, os.path.join(a.scenarios, name + ".yaml"), "--policy", "all",
                 "--format", "json"])
        for x in json.loads(p.stdout)["policies"]:
            r = x["ranks"][rank]
            got = (r.get("peer_group"), r.get("replica"), r.get("gpu_model"))
            if got != want:
                fail(f"{name} ({x['policy']}): rank {rank} topology {got}, expected {want}")

    # Without ground truth the markdown row lists the detections themselves.
    p = run([a.replay, csv, "--policy", "dynamic", "--format", "markdown"])
    rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and "dynamic" in l]
    if p.returncode != 0 or len(rows) != 1 or "| 2@2" not in rows[0]:
        fail(f"csv markdown: expected rank 2's detection as 2@<iteration>: {p.stdout!r}")

    # Every report rejected (compute times above max_compute_seconds): exit 1,
    # naming the setting and how many.
    p = run([a.replay, csv, "--set", "max_compute_seconds=0.01"])
    if (p.returncode != 1 or "max_compute_seconds=0.01" not in p.stderr
            or "240 reports" not in p.stderr):
        fail(f"every report rejected: expected exit 1 naming max_compute_seconds=0.01 and 240 "
             f"reports: {p.returncode} {p.stderr!r}")
    print("ok")


def tables(a):
    files = sorted(glob.glob(os.path.join(a.scenarios, "*.yaml")))
    expected = policies(a.replay, files[0])
    fresh = []
    for f in files:
        p = run([a.replay, f, "--policy", "all", "--format", "markdown"])
        if p.returncode != 0:
            fail(f"{f}: exit {p.returncode}: {p.stderr}")
        fresh += [l for l in p.stdout.splitlines()
                  if l.startswith("| ") and not l.startswith("| scenario |")]
    if len(fresh) != len(files) * len(expected):
        fail(f"expected {len(files) * len(expected)} rows from {len(files)} scenarios, "
             f"got {len(fresh)}")
    with open(a.benchmarks) as fh:
        doc = fh.read()
    # The published table: the rows under the first "| scenario | policy |"
    # header of the "Detection quality" section.
    section = doc.split("## Detection quality", 1)[-1].split("\n## ", 1)[0]
    published = [l for l in section.splitlines()
                 if l.startswith("| ") and l.split("|")[1].strip() in
                 {os.path.basename(f)[:-len(".yaml")] for f in files}
                 and len(l.split("|")) == len(fresh[0].split("|"))]
    key = lambda row: tuple(c.strip() for c in row.split("|")[1:3])  # noqa: E731
    published_by_key = {key(r): r for r in published}
    stale = [(r, published_by_key.get(key(r))) for r in fresh
             if published_by_key.get(key(r)) != r]
    for row, old in stale[:20]:
        print(f"now:       {row}\npublished: {old}")
    extra = sorted(set(published_by_key) - {key(r) for r in fresh})
    if extra:
        print(f"published rows for scenario/policy pairs the suite no longer has: {extra}")
    if stale or extra:
        fail(f"{len(stale)} of {len(fresh)} rows of BENCHMARKS.md's detection table are stale; "
             f"regenerate it with the command above the table")
    print(f"ok: all {len(fresh)} rows of the detection table match a fresh replay")

    # The "Default settings" sweep: its rows in the order sweep.py prints them.
    settings = doc.split("### Default settings", 1)[-1].split("\n#", 1)[0]
    published = [l for l in settings.splitlines()
                 if l.startswith("| ") and l.split("|")[1].strip() in {"dynamic", "ewma"}]
    fresh = sweep.rows(a.replay, a.scenarios)
    if published != fresh:
        for now, old in zip(fresh, published + [None] * len(fresh)):
            if now != old:
                print(f"now:       {now}\npublished: {old}")
        fail(f"BENCHMARKS.md's \"Default settings\" table ({len(published)} rows) differs from "
             f"a fresh sweep ({len(fresh)} rows); regenerate it with the command above it")
    print(f"ok: all {len(fresh)} rows of the default-settings sweep match a fresh run")

    # "Criteria by policy": one row per policy, as sweep.py --criteria prints them.
    section = doc.split("### Criteria by policy", 1)[-1].split("\n#", 1)[0]
    published = [l for l in section.splitlines()
                 if l.startswith("| ") and not l.startswith("| policy |")]
    fresh = sweep.criteria_rows(a.replay, a.scenarios)
    if published != fresh:
        for now, old in zip(fresh, published + [None] * len(fresh)):
            if now != old:
                print(f"now:       {now}\npublished: {old}")
        fail("BENCHMARKS.md's \"Criteria by policy\" table differs from a fresh run; "
             "regenerate it with the command above it")
    print(f"ok: all {len(fresh)} rows of the criteria table match a fresh run")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["smoke", "gate", "cli", "tables", "criteria", "defaults",
                                     "recorded"])
    ap.add_argument("--replay", required=True)
    ap.add_argument("--scenarios")
    ap.add_argument("--scenario")
    ap.add_argument("--expect", choices=["no_fp", "detect"])
    ap.add_argument("--workdir")
    ap.add_argument("--benchmarks")
    ap.add_argument("--daemon-config")
    ap.add_argument("--straggler", type=int, help="recorded: the rank slow all along")
    a = ap.parse_args()
    {"smoke": smoke, "gate": gate, "cli": cli, "tables": tables, "criteria": criteria,
     "defaults": defaults, "recorded": recorded}[a.mode](a)


if __name__ == "__main__":
    main()
