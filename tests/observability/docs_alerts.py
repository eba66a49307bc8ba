#!/usr/bin/env python3
"""The alert table of docs/operations.md lists exactly the alerts of the rules file.

    docs_alerts.py --source-dir REPO_ROOT

Every `- alert:` of deploy/prometheus/stragglerd-rules.yml is a row of the
table under docs/operations.md "## Alerts" (first column the name in
backticks), with the rule's `severity` label, in the rules file's order; and
the table names no alert the file lacks. (The README, where the table was
then, once listed 8 of 9.)
Python 3 standard library only; exit status 1 and one line per problem.
"""

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
import md_tables  # noqa: E402  (tests/docs/md_tables.py)


def rules_alerts(path):
    """[(name, severity)] in file order. The file's layout is fixed by promtool
    check rules and yamllint: `- alert: NAME`, then its `severity:` label."""
    alerts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*- alert:\s*(\w+)\s*$", line)
            if m:
                alerts.append([m.group(1), None])
                continue
            m = re.match(r"\s*severity:\s*(\w+)\s*$", line)
            if m and alerts and alerts[-1][1] is None:
                alerts[-1][1] = m.group(1)
    return [tuple(a) for a in alerts]


def doc_alerts(path):
    """[(name, severity)] of the alert table of docs/operations.md, in table order."""
    return [(cells[0].strip("`"), cells[1])
            for cells in md_tables.rows(md_tables.section(path, "## Alerts"))
            if re.fullmatch(r"`\w+`", cells[0])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    rules = rules_alerts(os.path.join(args.source_dir, "deploy", "prometheus",
                                      "stragglerd-rules.yml"))
    doc = doc_alerts(os.path.join(args.source_dir, "docs", "operations.md"))
    problems = []
    if len(rules) < 5:
        problems.append("only %d alerts parsed from the rules file" % len(rules))
    rule_names = [n for n, _ in rules]
    doc_names = [n for n, _ in doc]
    for name in rule_names:
        if name not in doc_names:
            problems.append("alert %s of the rules file is not in the alert table of docs/operations.md" % name)
    for name in doc_names:
        if name not in rule_names:
            problems.append("docs/operations.md lists alert %s, which the rules file does not have" % name)
    severity = dict(rules)
    for name, sev in doc:
        if name in severity and severity[name] != sev:
            problems.append("docs/operations.md: %s has severity %s, the rules file %s"
                            % (name, sev, severity[name]))
    if not problems and rule_names != doc_names:
        problems.append("The alert table of docs/operations.md is not in the rules file's order: %s, expected %s"
                        % (doc_names, rule_names))
    return md_tables.finish(problems, "docs/operations.md lists the %d alerts of the rules file"
                            % len(rules))


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    sys.exit(main())
