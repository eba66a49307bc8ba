#!/usr/bin/env python3
"""Nothing under tools/ links a target defined under bench/ (issue 32): the
installed tools are built from libraries, benchmarks are not one of them.

Reads the link table the configure step writes (cmake/StragglerLinkTable.cmake:
target TAB folder TAB links), follows each tools/ target's links through every
project library it reaches, and names the path to any target whose folder is
under bench/.

  tool_links_check.py --table build/link_table.txt
      status 0 when no tools/ target reaches bench/; otherwise each path is
      printed and the status is 1.
  tool_links_check.py --table FIXTURE --must-fail
      the table must break the rule (status 0 when it does, naming the path;
      1 when the check finds nothing in it): proof that the check checks.
"""
import argparse
import sys


def read_table(path):
    table = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise SystemExit(f"{path}:{n}: expected 'target<TAB>folder<TAB>links', "
                                 f"got {line!r}")
            target, folder, links = parts
            table[target] = (folder, [l for l in links.split(";") if l])
    return table


def under(folder, top):
    return folder == top or folder.startswith(top + "/")


def violations(table):
    """(tool target, [path of targets ending in a bench/ target]) for each hit."""
    out = []
    for tool in sorted(t for t, (folder, _) in table.items() if under(folder, "tools")):
        seen = {tool}
        stack = [[tool]]
        while stack:
            path = stack.pop()
            for dep in table[path[-1]][1]:
                if dep in seen or dep not in table:
                    continue
                seen.add(dep)
                if under(table[dep][0], "bench"):
                    out.append((tool, path + [dep]))
                else:
                    stack.append(path + [dep])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--table", required=True)
    ap.add_argument("--must-fail", action="store_true")
    args = ap.parse_args()
    table = read_table(args.table)
    tools = [t for t, (folder, _) in table.items() if under(folder, "tools")]
    if not tools:
        print(f"tool_links: no target under tools/ in {args.table}: nothing was checked")
        return 1
    found = violations(table)
    for tool, path in found:
        print(f"tool_links: {tool} ({table[tool][0]}) links {path[-1]}, defined in "
              f"{table[path[-1]][0]}: " + " -> ".join(path))
    if args.must_fail:
        if found:
            print(f"ok: {args.table} breaks the rule, and the check says so")
            return 0
        print(f"FAIL: {args.table} has a tools/ target linking bench/, but the check found none")
        return 1
    if not found:
        print(f"tool_links: {len(tools)} targets under tools/ of {len(table)}, none links a "
              "target defined under bench/")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
