#!/usr/bin/env python3
"""`pip install` of the straggler package into a virtualenv, as docs/python.md says.

A venv of this interpreter with --system-site-packages (for Debian's torch)
gets exactly `pip install --no-build-isolation --no-index <source>/python`,
which compiles the package with CMake. The build directory is then deleted,
and from a directory outside the source tree the venv's python must import
straggler and straggler.torch from the venv, load libstraggler from the
installed package (not from the build tree, nor the system), and report to a
real stragglerd through a Client.

The build directory is kept at one path under --workdir so that ccache
(CCACHE_DIR, passed on by CMake) hits from the second run on.

--nccl sets STRAGGLER_NCCL for pip (python/setup.py): python:pip_install_venv
builds with "off" (its module is the one a machine without CUDA gets, which
python:nccl_args_no_nccl checks), python:pip_install_nccl with "auto" and
--expect-nccl where the in-tree build found CUDA and NCCL: the module must
then report its NCCL backend compiled in.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Daemon, check, main  # noqa: E402

# Runs in the venv: prints SKIP-TORCH when the venv has no torch.
PROBE = r"""
import os, sys
venv = sys.argv[1]
import straggler
where = {"straggler": straggler.__file__, "_straggler": straggler._straggler.__file__}
with open("/proc/self/maps") as f:
    libs = sorted({l.split()[-1] for l in f if "libstraggler" in l})
print("loaded:", where, libs)
for name, path in where.items():
    assert path.startswith(venv + os.sep), "%s imported from %s, not from %s" % (name, path, venv)
assert libs and all(p.startswith(venv + os.sep) for p in libs), "libstraggler loaded from %s" % libs
c = straggler.Client(job_id="pip-install", rank=0, world_size=1, endpoint=sys.argv[2])
assert c.report(0, 0, 0.01), "report dropped"
assert c.flush(30.0), "flush did not complete: %r" % c.stats()
print(repr(c.stats()))
assert c.stats().acked == 1, repr(c.stats())
c.close()
try:
    import torch  # noqa: F401
except ImportError as e:
    print("SKIP-TORCH: %s" % e)
    sys.exit(0)
import straggler.torch
assert straggler.torch.__file__.startswith(venv + os.sep), straggler.torch.__file__
print("straggler.torch:", straggler.torch.__file__)
"""


def test(args):
    src = os.path.join(args.source, "python")
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    venv = os.path.join(args.workdir, "venv")
    build_dir = os.path.join(args.workdir, "build")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    env = dict(os.environ, STRAGGLER_BUILD_DIR=build_dir, PIP_DISABLE_PIP_VERSION_CHECK="1",
               STRAGGLER_NCCL=args.nccl)
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    res = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation",
                          "--no-index", src], cwd=args.workdir, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print("pip install: exit %d after %.0f s" % (res.returncode, time.monotonic() - started))
    check(res.returncode == 0, "pip install failed:\n%s" % res.stdout[-6000:])
    check(os.path.isdir(build_dir), "pip did not build in STRAGGLER_BUILD_DIR %s" % build_dir)
    shutil.rmtree(build_dir)  # the installed package must not need it

    with Daemon(args.stragglerd, args.workdir) as d:
        res = subprocess.run([py, "-c", PROBE, os.path.realpath(venv), d.address],
                             cwd=args.workdir, env=env, text=True, timeout=120,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    print(res.stdout)
    check(res.returncode == 0, "the installed package failed in the venv (exit %d)"
          % res.returncode)
    res = subprocess.run([py, "-c", "import straggler; print(straggler.backends())"],
                         cwd=args.workdir, env=env, text=True, timeout=60,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    backends = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else "?"
    print("STRAGGLER_NCCL=%s: backends %s" % (args.nccl, backends))
    if args.nccl == "off":
        check("'nccl'" not in backends, "STRAGGLER_NCCL=off built the NCCL backend: " + backends)
    if args.expect_nccl:
        check("'nccl'" in backends, "CUDA and NCCL are found here, but pip built no NCCL "
              "backend: " + backends)
    if "SKIP-TORCH" in res.stdout:
        print("SKIPPED: straggler works, but the venv has no torch for straggler.torch")
        sys.exit(77)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--source", required=True, help="the repository root")
    p.add_argument("--stragglerd", required=True)
    p.add_argument("--workdir", required=True, help="emptied first; holds the venv and build")
    p.add_argument("--nccl", default="auto", choices=["auto", "on", "off"],
                   help="STRAGGLER_NCCL for pip (python/setup.py)")
    p.add_argument("--expect-nccl", action="store_true",
                   help="fail unless the installed module has the NCCL backend")
    args = p.parse_args()
    main(lambda: test(args))
