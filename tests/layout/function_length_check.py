#!/usr/bin/env python3
"""No production function longer than --max-lines (issue 32): a long function
is split by concern, as the style guide asks.

Scans the C++ sources (.cc, .h) of the production folders - everything the
daemon, the agent, the client library and the tools are built from, not
tests/, bench/ or fuzz/ - with a brace matcher: comments, string and
character literals (raw strings too) and preprocessor lines are blanked, and
a `{` whose statement ends in a parameter list - `)`, optionally followed by
const, noexcept, override, a trailing return type or a constructor's
initializer list - opens a function body when it is not already inside one
(a lambda or block inside a function belongs to that function). A function's
length runs from the first line of its signature to its closing brace.

  function_length_check.py --source-dir S [--max-lines 150]
      status 0 when every function is within the bound, else each one over
      it is named (file:line name, lines) and the status is 1.
  function_length_check.py --source-dir S --file FIXTURE --must-fail
      FIXTURE must hold a function over the bound (status 0 when the check
      finds it, 1 when not): proof that the check measures.
"""
import argparse
import os
import re
import sys

PRODUCTION = ["agent", "client_lib", "common", "daemon", "engine", "proto", "python/src",
              "quality", "tools"]
CONTROL = re.compile(r"\b(if|for|while|switch|catch|return|sizeof|decltype|alignof|"
                     r"static_assert|noexcept|requires)\s*\($")
SIGNATURE_END = re.compile(
    r"\)\s*(?:const\b|noexcept\b(?:\s*\([^()]*\))?|override\b|final\b|mutable\b|&&?|"
    r"->\s*[\w:<>,\s*&\[\]]+|\s)*$", re.S)
INIT_LIST = re.compile(r"\)\s*(?:noexcept\s*)?:\s*[\w:]+\s*[({]", re.S)


def blank(text):
    """`text` with comments, literals and preprocessor lines replaced by
    spaces (newlines kept, so line numbers hold)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # A preprocessor line, with its continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        line_start = False
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and (i == 0 or not
                                                               (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            close = ")" + m.group(1) + '"'
            end = text.find(close, i + m.end())
            end = n if end < 0 else end + len(close)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c in "\"'":
            # A digit separator (1'000'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of each function body of `text`."""
    code = blank(text)
    found = []
    stack = []  # per open brace: "func", "block" (inside a function), "init", "scope"
    stmt_start = 0  # where the statement before the next brace begins
    line = 1
    func_start_line = {}
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
            continue
        in_func = any(k == "func" for k in stack)
        if c == ";" and not in_func and not (stack and stack[-1] == "init"):
            stmt_start = i + 1
        elif c == "{":
            if in_func:
                stack.append("block")
                continue
            stmt = code[stmt_start:i]
            flat = " ".join(stmt.split())
            if re.search(r"[\w>\]]$", flat) and INIT_LIST.search(flat + "{"):
                stack.append("init")  # a member's brace initializer in a constructor's list
                continue
            if re.match(r"(?:inline\s+)?namespace\b|extern\b", flat):
                stack.append("scope")
                stmt_start = i + 1
                continue
            if (SIGNATURE_END.search(flat) or INIT_LIST.search(flat)) and "(" in flat:
                head = flat[:flat.find("(")].rstrip()
                if not CONTROL.search(flat[:flat.find("(") + 1]) and not head.endswith("="):
                    name = head.split()[-1] if head.split() else "?"
                    first = line - stmt.rstrip().count("\n") + (len(stmt) - len(stmt.lstrip())
                                                                 and stmt[:len(stmt) - len(stmt.lstrip())].count("\n"))
                    stack.append("func")
                    func_start_line[len(stack)] = (name, first)
                    continue
            stack.append("scope")
            stmt_start = i + 1
        elif c == "}":
            if not stack:
                continue
            kind = stack.pop()
            if kind == "func":
                name, first = func_start_line.pop(len(stack) + 1)
                found.append((name, first, line))
                stmt_start = i + 1
            elif kind == "scope":
                stmt_start = i + 1
    return found


def sources(root):
    """Every production .cc and .h under root (the layout checks share it)."""
    for folder in PRODUCTION:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for n in sorted(names):
                if n.endswith((".cc", ".h")):
                    yield os.path.join(dirpath, n)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--max-lines", type=int, default=150)
    ap.add_argument("--file", help="check this file only")
    ap.add_argument("--must-fail", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.source_dir)
    files = [os.path.join(root, args.file)] if args.file else list(sources(root))
    over = []
    count = 0
    longest = (0, "")
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name, first, last in functions(text):
            count += 1
            lines = last - first + 1
            where = f"{os.path.relpath(path, root)}:{first} {name}"
            longest = max(longest, (lines, where))
            if lines > args.max_lines:
                over.append((lines, where))
    for lines, where in sorted(over, reverse=True):
        print(f"function_length: {where}: {lines} lines (at most {args.max_lines})")
    if args.must_fail:
        if over:
            print(f"ok: {args.file} has a function over {args.max_lines} lines, and the check says so")
            return 0
        print(f"FAIL: {args.file} has a function over {args.max_lines} lines, but the check "
              f"found none ({count} functions, longest {longest[0]} lines)")
        return 1
    if count == 0:
        print("function_length: no function found: nothing was checked")
        return 1
    if not over:
        print(f"function_length: {count} functions in {len(files)} files, the longest "
              f"{longest[0]} lines ({longest[1]}); at most {args.max_lines}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
