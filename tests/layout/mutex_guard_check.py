#!/usr/bin/env python3
"""Every mutex member in production code has an annotated guard (issue 32), so
that clang's thread-safety pass (layout:thread_safety) can check its use.

Scans the production sources (function_length_check.PRODUCTION) with comments
and literals blanked, and looks at each class or struct member whose type is
a mutex:

  * a std::mutex, std::shared_mutex, std::recursive_mutex or std::timed_mutex
    member is refused: the analysis cannot see it (the project's locks are
    absl::Mutex, whose lock and scoped-lock types carry the capability
    attributes);
  * an absl::Mutex member must be named by at least one ABSL_GUARDED_BY,
    ABSL_PT_GUARDED_BY, ABSL_*_LOCKS_REQUIRED or ABSL_LOCKS_EXCLUDED (a lock
    of something outside the object, e.g. stdout) in its file (or its
    header, for a .cc): a lock that guards nothing the compiler knows of is
    checked for nothing.

A mutex that is a local variable is not a member and not looked at.

  mutex_guard_check.py --source-dir S
      status 0 when every member passes, else each one is named (file:line
      member) and the status is 1. There is no allowance: issue 32 converted
      every member, so any std:: mutex member fails.
  mutex_guard_check.py --source-dir S --file FIXTURE --must-fail N
      FIXTURE must hold exactly N refused members (status 0 when the check
      finds them all, 1 otherwise): proof that the check checks.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from function_length_check import blank, sources  # noqa: E402

STD_MUTEX = re.compile(r"\bstd::(?:mutex|shared_mutex|recursive_mutex|timed_mutex|"
                       r"recursive_timed_mutex|shared_timed_mutex)\s+(\w+)\s*[;{=]")
ABSL_MUTEX = re.compile(r"\babsl::Mutex\s+(\w+)\s*[;{=]")
CLASS_HEAD = re.compile(r"(?:^|[\s;}])(?:class|struct|union)\b[^;(]*$", re.S)


def class_ranges(code):
    """(start, end) offsets of the bodies of classes, structs and unions,
    nested ones included; what lies in one and in no function is a member."""
    ranges, stack = [], []
    stmt_start = 0
    for i, c in enumerate(code):
        if c == ";" and (not stack or stack[-1][0] != "func"):
            stmt_start = i + 1
        elif c == "{":
            head = code[stmt_start:i]
            in_func = any(k == "func" for k, _ in stack)
            if in_func:
                stack.append(("block", i))
            elif CLASS_HEAD.search(head) and "=" not in head:
                stack.append(("class", i))
            elif re.search(r"\)\s*(?:const|noexcept|override|final|->[^{]*)?\s*$", head) or \
                    re.search(r"\)\s*:\s*[\w:]+\s*[({]", head):
                stack.append(("func", i))
            else:
                stack.append(("other", i))
            stmt_start = i + 1
        elif c == "}":
            if stack:
                kind, start = stack.pop()
                if kind == "class":
                    ranges.append((start, i))
            stmt_start = i + 1
    return ranges


def in_member_scope(code, pos, ranges):
    """Whether `pos` is directly in a class body (not inside one of its
    member functions' bodies)."""
    inner = [r for r in ranges if r[0] < pos < r[1]]
    if not inner:
        return False
    start = max(r[0] for r in inner)
    depth = 0
    for c in code[start + 1:pos]:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
    return depth == 0


def guarded_names(texts):
    names = set()
    for t in texts:
        for m in re.finditer(r"ABSL_(?:PT_)?GUARDED_BY\(\s*([\w.>-]+)\s*\)|"
                             r"ABSL_(?:(?:EXCLUSIVE|SHARED)_LOCKS_REQUIRED|LOCKS_EXCLUDED)\(([^)]*)\)", t):
            for part in (m.group(1) or m.group(2) or "").split(","):
                names.add(re.split(r"[.>]", part.strip())[-1])
    return names


def check_file(path, root):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    code = blank(text)
    ranges = class_ranges(code)
    related = [text]
    if path.endswith(".cc"):
        header = path[:-3] + ".h"
        if os.path.isfile(header):
            with open(header, encoding="utf-8", errors="replace") as f:
                related.append(f.read())
    guarded = guarded_names(related)
    problems = []
    rel = os.path.relpath(path, root)
    for m in STD_MUTEX.finditer(code):
        if in_member_scope(code, m.start(), ranges):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{line} {m.group(1)}: a std:: mutex member; make it an "
                            "absl::Mutex with ABSL_GUARDED_BY on what it guards")
    for m in ABSL_MUTEX.finditer(code):
        if in_member_scope(code, m.start(), ranges) and m.group(1) not in guarded:
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{line} {m.group(1)}: an absl::Mutex member that no "
                            "ABSL_GUARDED_BY / ABSL_*_LOCKS_REQUIRED / ABSL_LOCKS_EXCLUDED names")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--file", help="check this file only")
    ap.add_argument("--must-fail", type=int, help="the number of members FILE must have refused")
    args = ap.parse_args()
    root = os.path.abspath(args.source_dir)
    files = [os.path.join(root, args.file)] if args.file else list(sources(root))
    problems = []
    for path in files:
        problems += check_file(path, root)
    for p in problems:
        print("mutex_guard:", p)
    if args.must_fail is not None:
        if len(problems) == args.must_fail:
            print(f"ok: {args.file} has {args.must_fail} unguarded mutex members, and the check "
                  "names each")
            return 0
        print(f"FAIL: {args.file} should have {args.must_fail} refused members, the check "
              f"found {len(problems)}")
        return 1
    if not problems:
        print(f"mutex_guard: every mutex member of {len(files)} production files is an "
              "absl::Mutex that guards annotated state")
        return 0
    print(f"mutex_guard: {len(problems)} unguarded mutex members: each must be an "
          "absl::Mutex that ABSL_GUARDED_BY (or a lock annotation) names")
    return 1


if __name__ == "__main__":
    sys.exit(main())
