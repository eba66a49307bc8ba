"""Helpers for the integration tests: run the real stragglerd on loopback.

    with Daemon(stragglerd_path, workdir) as d:
        subprocess.run([sim, "--daemon", d.address, ...])
        assert d.stop() == 0     # SIGTERM, must exit 0 within 10 s

The daemon listens on 127.0.0.1:0 and announces its address in a --ready-file,
so tests never race for a fixed port. Python standard library only.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


class TestFailure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise TestFailure(message)


def failures_exit(body, name):
    """Runs body() for a benchmark's main: its return value (None: 0), or 1
    after printing "NAME: FAILED: why" when it raised TestFailure."""
    try:
        return body() or 0
    except TestFailure as e:
        print("%s: FAILED: %s" % (name, e), file=sys.stderr)
        return 1


def percentile(values, q):
    """The q-quantile (0..1) of values, nearest rank from below; for the benchmarks."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Daemon:
    def __init__(self, binary, workdir, grpc_address="127.0.0.1:0", name="stragglerd",
                 extra_args=()):
        self.binary = binary
        self.extra_args = list(extra_args)
        self.workdir = workdir
        self.grpc_address = grpc_address
        self.ready_file = os.path.join(workdir, name + ".ready.json")
        self.log_path = os.path.join(workdir, name + ".log")
        self.proc = None
        self.address = None
        self.http_address = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        # On the failure path the daemon may still run: never leave it behind.
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return False

    def start(self):
        if os.path.exists(self.ready_file):
            os.unlink(self.ready_file)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [self.binary, "--grpc-address", self.grpc_address, "--http-address", "127.0.0.1:0",
             "--ready-file", self.ready_file, "--log-level", "info", *self.extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TestFailure("stragglerd exited with %d before it was ready:\n%s"
                                  % (self.proc.returncode, self.log_tail()))
            try:
                with open(self.ready_file) as f:
                    ready = json.load(f)
                self.address = ready["grpc_address"]
                self.http_address = ready["http_address"]
                check(ready.get("pid") == self.proc.pid,
                      "ready file pid %r is not the daemon's pid %d" % (ready.get("pid"),
                                                                       self.proc.pid))
                return
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                # Not written yet (the daemon writes it atomically, but be lenient).
                time.sleep(0.05)
        raise TestFailure("stragglerd did not write %s within %.0f s:\n%s"
                          % (self.ready_file, READY_TIMEOUT_S, self.log_tail()))

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM; returns the exit status, or raises if it does not exit in time."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TestFailure("stragglerd did not exit within %.0f s of SIGTERM:\n%s"
                              % (timeout, self.log_tail()))
        self.log.close()
        return rc

    def log_tail(self, lines=40):
        return file_tail(self.log_path, lines, "(no daemon log)")


def finish(proc, what, timeout, hang_detail=""):
    """Waits up to `timeout` s for `proc` (started with text pipes) to exit 0
    and returns its (stdout, stderr). TestFailure naming `what` when it hangs
    (it is killed; `hang_detail` is appended, e.g. a log tail) or exits with
    another status (its output's tail in the message)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise TestFailure("%s did not finish within %.0f s%s" % (what, timeout, hang_detail))
    check(proc.returncode == 0,
          "%s exited %d:\n%s\n%s" % (what, proc.returncode, out[-3000:], err[-3000:]))
    return out, err


def file_tail(path, lines, missing):
    """The last `lines` lines of the file at `path`; `missing` when it cannot
    be read."""
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return missing


def wait_for(what, fn, timeout=30.0, interval=0.05):
    """Polls fn() until it returns something truthy and returns that. An
    OSError/ValueError/KeyError from fn (a server not up yet, half-written
    JSON) counts as "not yet"; after `timeout` seconds the test fails naming
    `what` and the last value or error."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(interval)
    raise TestFailure("timed out after %.0f s waiting for %s (last: %r)" % (timeout, what, last))


