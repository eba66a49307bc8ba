#!/usr/bin/env python3
"""Lints the Grafana dashboards in grafana/dashboards/ against the metric contract.

    dashboards_lint.py --source-dir REPO_ROOT

Checks, for every dashboard:
  - the uid is the file name without .json (stable links: /d/stragglerd-job/...);
  - no import-only inputs (`__inputs`, `${DS_...}`); a templating variable
    `datasource` of type "datasource" (query "prometheus"), and every panel,
    target, query variable and annotation uses the datasource `${datasource}`;
  - every target has a PromQL expression, panel ids are unique;
  - every `$variable` used is defined by the dashboard or is a Grafana global;
  - every metric name in a PromQL expression (panels, variables, annotations)
    is in a metric table of docs/metrics.md ("Daemon metrics", "Cluster metrics"), or is one of the
    GPU telemetry gauges of the agent issue; histogram series (_bucket, _sum,
    _count) only for metrics the table calls histograms;
  - panels on GPU telemetry say in their description that they stay empty
    until the agent reports it;
  - the figures operators look for are there (REQUIRED_METRICS): the job
    dashboard graphs the step time against the baseline (throughput lost).
Python 3 standard library only. Exit status 1 and one line per problem on failure.
"""

import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
import md_tables  # noqa: E402  (tests/docs/md_tables.py)

# GPU telemetry, exported once the node agent attaches NVML readings to
# reports (agent issue). Labels job, rank, node, gpu.
GPU_METRICS = {
    "straggler_rank_gpu_sm_clock_hertz": "gauge",
    "straggler_rank_gpu_temperature_celsius": "gauge",
    "straggler_rank_gpu_power_watts": "gauge",
    "straggler_rank_gpu_throttle_thermal": "gauge",
    "straggler_rank_gpu_throttle_power": "gauge",
}
# dashboard file -> metrics some panel of it must query.
REQUIRED_METRICS = {
    "stragglerd-job.json": {"straggler_job_step_seconds", "straggler_job_baseline_seconds"},
}
GRAFANA_GLOBALS = {"__interval", "__interval_ms", "__rate_interval", "__range", "__range_s",
                   "__range_ms", "__from", "__to", "__dashboard", "__name", "__org", "__user",
                   "timeFilter", "__timeFilter"}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                   "unless", "bool", "offset", "inf", "nan"}
DS = {"type": "prometheus", "uid": "${datasource}"}


def doc_metrics(path):
    """{metric name: type} from the metric table of docs/metrics.md."""
    metrics = {}
    tables = md_tables.section(path, "## Daemon metrics") + md_tables.section(path, "## Cluster metrics")
    for cells in md_tables.rows(tables, min_cells=4):
        name = cells[0].strip("`")
        if name == "process_*":
            for p in re.findall(r"`(process_[a-z_]+)`", cells[3]):
                metrics[p] = "counter" if p.endswith("_total") else "gauge"
        else:
            metrics[name] = cells[1]
    if len(metrics) < 10:
        raise SystemExit("docs/metrics.md metric table: only %d metrics parsed" % len(metrics))
    return metrics


def strip_promql(expr):
    """The expression without strings, label matchers, ranges and grouping label lists."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", e)
    return e


def metric_names(expr):
    names = set()
    e = strip_promql(expr)
    # an identifier followed by "(" is a function, by "by"/"without" an aggregation
    for m in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)(\s*(?:\(|(?:by|without)\b))?", e):
        ident, call = m.group(1), m.group(2)
        if call or ident.lower() in PROMQL_KEYWORDS:
            continue
        names.add(ident)
    return names


def label_values_query(query):
    """label_values(expr, label) -> expr; label_values(label) -> None; else the query."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query, re.S)
    if m:
        return m.group(1)
    if re.fullmatch(r"\s*label_values\(\s*\w+\s*\)\s*", query):
        return None
    m = re.fullmatch(r"\s*query_result\((.*)\)\s*", query, re.S)
    return m.group(1) if m else query


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def dashboard_queries(d):
    """(where, expr) for every PromQL expression of a dashboard."""
    out = []
    for p in walk_panels(d.get("panels", [])):
        for t in p.get("targets", []):
            out.append(("panel %r target %s" % (p.get("title"), t.get("refId")), t.get("expr", "")))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else q
            e = label_values_query(q or "")
            if e is not None:
                out.append(("variable %r" % v.get("name"), e))
    for a in d.get("annotations", {}).get("list", []):
        if a.get("builtIn"):
            continue
        out.append(("annotation %r" % a.get("name"), a.get("expr", "")))
    return out


