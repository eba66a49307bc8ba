#!/usr/bin/env python3
"""Every Catch2 test case can be run by ctest (docs/development.md).

catch_discover_tests registers each TEST_CASE under its name; a name holding
';' becomes a CMake list, so ctest registers pieces of it that match no test
case, and "No tests ran" counts as passed: the test silently never runs. A
name starting with '-' is read by the test binary as an option. Each such
name is printed with its file and line; exit status 1 when there is one.
"""
import argparse
import os
import re
import sys

# The first string literal of a TEST_CASE / SCENARIO (adjacent literals joined).
CASE = re.compile(r'\b(?:TEST_CASE|SCENARIO|TEMPLATE_TEST_CASE)\s*\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source-dir", required=True)
    args = p.parse_args()
    bad = []
    count = 0
    for dirpath, _, names in os.walk(os.path.join(args.source_dir, "tests")):
        for n in names:
            if not n.endswith((".cc", ".cpp")):
                continue
            path = os.path.join(dirpath, n)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for m in CASE.finditer(text):
                name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
                count += 1
                line = text.count("\n", 0, m.start()) + 1
                rel = os.path.relpath(path, args.source_dir)
                if ";" in name:
                    bad.append("%s:%d: test name holds ';' (ctest would never run it): %s"
                               % (rel, line, name))
                if name.startswith("-"):
                    bad.append("%s:%d: test name starts with '-' (read as an option): %s"
                               % (rel, line, name))
    for b in bad:
        print(b)
    print("%d test case names read, %d refused" % (count, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
