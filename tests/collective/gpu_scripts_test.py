#!/usr/bin/env python3
"""scripts/gpu-check.sh and scripts/gpu-bundle.sh on a machine without a GPU.

check (ctest gpu:check_without_gpu): gpu-check.sh on the build tree runs,
  skips every check with a reason, prints its summary line and exits 0; with
  --require-gpu the same run fails (exit 1) and its summary says nothing ran.
  Skipped (77) where nvidia-smi lists a GPU: there the script runs for real.

bundle (ctest gpu:bundle): gpu-bundle.sh packs the build into a folder of at
  most 64 MiB without libcuda, libnccl, libnvidia-ml or glibc; moved to a
  clean directory and run with LD_LIBRARY_PATH unset from another working
  directory, its binaries start (--help) and resolve every library but
  libnccl/libcuda from the bundle itself; build-python.sh builds the
  extension against the bundle (here: Debian's Python and pybind11) and the
  bundled package imports and reports its backends; the bundled
  gpu-check.sh runs on the bundle layout.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import check, main as harness_main  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CHECKS = 8


def has_gpu():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU " in out.stdout


def summary(output):
    lines = [l for l in output.splitlines() if l.startswith("gpu-check summary: ")]
    check(len(lines) == 1, "no single summary line in:\n" + output)
    return lines[0]


def run_check(script, root, *extra, env=None):
    return subprocess.run(["bash", script, "--root", root, *extra], capture_output=True, text=True,
                          timeout=600, env=env)


def expect_all_skipped(out, where):
    check(out.returncode == 0, "%s: gpu-check.sh exited %d:\n%s%s" % (where, out.returncode, out.stdout,
                                                                      out.stderr))
    line = summary(out.stdout)
    check("ok: 0 passed, 0 failed, %d skipped" % CHECKS in line, "%s: summary %r" % (where, line))
    skips = [l for l in out.stdout.splitlines() if " SKIP  " in l]
    check(len(skips) == CHECKS, "%s: %d SKIP lines, not %d:\n%s" % (where, len(skips), CHECKS, out.stdout))
    for l in skips:
        reason = l.split(" SKIP  ", 1)[1].strip()
        check(len(reason) > 10, "%s: a skip without a reason: %r" % (where, l))
    return line


def test_check(args):
    if has_gpu():
        print("SKIPPED: nvidia-smi lists a GPU here; gpu-check.sh runs its checks for real")
        sys.exit(77)
    script = os.path.join(REPO, "scripts", "gpu-check.sh")
    out = run_check(script, args.build_dir)
    line = expect_all_skipped(out, "build tree")
    print(out.stdout)
    strict = run_check(script, args.build_dir, "--require-gpu")
    check(strict.returncode == 1, "--require-gpu with nothing run exited %d, not 1" % strict.returncode)
    check("--require-gpu: nothing ran" in summary(strict.stdout), "summary %r" % summary(strict.stdout))
    bad = subprocess.run(["bash", script, "--bogus"], capture_output=True, text=True, timeout=60)
    check(bad.returncode == 2 and "--bogus" in bad.stderr, "an unknown argument: exit %d %r"
          % (bad.returncode, bad.stderr))
    print("without a GPU: " + line)


def ldd_missing(path, env):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, env=env, timeout=60)
    return [l.split()[0] for l in out.stdout.splitlines() if "not found" in l], out.stdout


def test_bundle(args):
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as work:
        staging = os.path.join(work, "staging")
        out = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu-bundle.sh"), "--build-dir",
                              args.build_dir, "--out", staging], capture_output=True, text=True,
                             timeout=900)
        check(out.returncode == 0, "gpu-bundle.sh exited %d:\n%s%s" % (out.returncode, out.stdout,
                                                                      out.stderr))
        print(out.stdout.strip())
        # Moved: nothing may point back at the build tree or the staging path.
        bundle = os.path.join(work, "moved", "bundle")
        os.makedirs(os.path.dirname(bundle))
        shutil.move(staging, bundle)
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(bundle) for f in fs)
        check(total <= 64 * 1024 * 1024, "the bundle is %d bytes, over 64 MiB" % total)
        libs = sorted(os.listdir(os.path.join(bundle, "lib")))
        for banned in ("libcuda.so", "libnccl.so", "libnvidia-ml.so", "libc.so", "ld-linux",
                       "libstdc++.so"):
            check(not any(l.startswith(banned) for l in libs), "the bundle carries %s: %r" % (banned, libs))
        for needed in ("libstraggler.so.0", "libgloo.so.0", "libstraggler_collective.so.0"):
            check(needed in libs, "the bundle lacks %s: %r" % (needed, libs))
        for f in ("include/straggler/collective.h", "include/gloo/rendezvous/store.h",
                  "python/src/reducers.cc", "python/straggler/torch.py", "scripts/gpu-check.sh",
                  "tests/integration/harness.py", "build-python.sh", "run-gpu-check.sh"):
            check(os.path.exists(os.path.join(bundle, f)), "the bundle lacks " + f)

        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        cwd = tempfile.mkdtemp(dir=work, prefix="elsewhere-")
        bins = sorted(os.listdir(os.path.join(bundle, "bin")))
        for name in bins:
            path = os.path.join(bundle, "bin", name)
            missing, text = ldd_missing(path, env)
            check(set(missing) <= {"libnccl.so.2", "libcuda.so.1"}, "%s: unresolved %r:\n%s" % (name, missing, text))
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[1] == "=>" and parts[0].startswith("libstraggler"):
                    check(parts[2].startswith(bundle), "%s loads %s from %s, not the bundle" % (name, parts[0], parts[2]))
        for name in ("stragglerd", "stragglerctl", "straggler-agent", "straggler-sim"):
            r = subprocess.run([os.path.join(bundle, "bin", name), "--help"], capture_output=True, text=True,
                               env=env, cwd=cwd, timeout=60)
            check(r.returncode == 0 and len(r.stdout) > 100,
                  "bundled %s --help exited %d: %s" % (name, r.returncode, r.stderr[-500:]))
        if "straggler-collective-driver" in bins:
            r = subprocess.run([os.path.join(bundle, "bin", "straggler-collective-driver"), "--gpu-count"],
                               capture_output=True, text=True, env=env, cwd=cwd, timeout=60)
            check(r.returncode == 0 and r.stdout.strip().isdigit(),
                  "bundled driver --gpu-count exited %d: %s %s" % (r.returncode, r.stdout, r.stderr))
            print("bundled driver: %s GPU(s); %s" % (r.stdout.strip(), r.stderr.strip().splitlines()[-1]))
        print("bundled binaries start from %s with LD_LIBRARY_PATH unset: %s" % (cwd, " ".join(bins)))

        # The GPU machine's step: build the extension against the bundle.
        b = subprocess.run(["bash", os.path.join(bundle, "build-python.sh")], capture_output=True, text=True,
                           env=dict(env, PYTHON=args.python), cwd=cwd, timeout=900)
        if b.returncode == 3:
            print("build-python.sh skipped here: " + b.stdout.strip())
        else:
            check(b.returncode == 0, "build-python.sh exited %d:\n%s%s" % (b.returncode, b.stdout, b.stderr[-3000:]))
            imp = subprocess.run([args.python, "-c", "import straggler; print(' '.join(straggler.backends()))"],
                                 capture_output=True, text=True, cwd=cwd, timeout=120,
                                 env=dict(env, PYTHONPATH=os.path.join(bundle, "python")))
            check(imp.returncode == 0, "the bundled package does not import:\n" + imp.stderr[-2000:])
            print("bundled package built here and imports; backends: " + imp.stdout.strip())
        if not has_gpu():
            c = run_check(os.path.join(bundle, "scripts", "gpu-check.sh"), bundle, env=env)
            check("gpu-check: bundle at " in c.stdout, "the bundled gpu-check.sh did not see a bundle:\n" + c.stdout)
            expect_all_skipped(c, "bundle")
            print("bundled gpu-check.sh: " + summary(c.stdout))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["check", "bundle"])
    p.add_argument("--build-dir", required=True)
    p.add_argument("--python", default=sys.executable, help="the interpreter the package is built for")
    args = p.parse_args()
    harness_main(lambda: (test_check if args.mode == "check" else test_bundle)(args))


if __name__ == "__main__":
    main()
