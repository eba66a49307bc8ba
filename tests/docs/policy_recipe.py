#!/usr/bin/env python3
"""docs/detection.md's "Adding a policy" recipe against the tree.

    policy_recipe.py --source-dir REPO_ROOT [--max-files 6]

The recipe is a table of the files a new policy touches (issue 32: at most
six). This test checks that

  * the table names at most --max-files files, each of which exists; the new
    file's pattern (engine/src/reference_<name>.cc) exists for every kind;
  * every kind of the one table (STRAGGLER_POLICY_KIND rows of
    engine/include/straggler/engine/policy_table.inc) is where the recipe
    says: its reference file defines Make<Name>Reference, the .proto has
    POLICY_KIND_<NAME>, this page a "### `<name>`" section and BENCHMARKS.md
    its rows;
  * no other production C++ file keeps a list of the kinds: none names more
    than half of them (as PolicyKind::k<Name> or a "<name>" literal, comments
    left out). A second list would be a file the recipe does not name; a
    special case of one or two kinds is not a list (straggler-replay's
    default threshold for static, peer's first profile; Validate's rule for
    static).

Exit status 1 and one line per problem.
"""

import argparse
import os
import re
import sys

import md_tables

# The production folders of the layout checks (not tests/, bench/, fuzz/ or
# examples/, which may name kinds to exercise them).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "layout"))
from function_length_check import PRODUCTION  # noqa: E402

TABLE = "engine/include/straggler/engine/policy_table.inc"
NEW_FILE = "engine/src/reference_<name>.cc"
KIND = re.compile(r'^STRAGGLER_POLICY_KIND\((\w+), "(\w+)"\)', re.M)
COMMENT = re.compile(r"/\*.*?\*/|(^|\s)//[^\n]*", re.S)


def recipe_files(detection):
    """The files of the recipe's table: each backticked path of a row's
    first cell."""
    files = []
    for line in md_tables.section(detection, "### Adding a policy").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        files += [p for p in re.findall(r"`([^`]+)`", cells[0]) if "/" in p or p.endswith(".md")]
    return files


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--max-files", type=int, default=6)
    args = ap.parse_args()
    src = args.source_dir
    problems = []

    kinds = KIND.findall(read(os.path.join(src, TABLE)))
    if len(kinds) < 4:
        problems.append("%s: only %d STRAGGLER_POLICY_KIND rows read" % (TABLE, len(kinds)))

    detection = os.path.join(src, "docs", "detection.md")
    files = recipe_files(detection)
    if len(files) > args.max_files:
        problems.append("the recipe names %d files, more than %d: %s"
                        % (len(files), args.max_files, ", ".join(files)))
    for f in (TABLE, NEW_FILE, "proto/straggler/v1/straggler.proto", "BENCHMARKS.md"):
        if f not in files:
            problems.append("the recipe does not name %s" % f)
    for f in files:
        if f != NEW_FILE and not os.path.isfile(os.path.join(src, f)):
            problems.append("the recipe names %s, which does not exist" % f)

    proto = read(os.path.join(src, "proto/straggler/v1/straggler.proto"))
    docs = read(detection)
    bench = read(os.path.join(src, "BENCHMARKS.md"))
    for cls, name in kinds:
        ref = os.path.join(src, NEW_FILE.replace("<name>", name))
        if not os.path.isfile(ref):
            problems.append("kind %s: no %s" % (name, os.path.relpath(ref, src)))
        elif not re.search(r"\bMake%sReference\(" % cls, read(ref)):
            problems.append("kind %s: %s does not define Make%sReference"
                            % (name, os.path.relpath(ref, src), cls))
        if not re.search(r"\bPOLICY_KIND_%s\b" % name.upper(), proto):
            problems.append("kind %s: straggler.proto has no POLICY_KIND_%s" % (name, name.upper()))
        if "\n### `%s`\n" % name not in docs:
            problems.append("kind %s: docs/detection.md has no \"### `%s`\" section" % (name, name))
        if not re.search(r"^\| (\S+ \| )?%s \|" % re.escape(name), bench, re.M):
            problems.append("kind %s: BENCHMARKS.md has no row of it" % name)

    # One list: no production file but the table names more than half the kinds.
    patterns = {name: re.compile(r'PolicyKind::k%s\b|"%s"' % (cls, name)) for cls, name in kinds}
    scanned = 0
    for folder in PRODUCTION:
        for dirpath, _, names in os.walk(os.path.join(src, folder)):
            for n in names:
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, src)
                if not n.endswith((".h", ".cc", ".inc")) or rel == TABLE:
                    continue
                scanned += 1
                code = COMMENT.sub(" ", read(path))
                named = [name for name, p in patterns.items() if p.search(code)]
                if 2 * len(named) > len(kinds):
                    problems.append("%s names the kinds %s: a list of them besides %s"
                                    % (rel, ", ".join(named), TABLE))
    if scanned < 100:
        problems.append("only %d production sources scanned" % scanned)

    return md_tables.finish(problems, "the recipe names %d files; %d kinds where it says; no "
                            "second list of them in %d production sources"
                            % (len(files), len(kinds), scanned))


if __name__ == "__main__":
    sys.exit(main())
