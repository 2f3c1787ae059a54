"""Installs the warp_tdt package and, when it can find a built libwarptdt, ships it inside.

The library is taken from $WARP_TDT_LIBRARY, else from the repository's CMake build tree
(../build/libwarptdt.so). Without one the package installs anyway and looks for the library at
run time (WARP_TDT_LIBRARY, next to the package, the build tree, the system library path).
Metadata lives in pyproject.toml; this file only adds the copy step.
"""

import os
import shutil

from setuptools import setup
from setuptools.dist import Distribution
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ("libwarptdt.so", "libwarptdt.dylib", "warptdt.dll")


def find_library():
    env = os.environ.get("WARP_TDT_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise SystemExit("WARP_TDT_LIBRARY=%s does not name a file" % env)
        return env
    for name in NAMES:
        cand = os.path.join(HERE, os.pardir, "build", name)
        if os.path.isfile(cand):
            return cand
    return None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is None:
            print("warp_tdt: no built libwarptdt found (set WARP_TDT_LIBRARY or build ../build); "
                  "installing without it: it will be searched for at run time")
            return
        real = os.path.realpath(lib)  # copy the file a versioned symlink points to
        base = os.path.basename(lib)
        dest_name = NAMES[1] if ".dylib" in base else NAMES[2] if base.endswith(".dll") else NAMES[0]
        dest = os.path.join(self.build_lib, "warp_tdt", dest_name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(real, dest)
        print("warp_tdt: shipping %s as %s" % (real, dest))


class BinaryDistribution(Distribution):
    """With a native library inside, the package is platform-specific (platlib, tagged wheel)."""

    def has_ext_modules(self):
        return find_library() is not None


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
