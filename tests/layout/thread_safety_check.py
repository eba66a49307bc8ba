#!/usr/bin/env python3
"""clang's thread-safety analysis over every production translation unit
(issues 16 and 32, docs/development.md "Locks the compiler checks").

Every C++ source the build compiles (compile_commands.json of --build-dir)
under a production folder (agent/, client_lib/, common/, daemon/, engine/,
proto/, python/src/, quality/, tools/ - not tests/, bench/ or fuzz/, nor
generated code) is compiled with `clang++ -fsyntax-only -Wthread-safety
-Werror` and the include paths, definitions and language standard the build
gives it. No list is kept by hand: a new source is checked once the build
knows it. Only those flags are taken: the build's own warnings are
gcc's business, this pass checks the lock annotations (ABSL_GUARDED_BY,
ABSL_EXCLUSIVE_LOCKS_REQUIRED, scoped locks).

  thread_safety_check.py --source-dir S --build-dir B
      every production source passes, or each diagnostic is printed: status 1.
  thread_safety_check.py --source-dir S --build-dir B \\
      --must-fail FILE --flags-of SOURCE [--must-fail ...]
      every FILE must FAIL the pass, with thread-safety diagnostics only
      (a file that fails for another reason, or passes, fails the test):
      proof that the pass really checks.

Without clang++ (scripts/install-deps.sh installs clang-14) it prints why
and exits 77, which ctest reports as skipped.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

SKIP = 77
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from function_length_check import PRODUCTION  # noqa: E402
CHECK_FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror"]


def find_clang(explicit):
    names = [explicit] if explicit else ["clang++-14", "clang++"]
    for n in names:
        path = shutil.which(n) if n else None
        if path:
            return path
    return None


def production_sources(root, flags):
    """The production .cc files among the build's translation units, relative
    to `root`, sorted."""
    out = []
    for src in flags:
        rel = os.path.relpath(src, root)
        if rel.startswith("..") or not rel.endswith(".cc"):
            continue
        if any(rel == f or rel.startswith(f + "/") for f in PRODUCTION):
            out.append(rel)
    return sorted(out)


def build_flags(build_dir):
    """source path (real) -> the flags of its compile command that matter."""
    path = os.path.join(build_dir, "compile_commands.json")
    with open(path) as f:
        entries = json.load(f)
    flags = {}
    for e in entries:
        args = e.get("arguments") or shlex.split(e["command"])
        kept = []
        i = 1
        while i < len(args):
            a = args[i]
            if a in ("-I", "-isystem", "-D", "-include", "-iquote"):
                kept += [a, args[i + 1]]
                i += 2
                continue
            if re.match(r"^(-I|-isystem|-D|-iquote|-std=)", a) or a == "-pthread":
                kept.append(a)
            i += 1
        src = os.path.realpath(os.path.join(e.get("directory", ""), e["file"]))
        flags[src] = kept
    return flags


def run_clang(clang, source, flags, cwd):
    cmd = [clang] + CHECK_FLAGS + flags + [source]
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--clang", default=os.environ.get("STRAGGLER_CLANG_CXX"))
    ap.add_argument("--must-fail", action="append", default=[])
    ap.add_argument("--flags-of", help="a source of the build whose flags the "
                    "--must-fail files use")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    args = ap.parse_args()
    root = os.path.realpath(args.source_dir)

    clang = find_clang(args.clang)
    if clang is None:
        print("SKIPPED: clang++ not found (clang++-14 or clang++ on PATH, or "
              "STRAGGLER_CLANG_CXX); scripts/install-deps.sh installs clang-14, "
              "which CI has. The thread-safety annotations were NOT checked.")
        return SKIP
    flags = build_flags(args.build_dir)

    def flags_for(rel):
        src = os.path.realpath(os.path.join(root, rel))
        if src not in flags:
            raise SystemExit(f"{rel}: not in {args.build_dir}/compile_commands.json "
                             "(not a source of any target?)")
        return flags[src]

    if args.must_fail:
        if not args.flags_of:
            raise SystemExit("--must-fail needs --flags-of")
        base = flags_for(args.flags_of)
        bad = 0
        for rel in args.must_fail:
            rc, out = run_clang(clang, os.path.join(root, rel), base, root)
            errors = [l for l in out.splitlines() if ": error: " in l]
            foreign = [l for l in errors if "-Wthread-safety" not in l]
            if rc == 0:
                print(f"FAIL {rel}: passed the thread-safety check, but it touches "
                      "guarded state without its lock: the pass checks nothing")
                bad += 1
            elif not errors or foreign:
                print(f"FAIL {rel}: failed for a reason other than thread safety:\n{out}")
                bad += 1
            else:
                print(f"ok   {rel} fails as it must:")
                for l in errors:
                    print(f"       {l}")
        return 1 if bad else 0

    sources = production_sources(root, flags)
    if not sources:
        print(f"FAIL: no production source in {args.build_dir}/compile_commands.json")
        return 1
    jobs = {rel: flags_for(rel) for rel in sources}
    bad = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = {rel: pool.submit(run_clang, clang, os.path.join(root, rel), f, root)
                   for rel, f in jobs.items()}
        for rel in sources:
            rc, out = results[rel].result()
            if rc == 0:
                print(f"ok   {rel}")
            else:
                bad += 1
                print(f"FAIL {rel}:\n{out}")
    print(f"{len(sources) - bad}/{len(sources)} production sources pass "
          f"{' '.join(CHECK_FLAGS)} ({os.path.basename(clang)}; from "
          f"{args.build_dir}/compile_commands.json)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
