"""pip builds the wheel from a copy of the repository (running CMake itself, with
CMAKE_ARGS=-DTDT_CUDA=OFF to keep the build short), the wheel carries the library and an honest
platform tag, and, installed into a fresh virtual environment that sees Debian's torch, it
computes a known loss from another folder. Offline: no package index is used."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLATFORM = sysconfig.get_platform().replace("-", "_").replace(".", "_")  # linux_x86_64

# NeMo's fixed TDT case: B 1, T 3, one label 0, V 4 with blank 3, durations {0, 1, 2},
# sigma 0.05, every logit 0: cost 4.155739.
LOSS = ("import torch, warp_tdt; from warp_tdt import _lib; "
        "print(warp_tdt.library_path()); print(int(_lib.backend_built(_lib.LOCATION_GPU))); "
        "print(warp_tdt.tdt_loss(torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 3), "
        "torch.tensor([[0]]), torch.tensor([3]), torch.tensor([1]), 3, [0, 1, 2], sigma=0.05, "
        "reduction='sum').item())")


def _copy_repository(dest):
    """The repository as a fresh clone has it: no build trees, no caches."""
    skip = {".git", "third_party", "__pycache__", ".pytest_cache"}

    def ignore(folder, names):
        return [n for n in names if n in skip or n.startswith("build") or n.endswith(".egg-info")
                or n.endswith(".whl")]

    shutil.copytree(REPO, dest, ignore=ignore)


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("WARP_TDT_LIBRARY", "WARP_TDT_NO_LIBRARY", "PYTHONPATH", "CMAKE_ARGS")}
    env.update(extra)
    return env


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (" ".join(cmd), r.returncode, r.stdout,
                                                            r.stderr)
    return r.stdout


def _venv(path):
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], timeout=300)
    return str(path / "bin" / "python")


def test_pip_builds_the_library_into_the_wheel(tmp_path):
    src = tmp_path / "warp-tdt"
    _copy_repository(src)
    python = _venv(tmp_path / "venv")
    env = _env(CMAKE_ARGS="-DTDT_CUDA=OFF", CMAKE_BUILD_PARALLEL_LEVEL="2")
    wheels = tmp_path / "wheels"
    _run([python, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "--no-index",
          "-w", str(wheels), str(src / "pytorch_binding")], env=env, timeout=900)

    (whl,) = os.listdir(str(wheels))
    assert whl.endswith("-py3-none-%s.whl" % PLATFORM), whl
    with zipfile.ZipFile(str(wheels / whl)) as z:
        names = z.namelist()
    assert "warp_tdt/libwarptdt.so" in names, names

    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", str(wheels / whl)], env=env,
         timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path, gpu, loss = _run([python, "-c", LOSS], cwd=str(elsewhere), env=_env(),
                           timeout=300).split()
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                env=_env()).strip()
    assert path == os.path.join(site, "warp_tdt", "libwarptdt.so"), (path, site)
    assert gpu == "0", "CMAKE_ARGS=-DTDT_CUDA=OFF did not reach CMake: the library has CUDA"
    assert abs(float(loss) - 4.155739) < 1e-5, loss


def test_no_library_wheel_only_when_asked(tmp_path):
    src = tmp_path / "warp-tdt"
    _copy_repository(src)
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
          "-w", str(wheels), str(src / "pytorch_binding")], env=_env(WARP_TDT_NO_LIBRARY="1"),
         timeout=300)
    (whl,) = os.listdir(str(wheels))
    assert whl.endswith("-py3-none-any.whl"), whl
    with zipfile.ZipFile(str(wheels / whl)) as z:
        assert not [n for n in z.namelist() if "libwarptdt" in n], z.namelist()
