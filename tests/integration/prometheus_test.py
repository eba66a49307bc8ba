#!/usr/bin/env python3
"""End to end with a real Prometheus: stragglerd fed by straggler-sim (8 ranks,
rank 3 slowed 3x), scraped every second by `prometheus` running the shipped
deploy/prometheus/prometheus.yml (intervals shortened, target and rule path
rewritten) with the shipped alert rules loaded.

While rank 3 is excluded, runs through Prometheus's HTTP API:
  - every alert rule's expression (as Prometheus loaded it; `for:` is not
    waited out, the expression is what is checked), each with an expected
    outcome: StragglerDetected and RankExcludedTooLong must match rank 3's
    job; StragglerdDown, StragglerdNotIngesting and HighReportRejectRate must
    be empty; the others (no guard block, no GPU telemetry) may be either;
  - every PromQL expression of every Grafana dashboard panel, variable and
    annotation, with the dashboard variables substituted ($job = the sim's
    job, $rank = All and a two-rank selection, $__rate_interval = 1m, ...):
    no query may fail, and each must return data except the GPU telemetry
    panels (empty until the agent reports GPU telemetry);
  - `promtool check metrics` on a live scrape of /metrics must print nothing;
  - the scrape must match the metric table of docs/metrics.md (names, types, labels).
Then the sim's recovery must reach Prometheus, and after SIGTERM to the daemon
the StragglerdDown expression must match.

    prometheus_test.py --stragglerd PATH --sim PATH --source-dir REPO
                       [--prometheus PATH] [--promtool PATH] [--keep DIR]

Python 3 standard library only.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, TestFailure, check, file_tail, main, run, wait_for  # noqa: E402

RANKS = 8
SLOW_RANK = 3
# Slow from iteration 250 (~5 s in), so Prometheus has scraped the job's
# healthy state (and membership version) before the exclusion.
SLOW = "%d:3:250:1200" % SLOW_RANK
ITERATIONS = 1500
ITERATION_MS = 20
SEED = 20231021
SIM_TIMEOUT_S = 120
SCRAPE_INTERVAL = "1s"

# Expected outcome of each alert expression while rank 3 is excluded:
# "match" (non-empty), "empty", or "any".
ALERTS = {
    "StragglerDetected": "match",
    "RankExcludedTooLong": "match",
    "ExclusionGuardReached": "any",      # one straggler of 8: no guard should block
    "MembershipChangeWithheld": "empty",  # every rank has its stream: nothing waits
    "StragglerdDown": "empty",
    "StragglerdNotIngesting": "empty",
    "HighReportRejectRate": "empty",
    "StaleReports": "empty",             # a live sim never goes backwards
    "StragglerdCertificateExpiry": "empty",  # no TLS here: no certificate to expire
    "GpuThermalThrottling": "any",       # no GPU telemetry without the agent
    "GpuPowerThrottling": "any",
    "JobEndedUnexpectedly": "empty",     # the sim runs: its job is not lost
    "RanksPersistentlySlow": "empty",    # rank 3 at 3x is a straggler, not mild; the rest healthy
    # Replicas only (straggler_cluster_*): a daemon alone never fires them.
    "JobWithoutOwner": "empty",
    "OwnershipFlapping": "empty",
    "EtcdUnreachable": "empty",
}
GPU_METRIC_PREFIX = "straggler_rank_gpu_"
# Dashboard queries that may return nothing in this scenario, with the reason.
# Everything else must return data.
MAY_BE_EMPTY = [
    (lambda expr: GPU_METRIC_PREFIX in expr, "GPU telemetry: empty until the agent reports it"),
    (lambda expr: "straggler_cluster_" in expr,
     "replicas on etcd: a stragglerd alone exports no straggler_cluster_ family"),
]
GPU_METRICS = {"straggler_rank_gpu_sm_clock_hertz", "straggler_rank_gpu_temperature_celsius",
               "straggler_rank_gpu_power_watts", "straggler_rank_gpu_throttle_thermal",
               "straggler_rank_gpu_throttle_power"}


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5.0):
    """(status, body text); status 0 when the connection fails."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, ConnectionError, socket.timeout, OSError):
        return 0, ""