def lint(path, known):
    problems = []

    def bad(msg):
        problems.append("%s: %s" % (os.path.relpath(path), msg))

    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        bad("not JSON: %s" % e)
        return problems
    stem = os.path.basename(path)[:-len(".json")]
    if d.get("uid") != stem:
        bad("uid %r, expected %r (the file name)" % (d.get("uid"), stem))
    if "__inputs" in d or "__requires" in d:
        bad("has __inputs/__requires: export for sharing externally is off; use the datasource variable")
    if re.search(r"\$\{?DS_", text):
        bad("references an import-only ${DS_...} input")
    if not isinstance(d.get("schemaVersion"), int) or not 36 <= d["schemaVersion"] <= 39:
        bad("schemaVersion %r, expected 36..39 (Grafana 9/10)" % d.get("schemaVersion"))
    if d.get("id") is not None:
        bad("id must be null (Grafana assigns it)")

    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    dsv = variables.get("datasource")
    if not dsv or dsv.get("type") != "datasource" or dsv.get("query") != "prometheus":
        bad('needs a templating variable "datasource" of type "datasource" with query "prometheus"')
    for name, v in variables.items():
        if v.get("type") == "query" and v.get("datasource") != DS:
            bad("variable %r uses datasource %r, expected %r" % (name, v.get("datasource"), DS))
    for a in d.get("annotations", {}).get("list", []):
        if not a.get("builtIn") and a.get("datasource") != DS:
            bad("annotation %r uses datasource %r, expected %r" % (a.get("name"), a.get("datasource"), DS))

    ids = set()
    for p in walk_panels(d.get("panels", [])):
        title = p.get("title")
        if p.get("id") in ids:
            bad("panel id %r is not unique" % p.get("id"))
        ids.add(p.get("id"))
        if "gridPos" not in p:
            bad("panel %r has no gridPos" % title)
        if p.get("type") == "row":
            continue
        targets = p.get("targets", [])
        if not targets:
            bad("panel %r has no targets" % title)
        if p.get("datasource") != DS:
            bad("panel %r uses datasource %r, expected %r" % (title, p.get("datasource"), DS))
        for t in targets:
            if t.get("datasource") != DS:
                bad("panel %r target %s uses datasource %r, expected %r"
                    % (title, t.get("refId"), t.get("datasource"), DS))
            if not t.get("expr", "").strip():
                bad("panel %r target %s has no expr" % (title, t.get("refId")))
        if any("straggler_rank_gpu_" in t.get("expr", "") for t in targets) \
                and "Empty until" not in p.get("description", ""):
            bad("panel %r shows GPU telemetry but its description does not say it is "
                "empty until the agent reports it" % title)

    used = set()
    for where, expr in dashboard_queries(d):
        used |= metric_names(expr)
        for var in re.findall(r"\$\{?(\w+)", expr):
            if var not in variables and var not in GRAFANA_GLOBALS:
                bad("%s uses undefined variable $%s" % (where, var))
        for name in metric_names(expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name in known:
                continue
            if base != name and known.get(base) == "histogram":
                continue
            bad("%s uses metric %r, which is not in the docs/metrics.md metric table "
                "nor a GPU telemetry gauge: %s" % (where, name, expr))
    for name in sorted(REQUIRED_METRICS.get(os.path.basename(path), set()) - used):
        bad("no panel queries %s" % name)
    return problems


def self_test():
    got = metric_names('sum by (job, le) (rate(a_bucket{job="$job", x=~"b|c"}[$__rate_interval]))'
                       ' / on (job) group_left () b_total and time() - c offset 5m')
    assert got == {"a_bucket", "b_total", "c"}, got
    assert label_values_query("label_values(m{job=\"$job\"}, rank)") == 'm{job="$job"}'


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    self_test()
    known = doc_metrics(os.path.join(args.source_dir, "docs", "metrics.md"))
    known.update(GPU_METRICS)
    files = sorted(glob.glob(os.path.join(args.source_dir, "grafana", "dashboards", "*.json")))
    expected = {"stragglerd-overview.json", "stragglerd-job.json"}
    missing = expected - {os.path.basename(f) for f in files}
    problems = ["grafana/dashboards/%s is missing" % m for m in sorted(missing)]
    queries = 0
    for f in files:
        problems += lint(f, known)
        with open(f, encoding="utf-8") as fh:
            queries += len(dashboard_queries(json.load(fh)))
    return md_tables.finish(problems, "%d dashboards, %d PromQL expressions, %d known metrics"
                            % (len(files), queries, len(known)))


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main())
