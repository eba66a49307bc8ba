#!/usr/bin/env python3
"""The Debian packages of the build tree (scripts/package.sh, issue 34).

package:deb      builds the .debs with scripts/package.sh into OUT, checks their
                 control fields (dpkg-deb -f: Package, Version, Depends from
                 dpkg-shlibdeps naming the gRPC and protobuf runtime packages;
                 conffiles, shlibs) and contents (dpkg-deb -c), then installs
                 both into a throwaway root with `dpkg --root` and runs the
                 daemon from there with the packaged config. Only root can
                 do that last part: otherwise it says it skipped it.
package:lintian  lintian on the .debs package:deb left in OUT: no error (E:).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import Daemon, TestFailure, check, main, run  # noqa: E402

CONTENTS = {
    "stragglerd": ["./usr/bin/stragglerd", "./usr/bin/straggler-agent", "./usr/bin/stragglerctl",
                   "./usr/lib/systemd/system/stragglerd.service",
                   "./usr/lib/systemd/system/straggler-agent.service",
                   "./usr/lib/sysusers.d/straggler.conf",
                   "./etc/stragglerd/stragglerd.yaml", "./etc/straggler/straggler-agent.yaml",
                   "./usr/share/doc/stragglerd/copyright"],
    "libstraggler0": ["./usr/lib/libstraggler.so.0", "./usr/lib/libstraggler_proto.so.0",
                      "./usr/include/straggler/client.h", "./usr/include/straggler/straggler_c.h",
                      "./usr/lib/cmake/straggler/stragglerConfig.cmake",
                      "./usr/share/doc/libstraggler0/copyright"],
}
CONFFILES = ["/etc/stragglerd/stragglerd.yaml", "/etc/straggler/straggler-agent.yaml"]


def out_of(cmd, what, timeout=120):
    res = run(cmd, timeout)
    check(res.returncode == 0, "%s: %s exited %d\n%s\n%s" % (what, " ".join(cmd), res.returncode,
                                                            res.stdout[-3000:], res.stderr[-3000:]))
    return res.stdout


def debs(out):
    found = {}
    for name in os.listdir(out):
        m = re.match(r"([a-z0-9.+-]+)_([^_]+)_[a-z0-9]+\.deb$", name)
        if m:
            found[m.group(1)] = os.path.join(out, name)
    return found


def field(deb, name):
    return out_of(["dpkg-deb", "-f", deb, name], "dpkg-deb -f").strip()


def check_package(deb, package, version):
    check(field(deb, "Package") == package, "%s: Package is %r" % (deb, field(deb, "Package")))
    check(field(deb, "Version") == version, "%s: Version %r, not the project's %s"
          % (deb, field(deb, "Version"), version))
    depends = field(deb, "Depends")
    # From dpkg-shlibdeps: the runtime packages of what the ELF files link.
    for pattern in (r"\blibgrpc\+\+[0-9.]+ \(>=", r"\blibprotobuf[0-9]+ \(>="):
        check(re.search(pattern, depends), "%s: Depends lacks %s: %s" % (package, pattern, depends))
    # "perms owner/group size date time path[ -> target]"
    files = set(l.split(None, 5)[5].split(" -> ")[0]
                for l in out_of(["dpkg-deb", "-c", deb], "dpkg-deb -c").splitlines())
    missing = [f for f in CONTENTS[package] if f not in files]
    check(not missing, "%s lacks %s (has %s)" % (package, missing, sorted(files)))
    print("%s %s: Depends: %s" % (package, version, depends))
    return depends


def run_from_root(args, pkgs, workdir):
    """dpkg --root into an empty dpkg database: the packages' own dependencies
    are this machine's libraries, not the root's, hence --force-depends."""
    root = os.path.join(workdir, "root")
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"):
        os.makedirs(os.path.join(root, d))
    open(os.path.join(root, "var/lib/dpkg/status"), "w").close()
    out_of(["dpkg", "--root", root, "--force-depends", "--force-script-chrootless", "-i",
            pkgs["libstraggler0"], pkgs["stragglerd"]], "dpkg --root -i", 300)
    status = out_of(["dpkg", "--root", root, "-s", "stragglerd"], "dpkg -s")
    check("Status: install ok installed" in status, "stragglerd not installed:\n%s" % status)
    for c in CONFFILES:
        check(c in status, "dpkg does not list %s as a conffile:\n%s" % (c, status))
    daemon = os.path.join(root, "usr/bin/stragglerd")
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    res = run([daemon, "--version"], 30, env=env)
    check(res.returncode == 0, "packaged stragglerd --version: %d %s" % (res.returncode, res.stderr))
    with Daemon(daemon, workdir, extra_args=["--config",
                                             os.path.join(root, "etc/stragglerd/stragglerd.yaml")]) as d:
        out_of([os.path.join(root, "usr/bin/stragglerctl"), "--daemon", d.address, "jobs"],
               "packaged stragglerctl jobs")
        check(d.stop() == 0, "packaged stragglerd did not exit 0 on SIGTERM:\n%s" % d.log_tail())
    print("ran the daemon installed by dpkg --root %s (%s)" % (root, res.stdout.strip()))


def test_deb(args):
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    env = dict(os.environ, BUILD_DIR=args.build)
    res = run(["bash", args.package_sh, args.out], 600, env=env)
    check(res.returncode == 0, "package.sh exited %d:\n%s\n%s"
          % (res.returncode, res.stdout[-3000:], res.stderr[-3000:]))
    pkgs = debs(args.out)
    check(sorted(pkgs) == ["libstraggler0", "stragglerd"], "packages built: %s" % sorted(pkgs))
    check_package(pkgs["libstraggler0"], "libstraggler0", args.version)
    depends = check_package(pkgs["stragglerd"], "stragglerd", args.version)
    check("libstraggler0 (= %s)" % args.version in depends,
          "stragglerd does not depend on libstraggler0 of its version: %s" % depends)
    conffiles = out_of(["dpkg-deb", "-I", pkgs["stragglerd"], "conffiles"], "conffiles").split()
    check(sorted(conffiles) == sorted(CONFFILES), "conffiles: %s" % conffiles)
    # The packaged units start the packaged binaries (/usr/bin, not /usr/local/bin).
    tree = os.path.join(args.out, "stragglerd-tree")
    out_of(["dpkg-deb", "-x", pkgs["stragglerd"], tree], "dpkg-deb -x")
    for unit, exe in (("stragglerd.service", "stragglerd"),
                      ("straggler-agent.service", "straggler-agent")):
        with open(os.path.join(tree, "usr/lib/systemd/system", unit)) as f:
            starts = [l for l in f.read().splitlines() if l.startswith("ExecStart=")]
        check(len(starts) == 1 and starts[0].startswith("ExecStart=/usr/bin/%s " % exe),
              "packaged %s: %s" % (unit, starts))
    shutil.rmtree(tree)
    shlibs = out_of(["dpkg-deb", "-I", pkgs["libstraggler0"], "shlibs"], "shlibs")
    check("libstraggler 0 libstraggler0" in shlibs, "shlibs: %r" % shlibs)
    if os.geteuid() != 0:
        print("SKIPPED the dpkg --root install and daemon run: needs root (uid %d)"
              % os.geteuid())
        return
    workdir = os.path.join(args.out, "root-check")
    try:
        run_from_root(args, pkgs, workdir)
    except TestFailure:
        print("workdir kept: %s" % workdir, file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)


def test_lintian(args):
    if not shutil.which("lintian"):
        raise TestFailure("lintian not found: scripts/install-deps.sh installs it")
    pkgs = sorted(debs(args.out).values())
    check(pkgs, "no .deb in %s: package:deb builds them" % args.out)
    res = run(["lintian", "--tag-display-limit", "0", *pkgs], 600)
    print(res.stdout + res.stderr)
    errors = [l for l in res.stdout.splitlines() if l.startswith("E:")]
    check(not errors, "lintian errors:\n%s" % "\n".join(errors))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", choices=["deb", "lintian"])
    p.add_argument("--build", required=True)
    p.add_argument("--package-sh", required=True)
    p.add_argument("--out", required=True, help="where the .debs are written and read")
    p.add_argument("--version", required=True, help="the project's version")
    a = p.parse_args()
    main(lambda: test_deb(a) if a.which == "deb" else test_lintian(a))