class Prometheus:
    def __init__(self, binary, workdir, config_text):
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.config_path = os.path.join(workdir, "prometheus.yml")
        with open(self.config_path, "w") as f:
            f.write(config_text)
        self.log_path = os.path.join(workdir, "prometheus.log")
        self.proc = None

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [self.binary, "--config.file=" + self.config_path,
             "--storage.tsdb.path=" + os.path.join(self.workdir, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % self.port,
             "--log.level=info"],
            stdout=self.log, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise TestFailure("prometheus exited with %d:\n%s"
                                  % (self.proc.returncode, self.log_tail()))
            return http_get(self.url + "/-/ready")[0] == 200
        wait_for("prometheus /-/ready", ready, 30)
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return False

    def log_tail(self, lines=30):
        return file_tail(self.log_path, lines, "(no prometheus log)")

    def api(self, path, **params):
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        status, body = http_get(url, timeout=10)
        try:
            doc = json.loads(body)
        except json.JSONDecodeError:
            raise TestFailure("GET %s: HTTP %d, not JSON: %r" % (url, status, body[:300]))
        return status, doc

    def query(self, expr):
        """The result list of an instant query; raises on a query error."""
        status, doc = self.api("/api/v1/query", query=expr)
        if status != 200 or doc.get("status") != "success":
            raise TestFailure("query failed (HTTP %d): %s\n%s: %s"
                              % (status, expr, doc.get("errorType"), doc.get("error")))
        data = doc["data"]
        if data["resultType"] in ("scalar", "string"):
            return [data["result"]]
        return data["result"]


def prometheus_config(source_dir, http_address, rules_path):
    """deploy/prometheus/prometheus.yml with 1 s intervals, our target and rule path."""
    with open(os.path.join(source_dir, "deploy", "prometheus", "prometheus.yml")) as f:
        text = f.read()
    check("honor_labels: true" in text,
          "deploy/prometheus/prometheus.yml must keep honor_labels: true (the `job` label)")
    for old, new in (("scrape_interval: 15s", "scrape_interval: " + SCRAPE_INTERVAL),
                     ("evaluation_interval: 15s", "evaluation_interval: " + SCRAPE_INTERVAL),
                     ('"localhost:7071"', '"%s"' % http_address),
                     ("- stragglerd-rules.yml", "- " + rules_path)):
        check(old in text, "deploy/prometheus/prometheus.yml no longer contains %r" % old)
        text = text.replace(old, new)
    return text


# ----------------------------------------------------------------- dashboards

def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def dashboard_queries(path):
    """(dashboard uid, where, expr) for every PromQL expression of a dashboard."""
    with open(path) as f:
        d = json.load(f)
    uid = d["uid"]
    out = []
    for p in walk_panels(d.get("panels", [])):
        for t in p.get("targets", []):
            out.append((uid, "panel %r %s" % (p.get("title"), t.get("refId")), t["expr"]))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q, re.S)
        out.append((uid, "variable %r" % v["name"], m.group(1) if m else q))
    for a in d.get("annotations", {}).get("list", []):
        if not a.get("builtIn"):
            out.append((uid, "annotation %r" % a.get("name"), a["expr"]))
    return out


def substitute(expr, values):
    def repl(m):
        name = m.group(1) or m.group(2)
        if name not in values:
            raise TestFailure("no test value for dashboard variable $%s in: %s" % (name, expr))
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


# ------------------------------------------------------------ metric contract

