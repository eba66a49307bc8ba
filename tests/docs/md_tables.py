"""Reading the tables of the project's Markdown pages, for the tests that hold
docs/ to the code and the shipped files (tests/docs, tests/observability).
Python 3 standard library only."""

import os
import re
import sys


def section(path, heading):
    """The text under `heading` (a whole line, e.g. "## Alerts") up to the next
    heading of any level or the end of the file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^%s\n(.*?)(?=^#|\Z)" % re.escape(heading), text, re.M | re.S)
    if not m:
        raise SystemExit("%s has no '%s' section" % (os.path.relpath(path), heading))
    return m.group(1)


def rows(text, min_cells=3):
    """The cells of each table row whose first cell starts with a backtick
    (header and separator rows do not)."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= min_cells and cells[0].startswith("`"):
            yield cells


def finish(problems, passed):
    """Prints one line per problem and FAILED, or `passed`; the exit status."""
    for p in problems:
        print(p)
    if problems:
        print("FAILED: %d problem(s)" % len(problems), file=sys.stderr)
        return 1
    print("PASSED: " + passed)
    return 0
