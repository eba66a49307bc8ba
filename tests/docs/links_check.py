#!/usr/bin/env python3
"""README.md stays short and the docs' relative links lead somewhere.

    links_check.py --source-dir REPO_ROOT [--max-readme-lines 250]

Fails (exit 1, one line per problem) when README.md has more lines than the
limit, or when a relative Markdown link in README.md, BENCHMARKS.md or
docs/*.md points at a file or directory that does not exist, or at a
#heading that the target Markdown file does not have (GitHub's anchor rule:
lower case, punctuation other than '-' and '_' dropped, spaces to '-',
repeated headings numbered -1, -2, ...). Links inside code blocks and inline
code are not links. Absolute URLs (http:, https:, mailto:) are not checked.
A reference by section name to the README (README "Security") fails too: the
README no longer has such sections; name the docs page.
Python 3 standard library only.
"""

import argparse
import os
import re
import sys

import md_tables

# [text](target) and [text](target "title"); an image's ![alt](src) too.
LINK_RE = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE_RE = re.compile(r"^\s*(```|~~~)")


def strip_code(text, inline=True):
    """The text with fenced code blocks (and inline code spans) blanked out."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE_RE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`+[^`]*`+", "``", line) if inline else line)
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    h = re.sub(r"`", "", heading.strip().lower())
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)  # a link in a heading: its text
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path, cache):
    """Every anchor of a Markdown file."""
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            text = strip_code(f.read(), inline=False)
        seen, found = {}, set()
        for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else "%s-%d" % (base, n))
        cache[path] = found
    return cache[path]


def check_file(path, root, cache):
    problems = []
    with open(path, encoding="utf-8") as f:
        text = strip_code(f.read())
    rel = os.path.relpath(path, root)
    for lineno, line in enumerate(text.split("\n"), 1):
        for m in re.finditer(r'README,? \(?"[^"]+"', line):
            problems.append('%s:%d: %s: the README has no sections to refer to; link the docs page'
                            % (rel, lineno, m.group(0)))
        for m in LINK_RE.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                problems.append("%s:%d: link to %s: no such file" % (rel, lineno, target))
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest, cache):
                problems.append("%s:%d: link to %s: %s has no heading with anchor #%s"
                                % (rel, lineno, target, os.path.relpath(dest, root), anchor))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--max-readme-lines", type=int, default=250)
    args = ap.parse_args()
    root = os.path.abspath(args.source_dir)
    readme = os.path.join(root, "README.md")
    problems = []
    with open(readme, encoding="utf-8") as f:
        n = len(f.read().splitlines())
    if n > args.max_readme_lines:
        problems.append("README.md has %d lines, more than %d: move the text into docs/"
                        % (n, args.max_readme_lines))
    docs_dir = os.path.join(root, "docs")
    files = [readme, os.path.join(root, "BENCHMARKS.md")] + sorted(
        os.path.join(docs_dir, f) for f in os.listdir(docs_dir) if f.endswith(".md"))
    if len(files) < 4:
        problems.append("only %d Markdown files found under %s" % (len(files), root))
    cache = {}
    links = 0
    for path in files:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                links += len(LINK_RE.findall(strip_code(f.read())))
            problems += check_file(path, root, cache)
    return md_tables.finish(problems, "README.md has %d lines; %d relative links in %d files "
                            "lead somewhere" % (n, links, len(files)))


if __name__ == "__main__":
    sys.exit(main())