def doc_metric_table(source_dir):
    """{name: (type, frozenset(labels))} from the metric table of docs/metrics.md."""
    with open(os.path.join(source_dir, "docs", "metrics.md"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Daemon metrics\n(.*?)(?=^#)", text, re.M | re.S)
    check(m is not None, "docs/metrics.md has no '## Daemon metrics' section")
    table = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        labels = frozenset(l.strip() for l in cells[2].split(",") if l.strip())
        if name == "process_*":
            for p in re.findall(r"`(process_[a-z_]+)`", cells[3]):
                table[p] = ("counter" if p.endswith("_total") else "gauge", frozenset())
        else:
            table[name] = (cells[1], labels)
    check(len(table) >= 10, "docs/metrics.md metric table: only %d metrics parsed" % len(table))
    return table


LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """({family: type}, {family: [label dicts of its samples]})."""
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ.strip()
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][\w:]*)(\{.*\})?\s", line)
        if not m:
            continue
        name, labels = m.group(1), dict(LABEL_RE.findall(m.group(2) or ""))
        family = name
        if name not in types:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if types.get(base) == "histogram":
                family = base
                labels.pop("le", None)
        samples.setdefault(family, []).append(labels)
    return types, samples


def check_contract(text, table):
    """Problems (strings) where the live scrape differs from the docs/metrics.md table."""
    problems = []
    types, samples = parse_exposition(text)
    for name, (typ, labels) in sorted(table.items()):
        if name not in types:
            problems.append("%s (%s) is in the docs/metrics.md table but not exposed" % (name, typ))
            continue
        if types[name] != typ:
            problems.append("%s: TYPE %s, docs/metrics.md says %s" % (name, types[name], typ))
        for lab in samples.get(name, []):
            if frozenset(lab) != labels:
                problems.append("%s: sample labels {%s}, docs/metrics.md says {%s}"
                                % (name, ", ".join(sorted(lab)), ", ".join(sorted(labels))))
                break
    for name in sorted(types):
        if name.startswith("straggler_") and name not in table and name not in GPU_METRICS:
            problems.append("%s (%s) is exposed but not in the docs/metrics.md table" % (name, types[name]))
    return problems, samples


# ----------------------------------------------------------------------- test

def read_http_address(daemon):
    def get():
        try:
            with open(daemon.ready_file) as f:
                return json.load(f).get("http_address")
        except (OSError, json.JSONDecodeError):
            return None
    return wait_for("http_address in the ready file %s" % daemon.ready_file, get, 10)


def test(args):
    for tool in ("prometheus", "promtool"):
        path = getattr(args, tool)
        path = shutil.which(path) if path else None
        setattr(args, tool, path)
        check(path is not None,
              "%s not found (Debian package `prometheus`; run scripts/install-deps.sh)" % tool)
    args.source_dir = os.path.abspath(args.source_dir)  # rule_files is relative to the config
    workdir = args.keep or tempfile.mkdtemp(prefix="straggler-prom-")
    os.makedirs(workdir, exist_ok=True)
    print("work directory: %s" % workdir)
    rules_path = os.path.join(args.source_dir, "deploy", "prometheus", "stragglerd-rules.yml")
    job = "it-prom-%d" % os.getpid()

    with Daemon(args.stragglerd, workdir) as daemon:
        http_address = read_http_address(daemon)
        metrics_url = "http://%s/metrics" % http_address
        print("stragglerd: gRPC %s, HTTP %s" % (daemon.address, http_address))
        wait_for("stragglerd /readyz", lambda: http_get("http://%s/readyz" % http_address)[0] == 200, 15)

        config = prometheus_config(args.source_dir, http_address, rules_path)
        with Prometheus(args.prometheus, workdir, config) as prom:
            print("prometheus at %s" % prom.url)
            wait_for("the first scrape of stragglerd",
                     lambda: prom.query('up{job="stragglerd"} == 1'), 20)

            sim_log = open(os.path.join(workdir, "sim.log"), "w")
            report_path = os.path.join(workdir, "sim-report.json")
            sim_cmd = [args.sim, "--daemon", daemon.address, "--job", job, "--ranks", str(RANKS),
                       "--iterations", str(ITERATIONS), "--iteration-ms", str(ITERATION_MS),
                       "--noise", "0.05", "--slow", SLOW, "--seed", str(SEED),
                       "--report", report_path]
            sim = subprocess.Popen(sim_cmd, stdout=sim_log, stderr=subprocess.STDOUT)
            try:
                run_while_excluded(args, prom, job, metrics_url, daemon)
                try:
                    rc = sim.wait(timeout=SIM_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    raise TestFailure("straggler-sim did not finish within %d s" % SIM_TIMEOUT_S)
                check(rc == 0, "straggler-sim exited with %d: see %s" % (rc, sim_log.name))
            finally:
                if sim.poll() is None:
                    sim.kill()
                    sim.wait()
                sim_log.close()

            # The recovery (rank 3 fast again from iteration 1200) reaches Prometheus.
            wait_for("rank %d's recovery in Prometheus" % SLOW_RANK, lambda: prom.query(
                'straggler_job_recoveries_total{job="%s"} >= 1 and on (job) '
                'straggler_job_excluded_ranks{job="%s"} == 0' % (job, job)), 20)
            print("recovery seen by Prometheus")

            rc = daemon.stop()
            check(rc == 0, "stragglerd exited with %d after SIGTERM:\n%s" % (rc, daemon.log_tail()))
            down = wait_for("the StragglerdDown expression to match once stragglerd is stopped",
                            lambda: prom.query(alert_exprs(prom)["StragglerdDown"]), 20)
            print("StragglerdDown expression matches after SIGTERM: %s" % down[0]["metric"])
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)  # kept on failure, for the logs


def alert_exprs(prom):
    status, doc = prom.api("/api/v1/rules", type="alert")
    check(status == 200 and doc.get("status") == "success", "GET /api/v1/rules: %r" % doc)
    return {r["name"]: r["query"] for g in doc["data"]["groups"] for r in g["rules"]}


def run_while_excluded(args, prom, job, metrics_url, daemon):
    excluded = 'straggler_rank_excluded{job="%s", rank="%d"} == 1' % (job, SLOW_RANK)
    wait_for("rank %d excluded, as scraped by Prometheus" % SLOW_RANK,
             lambda: prom.query(excluded), 60)
    time.sleep(3)  # a few more scrapes, so rate() windows hold the exclusion
    print("rank %d excluded; checking queries" % SLOW_RANK)
    failures = []

    # Every alert rule loaded and evaluated without error.
    def rules_ok():
        status, doc = prom.api("/api/v1/rules")
        rules = [r for g in doc["data"]["groups"] for r in g["rules"]]
        return rules if rules and all(r.get("health") == "ok" for r in rules) else None
    try:
        wait_for("every rule evaluated with health ok", rules_ok, 15)
    except TestFailure:
        status, doc = prom.api("/api/v1/rules")
        raise TestFailure("rules not healthy: %s" % json.dumps(
            [(r["name"], r.get("health"), r.get("lastError")) for g in doc["data"]["groups"]
             for r in g["rules"]]))
    exprs = alert_exprs(prom)
    check(set(exprs) == set(ALERTS), "alert rules loaded %s, test expects %s"
          % (sorted(exprs), sorted(ALERTS)))
    for name, expr in sorted(exprs.items()):
        result = prom.query(expr)
        want = ALERTS[name]
        print("  alert %-24s %-5s -> %d series" % (name, want, len(result)))
        if want == "match" and not result:
            failures.append("alert %s: expression returned nothing: %s" % (name, expr))
        if want == "empty" and result:
            failures.append("alert %s: expression matched %s: %s" % (name, result, expr))
        if name == "StragglerDetected" and result:
            if not any(r["metric"].get("job") == job for r in result):
                failures.append("StragglerDetected does not match job %s: %s" % (job, result))
        if name == "RankExcludedTooLong" and result:
            if not any(r["metric"].get("job") == job and r["metric"].get("rank") == str(SLOW_RANK)
                       for r in result):
                failures.append("RankExcludedTooLong does not match rank %d: %s" % (SLOW_RANK, result))

    # Every dashboard query.
    values = {"job": job, "__rate_interval": "1m", "__interval": "15s", "__interval_ms": "15000",
              "__range": "10m", "__range_s": "600", "__range_ms": "600000",
              "datasource": "prometheus"}
    files = sorted(glob.glob(os.path.join(args.source_dir, "grafana", "dashboards", "*.json")))
    check(files, "no dashboards in grafana/dashboards")
    count = 0
    for path in files:
        for uid, where, raw in dashboard_queries(path):
            variants = [".+", "(3|5)"] if re.search(r"\$\{?rank\b", raw) else [None]
            for rank in variants:
                expr = substitute(raw, dict(values, rank=rank or ""))
                count += 1
                try:
                    result = prom.query(expr)
                except TestFailure as e:
                    failures.append("%s %s: %s" % (uid, where, e))
                    continue
                allowed = [why for pred, why in MAY_BE_EMPTY if pred(raw)]
                print("  %-20s %-55s -> %d%s" % (uid, where[:55], len(result),
                                                 " (may be empty)" if allowed else ""))
                if not result and not allowed:
                    failures.append("%s %s returned nothing: %s" % (uid, where, expr))
                if where == "variable 'job'" and not any(r["metric"].get("job") == job for r in result):
                    failures.append("%s: job variable query does not list %s" % (uid, job))
                if where == "variable 'rank'" and \
                        {r["metric"].get("rank") for r in result} != {str(r) for r in range(RANKS)}:
                    failures.append("%s: rank variable query lists %s"
                                    % (uid, sorted({r["metric"].get("rank") for r in result})))
    print("ran %d alert and %d dashboard queries" % (len(exprs), count))

    # promtool check metrics on a live scrape: no lint findings.
    status, scrape = http_get(metrics_url)
    check(status == 200, "GET %s: HTTP %d" % (metrics_url, status))
    lint = run([args.promtool, "check", "metrics"], 30, input=scrape)
    if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
        failures.append("promtool check metrics (exit %d):\n%s%s"
                        % (lint.returncode, lint.stdout, lint.stderr))
    else:
        print("promtool check metrics: clean (%d lines scraped)" % len(scrape.splitlines()))

    # The scrape matches the metric table of docs/metrics.md.
    problems, samples = check_contract(scrape, doc_metric_table(args.source_dir))
    failures += ["metric contract: " + p for p in problems]
    if not problems:
        print("metric contract: %d families match the docs/metrics.md table" % len(samples))

    if failures:
        raise TestFailure("%d problem(s):\n  %s\ndaemon log:\n%s"
                          % (len(failures), "\n  ".join(failures), daemon.log_tail(15)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stragglerd", required=True)
    parser.add_argument("--sim", required=True)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--prometheus", default=shutil.which("prometheus"))
    parser.add_argument("--promtool", default=shutil.which("promtool"))
    parser.add_argument("--keep", help="work directory to keep (default: a fresh temp dir)")
    parsed = parser.parse_args()
    main(lambda: test(parsed))
