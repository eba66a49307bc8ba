#!/usr/bin/env python3
"""docs/configuration.md lists every config key with the shipped default.

    config_reference.py --source-dir REPO_ROOT

deploy/stragglerd.yaml and deploy/straggler-agent.yaml show every key with its
built-in default (config_test and agent_config_test check that against the
code). This test checks the reference tables against those files: every key
of stragglerd.yaml is a row of "### Daemon keys" in docs/configuration.md
(the `policy` keys are rows of "## Policy fields" in docs/detection.md), every
key of straggler-agent.yaml a row of "### Agent keys", each with the file's
default, and no row names a key the file lacks. A row may name several keys
("`a`, `b`") that share one default, or have one default each ("1, 2"). Exit status 1 and one line per problem.
"""

import argparse
import os
import re
import sys

import yaml

import md_tables


def flatten(mapping, prefix=""):
    """{dotted key: value} of a YAML mapping; a list value is a leaf."""
    out = {}
    for k, v in mapping.items():
        key = prefix + str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def table(path, heading):
    """{key: default cell} of the table under `heading`."""
    out = {}
    for cells in md_tables.rows(md_tables.section(path, heading)):
        keys = re.findall(r"`([^`]+)`", cells[0])
        # "`a`, `b`" with "1, 2": one default each; with one default: shared.
        defaults = [d.strip() for d in cells[1].split(",")]
        for i, key in enumerate(keys):
            out[key] = defaults[i] if len(keys) > 1 and len(defaults) == len(keys) else cells[1]
    return out


def same_default(value, cell):
    """Whether a table's default cell states the YAML value."""
    cell = cell.split(" (")[0].strip()
    if cell == "" and isinstance(value, list):
        return False
    word = cell.strip("` ")
    if isinstance(value, bool):
        return word == ("true" if value else "false")
    if isinstance(value, (int, float)):
        try:
            return float(word) == float(value)
        except ValueError:
            return False
    if isinstance(value, list):
        return word == yaml.safe_dump(value, default_flow_style=True).strip()
    if value == "":
        return word == '""'
    return word == str(value)


def compare(what, keys, rows, problems):
    for key, value in sorted(keys.items()):
        if key not in rows:
            problems.append("%s: key %s (default %r) is not in the table" % (what, key, value))
        elif not same_default(value, rows[key]):
            problems.append("%s: key %s: the table says %r, the shipped file %r"
                            % (what, key, rows[key], value))
    for key in sorted(set(rows) - set(keys)):
        problems.append("%s: the table names %s, which the shipped file does not have" % (what, key))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    src = args.source_dir
    with open(os.path.join(src, "deploy", "stragglerd.yaml"), encoding="utf-8") as f:
        daemon = flatten(yaml.safe_load(f))
    with open(os.path.join(src, "deploy", "straggler-agent.yaml"), encoding="utf-8") as f:
        agent = flatten(yaml.safe_load(f))
    conf = os.path.join(src, "docs", "configuration.md")
    problems = []
    policy = {k[len("policy."):]: v for k, v in daemon.items() if k.startswith("policy.")}
    rest = {k: v for k, v in daemon.items() if not k.startswith("policy.")}
    daemon_rows = table(conf, "### Daemon keys")
    daemon_rows.pop("policy.*", None)
    compare("docs/configuration.md daemon keys", rest, daemon_rows, problems)
    compare("docs/detection.md policy fields", policy,
            table(os.path.join(src, "docs", "detection.md"), "## Policy fields"), problems)
    compare("docs/configuration.md agent keys", agent, table(conf, "### Agent keys"), problems)
    if len(daemon) < 40 or len(agent) < 20:
        problems.append("only %d daemon and %d agent keys parsed" % (len(daemon), len(agent)))
    return md_tables.finish(problems, "%d daemon keys (%d policy fields) and %d agent keys "
                            "documented with their defaults" % (len(daemon), len(policy), len(agent)))


if __name__ == "__main__":
    sys.exit(main())
