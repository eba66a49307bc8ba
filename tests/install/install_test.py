#!/usr/bin/env python3
"""install:prefix_consumer - the build tree installed as an operator would
(`cmake --install BUILD --prefix DIR`, issue 34), then used from DIR only.

The installed stragglerd, straggler-agent and stragglerctl start with no
LD_LIBRARY_PATH (their run path finds libstraggler_proto in DIR's libdir); the
installed systemd units point ExecStart at DIR/bin; a small C++ project built
with find_package(straggler) against DIR reports a job to the installed daemon
and the installed stragglerctl lists that job.
"""

import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import TestFailure, Daemon, check, in_workdir, main, run  # noqa: E402

JOB = "install-consumer"


def clean_env():
    """The environment of an operator's shell: no LD_LIBRARY_PATH at all."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    return env


def step(cmd, what, timeout, env=None):
    res = run(cmd, timeout, env=env or clean_env())
    check(res.returncode == 0, "%s: %s exited %d\nstdout:\n%s\nstderr:\n%s"
          % (what, " ".join(cmd), res.returncode, res.stdout[-3000:], res.stderr[-3000:]))
    return res.stdout


def body(args, workdir):
    prefix = os.path.join(workdir, "prefix")
    step([args.cmake, "--install", args.build, "--prefix", prefix], "install", 300)
    bindir = os.path.join(prefix, "bin")

    # The three executables start from the prefix alone.
    out = step([os.path.join(bindir, "stragglerd"), "--version"], "installed stragglerd", 30)
    check(out.strip(), "stragglerd --version printed nothing")
    step([os.path.join(bindir, "straggler-agent"), "--help"], "installed straggler-agent", 30)
    step([os.path.join(bindir, "stragglerctl"), "--help"], "installed stragglerctl", 30)

    # The units run the prefix's binaries, not /usr/local's.
    for unit, exe in (("stragglerd.service", "stragglerd"),
                      ("straggler-agent.service", "straggler-agent")):
        with open(os.path.join(prefix, "lib", "systemd", "system", unit)) as f:
            text = f.read()
        check("ExecStart=%s " % os.path.join(bindir, exe) in text,
              "%s does not start %s: %s" % (unit, os.path.join(bindir, exe),
                                           [l for l in text.splitlines() if "ExecStart" in l]))

    # A trainer's project against the prefix.
    cbuild = os.path.join(workdir, "consumer-build")
    step([args.cmake, "-S", args.consumer, "-B", cbuild, "-DCMAKE_PREFIX_PATH=" + prefix],
         "configure the consumer", 120)
    step([args.cmake, "--build", cbuild], "build the consumer", 300)

    # ... reports to the installed daemon, and the installed CLI shows its job.
    ready = os.path.join(workdir, "ready")
    os.makedirs(ready)
    with Daemon(os.path.join(bindir, "stragglerd"), ready) as d:
        step([os.path.join(cbuild, "report_consumer"), d.address, JOB], "consumer", 60)
        out = step([os.path.join(bindir, "stragglerctl"), "--daemon", d.address, "jobs"],
                   "installed stragglerctl jobs", 30)
        check(JOB in out, "stragglerctl jobs does not list %s:\n%s" % (JOB, out))
        print(out)
        check(d.stop() == 0, "the installed stragglerd did not exit 0 on SIGTERM:\n%s"
              % d.log_tail())


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cmake", required=True)
    p.add_argument("--build", required=True, help="the configured and built tree to install")
    p.add_argument("--consumer", required=True, help="tests/install/consumer")
    p.add_argument("--keep", help="work in this directory and keep it")
    return p.parse_args()


if __name__ == "__main__":
    a = parse()
    main(lambda: in_workdir("straggler-install-", lambda w: body(a, w), a.keep))
