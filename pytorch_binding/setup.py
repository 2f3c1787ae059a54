"""Installs the warp_tdt package with the warp-tdt shared library inside it.

    pip install --no-build-isolation ./pytorch_binding

Where the shipped library comes from (the first that applies):

1. ``$WARP_TDT_LIBRARY``: a built libwarptdt.so, copied in as it is.
2. ``$CMAKE_ARGS`` is set: CMake configures this repository in a temporary folder with those
   options (as scikit-build projects read them, e.g. ``CMAKE_ARGS=-DTDT_CUDA=OFF``), and builds
   the library alone.
3. The repository's own CMake build tree, ``build/`` (configured there before): CMake brings
   its library up to date (``cmake --build build --target warptdt``), with the options it was
   configured with, and that library is shipped.
4. Otherwise as 2, with no extra options: the CUDA backend is built when nvcc is found.

The CMake runs configure with -DTDT_BUILD_TESTS=OFF -DTDT_BUILD_BENCHMARKS=OFF and build the
library target only, with CMAKE_BUILD_PARALLEL_LEVEL jobs (default: every core). A failed
CMake run fails the install, with CMake's output.

``WARP_TDT_NO_LIBRARY=1`` installs the Python package alone (a pure py3-none-any wheel); it
then loads a library found at run time (``$WARP_TDT_LIBRARY``, or the system's after
``cmake --install``). Without it no wheel is made without a library inside.

Metadata lives in pyproject.toml; this file only adds the library.
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB_NAME = {"darwin": "libwarptdt.dylib", "win32": "warptdt.dll"}.get(sys.platform, "libwarptdt.so")


def _flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "off", "no", "false")


NO_LIBRARY = _flag("WARP_TDT_NO_LIBRARY")


def _fail(msg):
    raise SystemExit("warp_tdt: " + msg)


def _run(cmd, **kw):
    print("warp_tdt: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, **kw)
    if r.returncode != 0:
        _fail("`%s` failed (exit status %d); see its output above. To install without building, "
              "point WARP_TDT_LIBRARY at a built libwarptdt.so." % (" ".join(cmd), r.returncode))


def _cmake():
    exe = shutil.which("cmake")
    if exe is None:
        _fail("building the library needs CMake, which is not on PATH (Debian: apt-get install "
              "cmake, or run scripts/install-deps.sh), or set WARP_TDT_LIBRARY to a built "
              "libwarptdt.so.")
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        _fail("the warp-tdt sources (CMakeLists.txt) are not in %s: install from a checkout of "
              "the repository (pip install ./pytorch_binding in its root), or set "
              "WARP_TDT_LIBRARY to a built libwarptdt.so." % REPO)
    return exe


def _jobs():
    level = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "")
    return level if level.isdigit() and int(level) > 0 else str(os.cpu_count() or 1)


def _cmake_build(build_dir):
    _run([_cmake(), "--build", build_dir, "--target", "warptdt", "--parallel", _jobs()])
    lib = os.path.join(build_dir, LIB_NAME)
    if not os.path.isfile(lib):
        _fail("CMake built the warptdt target but %s is not there" % lib)
    return lib


def _cmake_fresh(tmp):
    extra = shlex.split(os.environ.get("CMAKE_ARGS", ""))
    _run([_cmake(), "-S", REPO, "-B", tmp, "-DCMAKE_BUILD_TYPE=Release", "-DTDT_BUILD_TESTS=OFF",
          "-DTDT_BUILD_BENCHMARKS=OFF"] + extra)
    return _cmake_build(tmp)


def _library(tmp):
    """The library to ship (building it if need be), and where it came from."""
    env = os.environ.get("WARP_TDT_LIBRARY")
    if env:
        if not os.path.isfile(env):
            _fail("WARP_TDT_LIBRARY=%s does not name a file" % env)
        return env, "WARP_TDT_LIBRARY"
    tree = os.path.join(REPO, "build")
    if "CMAKE_ARGS" not in os.environ and os.path.isfile(os.path.join(tree, "CMakeCache.txt")):
        return _cmake_build(tree), "the repository's build tree, brought up to date"
    return _cmake_fresh(tmp), "a CMake build with CMAKE_ARGS=%r" % os.environ.get("CMAKE_ARGS", "")


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        if NO_LIBRARY:
            print("warp_tdt: WARP_TDT_NO_LIBRARY is set: installing the Python package WITHOUT "
                  "the library; it must be found at run time (WARP_TDT_LIBRARY, or the system's "
                  "libwarptdt after cmake --install)", flush=True)
            return
        with tempfile.TemporaryDirectory(prefix="warp-tdt-cmake-") as tmp:
            lib, origin = _library(tmp)
            dest = os.path.join(self.build_lib, "warp_tdt", LIB_NAME)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.realpath(lib), dest)  # the file a versioned symlink names
        print("warp_tdt: shipping %s (from %s)" % (lib, origin), flush=True)


class BinaryDistribution(Distribution):
    """With the native library inside, the package is platform-specific (a platlib wheel)."""

    def has_ext_modules(self):
        return not NO_LIBRARY


cmdclass = {"build_py": BuildPyWithLibrary}

try:  # the library does not depend on the Python version: py3-none-<platform>
    from wheel.bdist_wheel import bdist_wheel

    class BdistWheel(bdist_wheel):
        def get_tag(self):
            python, abi, plat = super().get_tag()
            return (python, abi, plat) if self.root_is_pure else ("py3", "none", plat)

    cmdclass["bdist_wheel"] = BdistWheel
except ImportError:
    pass

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