def run(cmd, timeout, **kwargs):
    """Runs a command, capturing text output; raises on timeout."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        raise TestFailure("timed out after %d s: %s\nstdout:\n%s\nstderr:\n%s"
                          % (timeout, " ".join(cmd), e.stdout, e.stderr))


class RankProcesses:
    """One process per rank, each printing one JSON object per line: a line
    per iteration, then one with "final". Collects them per rank and fails
    with the rank's stderr when a rank exits badly or hangs."""

    def __init__(self, cmds, workdir, deadline_s, env=None, err_tail=2000):
        self.deadline_s = deadline_s
        self.err_tail = err_tail
        self.world = len(cmds)
        self.lines = {r: [] for r in range(self.world)}
        self.final = {}
        self.procs, self.errs = [], []
        for r, cmd in enumerate(cmds):
            err = open(os.path.join(workdir, "rank%d.err" % r), "w+")
            self.errs.append(err)
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(r, p), daemon=True).start()

    def _read(self, rank, proc):
        for line in proc.stdout:
            obj = json.loads(line)
            if "final" in obj:
                self.final[rank] = obj
            else:
                self.lines[rank].append(obj)

    def wait_all_past(self, iteration, ranks=None):
        ranks = range(self.world) if ranks is None else ranks
        deadline = time.monotonic() + self.deadline_s
        while time.monotonic() < deadline:
            if all(len(self.lines[r]) > iteration for r in ranks):
                return
            for r, p in enumerate(self.procs):
                if p.poll() not in (None, 0):
                    raise TestFailure("rank %d exited with %d: %s" % (r, p.returncode, self.err(r)))
            time.sleep(0.01)
        raise TestFailure("ranks did not all pass iteration %d within %d s"
                          % (iteration, self.deadline_s))

    def finish(self):
        deadline = time.monotonic() + self.deadline_s
        for r, p in enumerate(self.procs):
            try:
                rc = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise TestFailure("rank %d hung (still running after %d s): %s"
                                  % (r, self.deadline_s, self.err(r)))
            check(rc == 0, "rank %d exited with %d: %s" % (r, rc, self.err(r)))
        time.sleep(0.1)  # the reader threads drain the pipes after exit
        check(len(self.final) == self.world,
              "only ranks %s printed their final state" % sorted(self.final))

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def err(self, r):
        self.errs[r].flush()
        self.errs[r].seek(0)
        return self.errs[r].read()[-self.err_tail:]


def ctl(ctl_binary, daemon_address, *rest):
    """Runs stragglerctl against the daemon; fails the test on a non-zero exit."""
    res = run([ctl_binary, "--daemon", daemon_address, *rest], timeout=30)
    check(res.returncode == 0, "stragglerctl %s failed: %s" % (" ".join(rest), res.stderr))
    return res.stdout


def check_memberships_agreed(report, label):
    """Every rank that applied a membership version did so at its effective iteration."""
    for m in report["memberships"]:
        for rank, iteration in m["applied_at"].items():
            check(iteration == m["effective_iteration"],
                  "%s: rank %s applied membership v%d at iteration %d, but it is effective at %d"
                  % (label, rank, m["version"], iteration, m["effective_iteration"]))
    for key in ("reports_dropped", "reports_rejected", "rejoined_behind", "collective_timeouts",
                "version_splits"):
        check(report.get(key, 0) == 0, "%s: %s = %s, expected 0" % (label, key, report.get(key)))
    check(report["agreement_violations"] == 0,
          "%s: %d agreement violations" % (label, report["agreement_violations"]))


def daemon_get(daemon, path, **params):
    """GET path (+ ?params) of the daemon's REST API: parsed JSON, or the text
    of /metrics."""
    query = ("?" + urllib.parse.urlencode(params)) if params else ""
    with urllib.request.urlopen("http://%s%s%s" % (daemon.http_address, path, query),
                                timeout=30) as r:
        text = r.read().decode()
    return text if path == "/metrics" else json.loads(text)


