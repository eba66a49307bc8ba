#!/usr/bin/env python3
"""The source layout's rules (issue 16, docs/code-map.md), checked on the tree.

  * no file under agent/ or common/ includes a daemon header (a quoted
    include that resolves under daemon/src/);
  * no include cycle among the daemon's and common's sources: a header and
    its .cc count as one unit (convert.h + convert.cc), and a unit that
    includes a unit that includes it back, directly or through others, is a
    cycle;
  * with --agent BINARY: straggler-agent links no SQLite (ldd).

Exit status 0 when every rule holds; otherwise each violation is printed,
naming the files, and the status is 1.
"""
import argparse
import os
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root, folders):
    for folder in folders:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for n in names:
                if n.endswith((".h", ".cc")):
                    yield os.path.join(dirpath, n)


def resolve(root, including, name):
    """The file a quoted include names: beside the includer, then on the
    include paths of the daemon and common."""
    for base in (os.path.dirname(including), os.path.join(root, "daemon/src"),
                 os.path.join(root, "common/include")):
        path = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(path):
            return path
    return None


def includes(root, path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for name in INCLUDE.findall(text):
        target = resolve(root, path, name)
        if target is not None:
            yield name, target


def unit(root, path):
    rel = os.path.relpath(path, root)
    base = os.path.splitext(rel)[0]
    # common/include/straggler/common/x.h and common/src/x.cc are one unit.
    base = base.replace("common/include/straggler/common/", "common/src/")
    return base


def find_cycle(graph):
    WHITE, GREY, BLACK = 0, 1, 2
    color = {u: WHITE for u in graph}
    stack = []

    def visit(u):
        color[u] = GREY
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if color.get(v, WHITE) == GREY:
                return stack[stack.index(v):] + [v]
            if color.get(v, WHITE) == WHITE:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        color[u] = BLACK
        return None

    for u in sorted(graph):
        if color[u] == WHITE:
            found = visit(u)
            if found:
                return found
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--agent", help="the straggler-agent binary, for the SQLite check")
    args = ap.parse_args()
    root = os.path.abspath(args.source_dir)
    daemon_src = os.path.join(root, "daemon/src") + os.sep
    problems = []

    for path in sources(root, ["agent", "common"]):
        for name, target in includes(root, path):
            if target.startswith(daemon_src):
                problems.append(f"{os.path.relpath(path, root)} includes the daemon header "
                                f"\"{name}\" ({os.path.relpath(target, root)})")

    graph = {}
    for path in sources(root, ["daemon/src", "common"]):
        u = unit(root, path)
        graph.setdefault(u, set())
        for _, target in includes(root, path):
            v = unit(root, target)
            if v != u and (target.startswith(daemon_src) or "/common/" in target):
                graph[u].add(v)
    cycle = find_cycle(graph)
    if cycle:
        problems.append("include cycle: " + " -> ".join(cycle))

    if args.agent:
        out = subprocess.run(["ldd", args.agent], capture_output=True, text=True, check=True).stdout
        if "sqlite" in out.lower():
            problems.append(f"{args.agent} links SQLite:\n{out}")
        if not out.strip():
            problems.append(f"ldd printed nothing for {args.agent}")

    for p in problems:
        print("layout:", p)
    if not problems:
        print(f"layout: {len(graph)} units of daemon/src and common/, no cycle; agent/ and "
              f"common/ include no daemon header" + ("; the agent links no SQLite" if args.agent else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
