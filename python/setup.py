"""Builds the `straggler` package with the project's CMake (see pyproject.toml).

build_ext configures the repository one level up and builds only the
extension and what it links (libstraggler, its generated protobuf/gRPC code,
libstraggler_collective), then puts the CMake `python_wheel` component, the
module and those libraries found through $ORIGIN, into the package.

Environment:
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default: every core)
  STRAGGLER_BUILD_DIR         setuptools' build directory, the CMake tree under
                              it (default: python/build); kept for the next
                              install, which then rebuilds only what changed
  STRAGGLER_CMAKE_ARGS        more configure options, split on spaces
  STRAGGLER_NCCL              the NCCL backend (docs/python.md): "auto" (default)
                              builds it where the CUDA toolkit and NCCL >= 2.27
                              are found (the system's: beside CUDA, or under
                              NCCL_HOME), as the in-tree build does; "on" fails
                              the install when they are not; "off" leaves CUDA
                              and NCCL out
  CCACHE_DIR                  honoured: the project's CMake uses ccache if found
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

# CMake builds the whole repository's project, so this only works from a
# checkout (pip builds local directories in place), not from an sdist.
ROOT = Path(__file__).resolve().parent.parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(stragglerd VERSION ([0-9.]+)", text).group(1)


def nccl_args(mode):
    """CMake options for STRAGGLER_NCCL (see the header)."""
    mode = mode.strip().lower()
    if mode in ("", "auto"):
        return []
    if mode in ("on", "1", "yes"):
        return ["-DSTRAGGLER_REQUIRE_NCCL=ON"]
    if mode in ("off", "0", "no"):
        return ["-DSTRAGGLER_ENABLE_CUDA=OFF"]
    raise RuntimeError("STRAGGLER_NCCL=%r: expected auto, on or off" % mode)


class Build(build):
    def initialize_options(self):
        super().initialize_options()
        self.build_base = os.environ.get("STRAGGLER_BUILD_DIR") or self.build_base


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        tree = Path(self.build_temp).resolve() / "cmake"
        args = ["-S", str(ROOT), "-B", str(tree),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DSTRAGGLER_PYTHON_WHEEL=ON",
                "-DSTRAGGLER_BUILD_TESTS=OFF",
                # The interpreter running pip (a venv's), not Debian's default.
                "-DPython_EXECUTABLE=" + sys.executable]
        args += nccl_args(os.environ.get("STRAGGLER_NCCL", "auto"))
        try:  # the environment's pybind11 first; else CMake finds pybind11-dev
            import pybind11
            if Path(pybind11.get_cmake_dir()).is_dir():
                args.append("-Dpybind11_DIR=" + pybind11.get_cmake_dir())
        except ImportError:
            pass
        if not (tree / "CMakeCache.txt").exists() and shutil.which("ninja"):
            args += ["-G", "Ninja"]  # a generator can only be chosen on the first configure
        args += os.environ.get("STRAGGLER_CMAKE_ARGS", "").split()
        subprocess.run(["cmake", *args], check=True)

        jobs = [] if os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") else ["--parallel", str(os.cpu_count() or 1)]
        subprocess.run(["cmake", "--build", str(tree), "--target", "straggler_python", *jobs],
                       check=True)
        stage = tree / "wheel-stage"
        shutil.rmtree(stage, ignore_errors=True)
        subprocess.run(["cmake", "--install", str(tree), "--component", "python_wheel",
                        "--prefix", str(stage)], check=True)

        module = Path(self.get_ext_fullpath(ext.name))
        staged = stage / "straggler"
        if not (staged / module.name).is_file():
            raise RuntimeError("CMake built no %s in %s (found: %s)" % (
                module.name, staged, sorted(p.name for p in staged.iterdir())))
        module.parent.mkdir(parents=True, exist_ok=True)
        # A wheel cannot hold symlinks: keep one real file per name the loader
        # asks for (the soname, libstraggler.so.0), not the versioned file too.
        linked = {p.resolve() for p in staged.iterdir() if p.is_symlink()}
        for p in staged.iterdir():
            if p.is_symlink() or p.resolve() not in linked:
                shutil.copy(p, module.parent / p.name)


setup(
    version=project_version(),
    ext_modules=[Extension("straggler._straggler", sources=[])],
    cmdclass={"build": Build, "build_ext": CMakeBuild},
)
