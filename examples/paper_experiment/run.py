#!/usr/bin/env python3
"""The paper's experiment (Kim, Yu, Kim, JKIIT 21(10) 2023), reproduced with
the real stragglerd and PyTorch DDP (see README.md in this directory).

    PYTHONPATH=build/python /usr/bin/python3 examples/paper_experiment/run.py \
        --build build [--write-benchmarks BENCHMARKS.md]

Cases (4 ranks, rank 3 the straggler):
  baseline      no straggler, DDP all-reduce
  half-ddp      3x slower in the first half of every epoch, DDP all-reduce
  half-sd       the same, straggler.torch hook + stragglerd (its default policy)
  whole5-ddp    5x slower for the whole run, DDP all-reduce
  whole5-sd     the same with stragglerd
Detection is the daemon's own (default config): no overrides.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from harness import Daemon  # noqa: E402

WORLD, SLOW_RANK = 4, 3
CASES = [  # name, slow mode, factor, with stragglerd
    ("baseline", "none", 1.0, False),
    ("half-ddp", "half", 3.0, False),
    ("half-sd", "half", 3.0, True),
    ("whole5-ddp", "whole", 5.0, False),
    ("whole5-sd", "whole", 5.0, True),
]


def run_case(args, name, mode, factor, with_daemon, workdir):
    case_dir = os.path.join(workdir, name)
    os.makedirs(case_dir)
    daemon = None
    if with_daemon:
        daemon = Daemon(args.stragglerd or os.path.join(args.build, "daemon", "stragglerd"),
                        case_dir)
        daemon.start()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=args.pythonpath or os.path.join(args.build, "python"))
    lines = {r: [] for r in range(WORLD)}
    final, procs, threads = {}, [], []
    start = time.time()
    for r in range(WORLD):
        cmd = [sys.executable, os.path.join(HERE, "train.py"), "--rank", str(r),
               "--world-size", str(WORLD), "--store", os.path.join(case_dir, "store"),
               "--epochs", str(args.epochs), "--iterations-per-epoch", str(args.iterations),
               "--slow-rank", str(SLOW_RANK), "--slow-mode", mode, "--slow-factor", str(factor),
               "--done-file", os.path.join(case_dir, "done"), "--job", "paper-" + name]
        if daemon:
            cmd += ["--daemon", daemon.address]
        err = open(os.path.join(case_dir, "rank%d.err" % r), "w")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        procs.append(p)

        def read(rank=r, proc=p):
            for line in proc.stdout:
                obj = json.loads(line)
                (final.__setitem__(rank, obj) if "final" in obj else lines[rank].append(obj))
        t = threading.Thread(target=read)
        t.start()
        threads.append(t)
    for r, p in enumerate(procs):
        rc = p.wait(timeout=args.case_timeout)
        if rc != 0:
            with open(os.path.join(case_dir, "rank%d.err" % r)) as f:
                raise RuntimeError("%s: rank %d exited %d: %s" % (name, r, rc, f.read()[-2000:]))
    for t in threads:
        t.join()
    events = []
    if daemon:
        url = "http://%s/v1/jobs/paper-%s/events?since=0&limit=10000" % (daemon.http_address, name)
        with urllib.request.urlopen(url, timeout=10) as resp:
            events = json.load(resp)["events"]
        daemon.stop()
    with open(os.path.join(case_dir, "result.json"), "w") as f:
        json.dump({"lines": lines, "final": final, "events": events}, f)
    # Job time: up to the last finish of a rank that ran to the last iteration
    # (the straggler may have skipped some on its way to a rejoin).
    job_s = max(final[r]["end"] for r in range(WORLD) if final[r]["stopped_early"] is None) - \
        min(final[r]["start"] for r in range(WORLD))
    return {"name": name, "lines": lines, "final": final, "events": events, "job_s": job_s,
            "wall_s": time.time() - start}


def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def analyse(res, per_epoch, mode):
    """Detection / recovery latencies and misclassifications from the daemon's
    state-change events against the straggler's slow phases (ground truth).
    The straggler skips iterations (to its rejoin), so a phase starts at the
    first of its iterations that it ran."""
    lines = res["lines"][SLOW_RANK]
    group = {row["it"]: row for row in res["lines"][0]}  # rank 0 runs every iteration
    changes = [e for e in res["events"] if e.get("kind") == "EVENT_KIND_STATE_CHANGE"]
    memberships = [e for e in res["events"] if e.get("kind") == "EVENT_KIND_MEMBERSHIP"]
    healthy_flagged = [e for e in changes if e.get("rank", 0) != SLOW_RANK
                       and e.get("to") == "WORKER_STATE_STRAGGLER"]
    mine = [e for e in changes if e.get("rank", 0) == SLOW_RANK]
    total = max(row["it"] for row in lines) + 1
    phases = []  # (start, end) iterations of the slow phases
    if mode == "half":
        for e0 in range(0, total, per_epoch):
            phases.append((e0, min(e0 + per_epoch // 2, total)))
    elif mode == "whole":
        phases.append((0, total))

    def first_run(at):  # the straggler's first row at or after iteration `at`
        return next((row for row in lines if row["it"] >= at), None)

    det, rec, missed, premature, outside, skipped_phases = [], [], 0, 0, 0, 0
    ran_phases = []
    for (a, b) in phases:
        start = first_run(a)
        if start is None or start["it"] >= b:
            skipped_phases += 1  # it skipped the whole phase (a rejoin beyond it)
            continue
        ran_phases.append((a, b))
        flagged = [e for e in mine if e.get("to") == "WORKER_STATE_STRAGGLER"
                   and a <= int(e.get("iteration", 0)) < b]
        if not flagged:
            missed += 1
            continue
        e = flagged[0]
        it = int(e.get("iteration", 0))
        det.append((it - start["it"] + 1, ts(e["time"]) - start["t0"]))
        back = [x for x in mine if x.get("to") == "WORKER_STATE_HEALTHY"
                and int(x.get("iteration", 0)) > it]
        if back and int(back[0]["iteration"]) < b:
            premature += 1
        fast = first_run(b)
        if mode == "half" and back and fast is not None:
            x = back[0]
            # Back in the collective: the straggler's first participating
            # iteration after the phase (it skips there once it knows it).
            rejoin = next((row for row in lines if row["it"] >= b and row["participating"]),
                          None)
            # What the rejoin cost the group: rank 0's time between the end of
            # its step before the rejoin and the start of the rejoin's step
            # (begin_step: the new context and the broadcast, and any wait
            # for the straggler to get there).
            before = group.get(rejoin["it"] - 1) if rejoin else None
            wait = (group[rejoin["it"]]["t0"] - before["t0"] - before["step"]
                    if before and rejoin["it"] in group else None)
            rec.append((int(x["iteration"]) - fast["it"] + 1, ts(x["time"]) - fast["t0"],
                        rejoin["t0"] - fast["t0"] if rejoin else None, wait))
    for e in mine:
        if e.get("to") == "WORKER_STATE_STRAGGLER" and not any(
                a <= int(e.get("iteration", 0)) < b for a, b in phases):
            outside += 1
    excluded_its = sum(1 for row in lines if not row["participating"])
    return {"detection": det, "recovery": rec, "missed": missed, "premature": premature,
            "healthy_flagged": len(healthy_flagged), "flagged_outside": outside,
            "phases": len(ran_phases), "phases_skipped": skipped_phases,
            "memberships": len(memberships), "excluded_iterations": excluded_its,
            "skipped_iterations": res["final"][SLOW_RANK].get("skipped"),
            "stopped_early": res["final"][SLOW_RANK]["stopped_early"]}


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def fmt(x, digits=2):
    return "-" if x is None else ("%.*f" % (digits, x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--stragglerd", help="default: BUILD/daemon/stragglerd")
    p.add_argument("--pythonpath", help="the straggler package; default: BUILD/python")
    p.add_argument("--smoke", action="store_true",
                   help="ctest smoke: 1 epoch of 24 iterations, half-sd only; passes when "
                        "every rank finishes (detection under load is not asserted)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--iterations", type=int, default=40, help="iterations per epoch")
    p.add_argument("--cases", default=",".join(c[0] for c in CASES))
    p.add_argument("--case-timeout", type=float, default=900)
    p.add_argument("--json", help="write every case's analysis here")
    p.add_argument("--write-benchmarks", metavar="FILE",
                   help="replace the section '## Paper experiment (issue 5)' of FILE "
                        "(BENCHMARKS.md) with this run's table")
    p.add_argument("--from-json", help="only rewrite the table from a saved --json file")
    p.add_argument("--workdir", help="keep each case's logs, events and per-step rows here")
    a = p.parse_args()
    if a.smoke:
        a.epochs, a.iterations, a.cases, a.case_timeout = 1, 24, "half-sd", 120
    if a.from_json:
        with open(a.from_json) as f:
            out = json.load(f)
        if a.workdir:  # re-score from the kept per-case rows and events
            for name, r in out.items():
                path = os.path.join(a.workdir, name, "result.json")
                if r.get("stragglerd") and os.path.exists(path):
                    with open(path) as f:
                        res = json.load(f)
                    res["lines"] = {int(k): v for k, v in res["lines"].items()}
                    res["final"] = {int(k): v for k, v in res["final"].items()}
                    r.update(analyse(res, out["_run"]["iterations_per_epoch"], r["mode"]))
        publish(a, out)
        return
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIPPED: %s cannot import torch (%s)" % (sys.executable, e))
        sys.exit(77)
    wanted = a.cases.split(",")
    out = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="paper-exp-") as tmp:
        workdir = a.workdir or tmp
        os.makedirs(workdir, exist_ok=True)
        for name, mode, factor, sd in CASES:
            if name not in wanted:
                continue
            res = run_case(a, name, mode, factor, sd, workdir)
            ana = analyse(res, a.iterations, mode) if sd else {}
            steps = [row["step"] for r in range(WORLD) if r != SLOW_RANK
                     for row in res["lines"][r]]
            out[name] = dict(ana, job_s=res["job_s"], mode=mode, factor=factor, stragglerd=sd,
                             healthy_step_ms=1000 * sorted(steps)[len(steps) // 2])
            out[name]["loadavg_1min_after"] = os.getloadavg()[0]
            print(json.dumps({name: out[name]}), flush=True)
    out["_run"] = {"loadavg_1min_before": load_before[0], "epochs": a.epochs,
                   "iterations_per_epoch": a.iterations, "cpus": os.cpu_count(),
                   "date": datetime.datetime.now().isoformat(timespec="seconds")}
    publish(a, out)


def publish(a, out):
    """The results of a run (or a re-scored one): --json, the table, --write-benchmarks."""
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print_table(out)
    if a.write_benchmarks:
        write_benchmarks(a.write_benchmarks, out)


SECTION = "## Paper experiment (issue 5)"


def write_benchmarks(path, out):
    """Replaces the section (up to the next '## ') with the table of `out`."""
    import io
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_table(out)
    run = out["_run"]
    body = ["<!-- written by examples/paper_experiment/run.py --write-benchmarks; the text "
            "around the table is in run.py -->",
            "",
            "Run finished %s: %d epochs x %d iterations, %d CPUs; 1-minute load average %.1f before "
            "the run, after each case: %s." % (
                run["date"], run["epochs"], run["iterations_per_epoch"], run["cpus"],
                run["loadavg_1min_before"],
                ", ".join("%s %.1f" % (k, v["loadavg_1min_after"]) for k, v in out.items()
                          if not k.startswith("_"))),
            "", buf.getvalue().rstrip(), ""]
    with open(path) as f:
        text = f.read()
    start = text.find(SECTION)
    table_marker = "<!-- paper-experiment-table -->"
    if start < 0:
        raise SystemExit("%s has no section '%s'" % (path, SECTION))
    end = text.find("\n## ", start + len(SECTION))
    end = len(text) if end < 0 else end + 1
    section = text[start:end]
    a, b = section.find(table_marker), section.rfind(table_marker)
    if a < 0 or a == b:
        raise SystemExit("the section has no pair of %s markers" % table_marker)
    section = section[:a + len(table_marker)] + "\n" + "\n".join(body) + "\n" + section[b:]
    with open(path, "w") as f:
        f.write(text[:start] + section + text[end:])


def print_table(out):
    base = out.get("baseline", {}).get("job_s")
    print("| case | job time s | × baseline | det. latency it (mean/max) | det. latency s (mean/max) "
          "| rec. latency it (mean) | rec. latency s (mean/max) | back in the collective s (mean) "
          "| group's wait at the rejoin s (mean/max) | healthy flagged "
          "| rank 3 flagged while fast | slow phases missed | premature recoveries "
          "| rank 3 iterations excluded / skipped |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in out.items():
        if name.startswith("_"):
            continue
        det, rec = r.get("detection", []), r.get("recovery", [])
        row = [name, fmt(r["job_s"], 1), fmt(r["job_s"] / base if base else None)]
        if r["stragglerd"]:
            row += ["%s / %s" % (fmt(mean([d[0] for d in det]), 1),
                                 max([d[0] for d in det]) if det else "-"),
                    "%s / %s" % (fmt(mean([d[1] for d in det])),
                                 fmt(max([d[1] for d in det if d[1] is not None], default=None))),
                    fmt(mean([x[0] for x in rec]), 1),
                    "%s / %s" % (fmt(mean([x[1] for x in rec])),
                                 fmt(max([x[1] for x in rec], default=None))),
                    fmt(mean([x[2] if len(x) > 2 else None for x in rec])),
                    "%s / %s" % (fmt(mean([x[3] if len(x) > 3 else None for x in rec])),
                                 fmt(max([x[3] for x in rec if len(x) > 3 and x[3] is not None],
                                         default=None))),
                    str(r["healthy_flagged"]), str(r["flagged_outside"]),
                    "%d of %d" % (r["missed"], r["phases"]) + (
                        " (%d skipped)" % r["phases_skipped"] if r.get("phases_skipped") else ""),
                    str(r["premature"]),
                    "%d / %s" % (r["excluded_iterations"],
                                 "-" if r.get("skipped_iterations") is None
                                 else r["skipped_iterations"]) + (
                        " (stopped at %d)" % r["stopped_early"]
                        if r["stopped_early"] is not None else "")]
        else:
            row += ["-"] * 11
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
