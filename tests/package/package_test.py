#!/usr/bin/env python3
"""The Debian packages of the build tree (scripts/package.sh, issue 34).

package:deb      builds the .debs with scripts/package.sh into OUT: exactly the
                 packages this build has parts for (--packages; the GPU ones only
                 in builds with CUDA/NCCL). Checks each one's control fields
                 (dpkg-deb -f: Package, Version, Section; Depends from
                 dpkg-shlibdeps, which must name the package of every library
                 its ELF files need - libnccl alone excepted, a Recommends;
                 conffiles, shlibs) and contents (dpkg-deb -c, no file in two
                 packages). Then, as root, installs them into a throwaway root
                 with `dpkg --root`: the non-GPU packages first, runs the daemon
                 from there and builds tests/consumer against the root (the
                 CMake config must load without the GPU packages), then the GPU
                 packages, and builds and runs the consumers of those
                 components. Without root it says it skipped that part.
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

DOC = "./usr/share/doc/%s/copyright"
CONTENTS = {
    "stragglerd": ["./usr/bin/stragglerd", "./usr/bin/straggler-agent", "./usr/bin/stragglerctl",
                   "./usr/lib/systemd/system/stragglerd.service",
                   "./usr/lib/systemd/system/straggler-agent.service",
                   "./usr/lib/sysusers.d/straggler.conf",
                   "./etc/stragglerd/stragglerd.yaml", "./etc/straggler/straggler-agent.yaml"],
    "libstraggler0": ["./usr/lib/libstraggler.so.0", "./usr/lib/libstraggler_proto.so.0",
                      "./usr/include/straggler/client.h", "./usr/include/straggler/straggler_c.h",
                      "./usr/lib/cmake/straggler/stragglerConfig.cmake",
                      "./usr/lib/cmake/straggler/stragglerTargets.cmake"],
    "libstraggler-collective0": ["./usr/lib/libstraggler_collective.so.0",
                                 "./usr/include/straggler/collective.h",
                                 "./usr/include/straggler/gloo_store.h",
                                 "./usr/lib/cmake/straggler/stragglerCollectiveTargets.cmake"],
    "libstraggler-cuda0": ["./usr/lib/libstraggler_cuda.so.0",
                           "./usr/include/straggler/cuda_timer.h",
                           "./usr/include/straggler/straggler_cuda_c.h",
                           "./usr/lib/cmake/straggler/stragglerCudaTargets.cmake"],
    "libstraggler-collective-nccl0": [
        "./usr/lib/libstraggler_collective_nccl.so.0",
        "./usr/include/straggler/collective_nccl.h",
        "./usr/lib/cmake/straggler/stragglerCollectiveNcclTargets.cmake"],
}
GPU_PACKAGES = ("libstraggler-cuda0", "libstraggler-collective-nccl0")
CONFFILES = ["/etc/stragglerd/stragglerd.yaml", "/etc/straggler/straggler-agent.yaml"]
# Needed, but no Debian package holds it (NVIDIA's tarball, apt repository or
# pip wheel): Depends cannot name it, Recommends names NVIDIA's package.
UNPACKAGED = {"libnccl.so.2": "libnccl2 (>= 2.27)"}


def out_of(cmd, what, timeout=120, env=None):
    res = run(cmd, timeout, env=env)
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


def names_package(relation, package):
    """Whether a Depends/Recommends value names `package` (alone or in an alternative)."""
    return re.search(r"(^|[,|]\s*)%s(:any)?(\s|,|$)" % re.escape(package), relation) is not None


def elf_files(tree):
    for top, _, files in os.walk(tree):
        for f in files:
            path = os.path.join(top, f)
            if os.path.islink(path):
                continue
            with open(path, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    yield path


def needed(path):
    out = out_of(["readelf", "-d", path], "readelf -d")
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


class SystemLibraries:
    """soname -> the installed Debian package holding it (ldconfig's x86-64 path, dpkg -S)."""

    def __init__(self):
        self.paths = {}
        for line in out_of(["ldconfig", "-p"], "ldconfig -p").splitlines()[1:]:
            m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
            if m and "x86-64" in m.group(2):
                self.paths.setdefault(m.group(1), m.group(3))
        self.cache = {}

    def owner(self, soname):
        if soname not in self.cache:
            self.cache[soname] = None
            path = self.paths.get(soname)
            if path:
                # usrmerge: dpkg may list /lib/... or /usr/lib/... for the same file.
                real = os.path.realpath(path)
                for p in (path, real, re.sub(r"^/usr/", "/", real), "/usr" + path):
                    res = run(["dpkg", "-S", p], 30)
                    if res.returncode == 0:
                        self.cache[soname] = res.stdout.split(":")[0].strip()
                        break
        return self.cache[soname]

    def names(self, package):
        """The package and what it Provides (a shlibs file may name either)."""
        provides = out_of(["dpkg-query", "-W", "-f=${Provides}", package], "dpkg-query")
        return [package] + [p.split()[0] for p in provides.split(",") if p.strip()]


def check_package(deb, package, version, tree, project_sonames, system):
    check(field(deb, "Package") == package, "%s: Package is %r" % (deb, field(deb, "Package")))
    check(field(deb, "Version") == version, "%s: Version %r, not the project's %s"
          % (deb, field(deb, "Version"), version))
    section = "net" if package == "stragglerd" else "libs"
    check(field(deb, "Section") == section, "%s: Section %r, not %s"
          % (package, field(deb, "Section"), section))
    depends, recommends = field(deb, "Depends"), field(deb, "Recommends")
    # Every library the package's ELF files need is the package's own, or its
    # package is in Depends: the project's of the same version (the hand
    # entries), the system's as dpkg-shlibdeps names them.
    own = set(f for _, _, files in os.walk(tree) for f in files)  # symlinks too: the sonames
    checked = set()
    for path in elf_files(tree):
        for soname in needed(path):
            if soname in own or soname in checked:
                continue
            checked.add(soname)
            rel = "%s: %s needs %s" % (package, os.path.relpath(path, tree), soname)
            if soname in project_sonames:
                want = "%s (= %s)" % (project_sonames[soname], version)
                check(want in depends, "%s, but Depends lacks %s: %s" % (rel, want, depends))
            elif soname in UNPACKAGED:
                check(UNPACKAGED[soname] in recommends, "%s, but Recommends lacks %s: %r"
                      % (rel, UNPACKAGED[soname], recommends))
            else:
                owner = system.owner(soname)
                check(owner, "%s, which no installed Debian package holds" % rel)
                check(any(names_package(depends, n) for n in system.names(owner)),
                      "%s (package %s), but Depends lacks it: %s" % (rel, owner, depends))
    print("%s %s: needs %s\n  Depends: %s%s" % (package, version, sorted(checked), depends,
                                                "\n  Recommends: " + recommends if recommends else ""))
    return depends, recommends


def contents(deb):
    """The package's non-directory paths, from dpkg-deb -c
    ("perms owner/group size date time path[ -> target]")."""
    files = set()
    for line in out_of(["dpkg-deb", "-c", deb], "dpkg-deb -c").splitlines():
        if not line.startswith("d"):
            files.add(line.split(None, 5)[5].split(" -> ")[0])
    return files


def dpkg_root_init(workdir):
    root = os.path.join(workdir, "root")
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"):
        os.makedirs(os.path.join(root, d))
    open(os.path.join(root, "var/lib/dpkg/status"), "w").close()
    return root


def dpkg_install(root, debs_):
    """dpkg --root into an empty dpkg database: the packages' own dependencies
    are this machine's libraries, not the root's, hence --force-depends."""
    out_of(["dpkg", "--root", root, "--force-depends", "--force-script-chrootless", "-i", *debs_],
           "dpkg --root -i", 300)


def consumer(args, root, cbuild, expect):
    """tests/consumer configured and built against the root's /usr only;
    `expect`: the components that must be found (the others must not be)."""
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    out_of(["cmake", "-S", args.consumer, "-B", cbuild,
            "-Dstraggler_DIR=" + os.path.join(root, "usr/lib/cmake/straggler"),
            "-DSTRAGGLER_EXPECT_CUDA=" + ("ON" if "cuda" in expect else "OFF"),
            "-DSTRAGGLER_EXPECT_COLLECTIVE=" + ("ON" if "collective" in expect else "OFF"),
            "-DSTRAGGLER_EXPECT_COLLECTIVE_NCCL=" + ("ON" if "collective_nccl" in expect
                                                     else "OFF")],
           "configure tests/consumer against the dpkg root", 120, env)
    out_of(["cmake", "--build", cbuild], "build tests/consumer", 600, env)
    for comp in ("cuda", "collective", "collective_nccl"):
        exe = os.path.join(cbuild, "consumer_" + comp)
        check(os.path.exists(exe) == (comp in expect), "%s %s with components %s installed"
              % (exe, "missing" if comp in expect else "built", sorted(expect)))
    for name in ["consumer"] + ["consumer_" + c for c in sorted(expect)]:
        run_env = dict(env)
        if name == "consumer_collective_nccl" and args.nccl_libdir:
            run_env["LD_LIBRARY_PATH"] = args.nccl_libdir  # libnccl: not ours, not Debian's
        print(out_of([os.path.join(cbuild, name)], "dpkg-root " + name, 60, run_env).strip())


def run_from_root(args, pkgs, workdir):
    root = dpkg_root_init(workdir)
    gpu = [p for p in GPU_PACKAGES if p in pkgs]
    first = [pkgs[p] for p in sorted(pkgs) if p not in gpu]
    dpkg_install(root, first)
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
    # find_package(straggler) with the non-GPU packages alone, then with all.
    expect = {"collective"} if "libstraggler-collective0" in pkgs else set()
    cbuild = os.path.join(workdir, "consumer")
    consumer(args, root, cbuild, expect)
    print("tests/consumer built against the root with %s" % sorted(os.path.basename(d) for d in first))
    # Asked for, the missing GPU component fails the configure, naming its package.
    res = run(["cmake", "-S", args.consumer, "-B", os.path.join(workdir, "consumer-cuda"),
               "-Dstraggler_DIR=" + os.path.join(root, "usr/lib/cmake/straggler"),
               "-DSTRAGGLER_EXPECT_CUDA=ON"], 120, env=env)
    check(res.returncode != 0 and "libstraggler-cuda0" in res.stdout + res.stderr,
          "find_package(straggler COMPONENTS cuda) without libstraggler-cuda0: exit %d\n%s"
          % (res.returncode, (res.stdout + res.stderr)[-2000:]))
    if gpu:
        dpkg_install(root, [pkgs[p] for p in gpu])
        expect |= {c for p, c in (("libstraggler-cuda0", "cuda"),
                                  ("libstraggler-collective-nccl0", "collective_nccl")) if p in gpu}
        consumer(args, root, cbuild, expect)
        print("tests/consumer built against the root with the GPU packages %s too" % gpu)


def test_deb(args):
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    env = dict(os.environ, BUILD_DIR=args.build)
    res = run(["bash", args.package_sh, args.out], 600, env=env)
    check(res.returncode == 0, "package.sh exited %d:\n%s\n%s"
          % (res.returncode, res.stdout[-3000:], res.stderr[-3000:]))
    pkgs = debs(args.out)
    check(sorted(pkgs) == sorted(args.packages), "packages built: %s, this build's: %s"
          % (sorted(pkgs), sorted(args.packages)))
    trees, owner_of = {}, {}
    for name, deb in pkgs.items():
        files = contents(deb)
        missing = [f for f in CONTENTS[name] + [DOC % name] if f not in files]
        check(not missing, "%s lacks %s (has %s)" % (name, missing, sorted(files)))
        for f in files:
            check(f not in owner_of, "%s is in both %s and %s" % (f, owner_of.get(f), name))
            owner_of[f] = name
        trees[name] = os.path.join(args.out, "tree", name)
        os.makedirs(trees[name])
        out_of(["dpkg-deb", "-x", deb, trees[name]], "dpkg-deb -x")
    project_sonames = {os.path.basename(f): p for f, p in owner_of.items()
                       if re.search(r"\.so\.\d+$", f)}
    system = SystemLibraries()
    fields = {name: check_package(deb, name, args.version, trees[name], project_sonames, system)
              for name, deb in pkgs.items()}
    # From dpkg-shlibdeps: the runtime packages of what the ELF files link.
    for name in ("stragglerd", "libstraggler0"):
        for pattern in (r"\blibgrpc\+\+[0-9.]+ \(>=", r"\blibprotobuf[0-9]+ \(>="):
            check(re.search(pattern, fields[name][0]), "%s: Depends lacks %s: %s"
                  % (name, pattern, fields[name][0]))
    if "libstraggler-collective0" in pkgs:
        check(re.search(r"\blibgloo0 \(>=", fields["libstraggler-collective0"][0]),
              "libstraggler-collective0: Depends lacks libgloo0")
    if "libstraggler-collective-nccl0" in pkgs:
        check("nccl" not in fields["libstraggler-collective-nccl0"][0],
              "libstraggler-collective-nccl0: Depends names NCCL, which Debian does not ship")
    conffiles = out_of(["dpkg-deb", "-I", pkgs["stragglerd"], "conffiles"], "conffiles").split()
    check(sorted(conffiles) == sorted(CONFFILES), "conffiles: %s" % conffiles)
    # The packaged units start the packaged binaries (/usr/bin, not /usr/local/bin).
    for unit, exe in (("stragglerd.service", "stragglerd"),
                      ("straggler-agent.service", "straggler-agent")):
        with open(os.path.join(trees["stragglerd"], "usr/lib/systemd/system", unit)) as f:
            starts = [l for l in f.read().splitlines() if l.startswith("ExecStart=")]
        check(len(starts) == 1 and starts[0].startswith("ExecStart=/usr/bin/%s " % exe),
              "packaged %s: %s" % (unit, starts))
    # Each library package: shlibs for its sonames, ldconfig by trigger.
    for soname, name in project_sonames.items():
        lib, ver = re.match(r"(.+)\.so\.(\d+)$", soname).groups()
        shlibs = out_of(["dpkg-deb", "-I", pkgs[name], "shlibs"], "shlibs")
        check("%s %s %s (= %s)" % (lib, ver, name, args.version) in shlibs,
              "%s shlibs lacks %s: %r" % (name, soname, shlibs))
        triggers = out_of(["dpkg-deb", "-I", pkgs[name], "triggers"], "triggers")
        check("activate-noawait ldconfig" in triggers, "%s triggers: %r" % (name, triggers))
    shutil.rmtree(os.path.join(args.out, "tree"))
    if os.geteuid() != 0:
        print("SKIPPED the dpkg --root install, daemon run and consumer build: needs root (uid %d)"
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
    pkgs = debs(args.out)
    check(sorted(pkgs) == sorted(args.packages), "debs in %s: %s, this build's: %s (package:deb "
          "builds them)" % (args.out, sorted(pkgs), sorted(args.packages)))
    res = run(["lintian", "--tag-display-limit", "0", *sorted(pkgs.values())], 600)
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
    p.add_argument("--packages", required=True, nargs="+",
                   help="the packages this build must produce, no more")
    p.add_argument("--consumer", required=True, help="tests/consumer, built against the root")
    p.add_argument("--nccl-libdir", default="", help="where libnccl.so.2 is, for the NCCL consumer")
    a = p.parse_args()
    main(lambda: test_deb(a) if a.which == "deb" else test_lintian(a))