class WorkerWatch:
    """Polls GET /v1/jobs/JOB/workers/RANK while the job runs, keeping every
    answer (the daemon's view of the rank over time)."""

    def __init__(self, daemon, job, rank):
        self.daemon, self.job, self.rank = daemon, job, rank
        self.seen = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.seen.append(daemon_get(self.daemon, "/v1/jobs/%s/workers/%d"
                                            % (self.job, self.rank)))
            except Exception:  # noqa: BLE001 - the job does not exist yet (404)
                pass
            time.sleep(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join()


def run_monitored_job(args, daemon, workdir, job, script, world, rank_args, deadline_s,
                      watch_rank):
    """Runs `world` processes of integration/SCRIPT (a straggler.torch rank:
    --store FILESTORE + rank_args(r), the client's options from the
    environment as in the recipe) against `daemon` to their end, polling
    REST for `watch_rank` meanwhile. args: the driver's --python and
    --pythonpath. Returns (RankProcesses, what REST said of watch_rank, the
    daemon's events of the job)."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=args.pythonpath, OMP_NUM_THREADS="1",
               STRAGGLER_ENDPOINT=daemon.address, STRAGGLER_JOB_ID=job,
               WORLD_SIZE=str(world))
    cmds = [["env", "RANK=%d" % r, args.python, os.path.join(here, script),
             "--store", os.path.join(workdir, "ddp.store")] + rank_args(r) for r in range(world)]
    ranks = RankProcesses(cmds, workdir, deadline_s, env=env, err_tail=3000)
    watch = WorkerWatch(daemon, job, watch_rank)
    try:
        ranks.finish()
    finally:
        watch.stop()
        ranks.kill()
    events = json.loads(ctl(args.ctl, daemon.address, "--output", "json", "events", job,
                            "--limit", "10000")).get("events", [])
    return ranks, watch.seen, events


def daemon_metric(daemon, name, labels):
    """The value of the daemon's sample of `name` whose labels include
    `labels`, or None."""
    for line in daemon_get(daemon, "/metrics").splitlines():
        m = re.match(r"^%s\{(.*)\} (\S+)$" % re.escape(name), line)
        if m and all('%s="%s"' % kv in m.group(1) for kv in labels.items()):
            return float(m.group(2))
    return None


def excluded(job):
    """The excluded ranks of a GET /v1/jobs/J answer, ascending."""
    return sorted(e["rank"] for e in job.get("membership", {}).get("excluded", []))


def flagged(report):
    """{rank: (detected_at, excluded_at)} of a straggler-sim --report's ranks
    that were detected or excluded."""
    return {r["rank"]: (r["detected_at"], r["excluded_at"]) for r in report["ranks"]
            if r["detected_at"] or r["excluded_at"]}


def run_sim(sim_binary, daemon, workdir, job, name, extra, endpoint=None, check_rc=True,
            timeout=120):
    """Runs one straggler-sim launch of 8 ranks (20 ms steps, seed 7) to its
    end and returns its --report. `endpoint`: where the sim reports (a node
    agent's unix://...); the daemon is then its --query-daemon."""
    report = os.path.join(workdir, name + ".json")
    cmd = [sim_binary, "--daemon", endpoint or daemon.address, "--job", job, "--ranks", "8",
           "--iteration-ms", "20", "--noise", "0.05", "--seed", "7", "--report", report]
    if endpoint:
        cmd += ["--query-daemon", daemon.address, "--membership-timeout-ms", "100"]
    cmd += list(extra)
    result = run(cmd, timeout)
    if check_rc:
        check(result.returncode == 0, "%s exited with %d:\n%s\ndaemon log:\n%s"
              % (" ".join(cmd), result.returncode, result.stderr[-2000:], daemon.log_tail()))
    with open(report) as f:
        return json.load(f)


def in_workdir(prefix, fn, keep=None):
    """Runs fn(workdir) in `keep` or a new temporary directory; a temporary
    one is removed when fn passes and kept (and named) when it fails, for the
    logs and reports in it."""
    workdir = keep or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(workdir, exist_ok=True)
    try:
        fn(workdir)
    except TestFailure:
        print("workdir kept: %s" % workdir, file=sys.stderr)
        raise
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)


def check_ended_quietly(daemon, job, version):
    """A job whose ranks all closed cleanly (docs/runs.md, "Job end"), some
    time after: every rank finished, the membership still at `version`, no
    rank unresponsive and no guard blocked."""
    workers = daemon_get(daemon, "/v1/jobs/%s/workers" % job)["workers"]
    states = sorted({w["state"] for w in workers})
    check(states == ["WORKER_STATE_FINISHED"], "ranks of the finished job: %s" % states)
    state = daemon_get(daemon, "/v1/jobs/" + job)
    check(state.get("finished") is True, "the job is no longer finished: %s" % state)
    check(state["membership"].get("version") == version,
          "the finished job's membership moved: v%s -> v%s"
          % (version, state["membership"].get("version")))
    events = daemon_get(daemon, "/v1/jobs/%s/events" % job)["events"]
    bad = [e for e in events if e.get("to") == "WORKER_STATE_UNRESPONSIVE"
           or e.get("kind") == "EVENT_KIND_GUARD_BLOCKED"]
    check(not bad, "events after a clean finish: %s" % bad)


def print_log_tails(workdir, names, lines=25):
    """After a failure: the last `lines` lines of each of the logs `names` in
    `workdir` that exists, so that the test's output shows what the processes
    said."""
    for name in names:
        path = os.path.join(workdir, name)
        if os.path.exists(path):
            with open(path) as f:
                print("--- %s (tail)\n%s" % (name, "".join(f.readlines()[-lines:])))


def require_torch():
    """Exits 77 (ctest's SKIP_RETURN_CODE of the torch tests) when this
    interpreter cannot import torch."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIPPED: %s cannot import torch (%s): install Debian's python3-torch"
              % (sys.executable, e))
        sys.exit(77)


def main(test_fn):
    """Runs test_fn(), printing a failure and exiting 1 on TestFailure."""
    try:
        test_fn()
    except TestFailure as e:
        print("FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)
    print("PASSED")


def torch_cases_main(cases, description, workdir_prefix, probe="torch"):
    """Entry point of a torch test run by case: --case (a key of `cases`),
    --stragglerd, --python (an interpreter that imports torch) and
    --pythonpath; exit 77 (skipped) when --python cannot import `probe`;
    then cases[case](args, workdir) through main() in a fresh workdir."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--case", required=True, choices=sorted(cases))
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--python", required=True, help="an interpreter that imports torch")
    parser.add_argument("--pythonpath", required=True)
    args = parser.parse_args()
    if subprocess.run([args.python, "-c", "import " + probe],
                      capture_output=True).returncode != 0:
        print("SKIPPED: %s cannot import %s (Debian package python3-torch)" % (args.python, probe))
        sys.exit(77)
    main(lambda: in_workdir(workdir_prefix, lambda w: cases[args.case](args, w)))


def run_main(test, *binaries, description=None):
    """A test's entry point: a required --NAME PATH for each of `binaries`
    ("stragglerd", "ctl", ...), then main(lambda: test(args)) with the parsed
    args (args.fake_nvml for "fake-nvml")."""
    parser = argparse.ArgumentParser(description=description)
    for name in binaries:
        parser.add_argument("--" + name, required=True)
    args = parser.parse_args()
    main(lambda: test(args))
