"""pip builds and installs the package offline (no build isolation), shipping the library given
by WARP_TDT_LIBRARY; an installed package without its library says how to get one; the example
script trains (a short run). tests/packaging/test_wheel.py has pip build the library itself."""

import ctypes.util
import glob
import os
import subprocess
import sys
import zipfile

import pytest

import warp_tdt
from warp_tdt import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _env(**extra):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def test_offline_wheel_ships_the_library_and_imports_from_anywhere(tmp_path):
    lib = warp_tdt.library_path()
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                        "--no-index", "-w", str(wheels), os.path.join(REPO, "pytorch_binding")],
                       env=_env(WARP_TDT_LIBRARY=lib), capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("pip is not available for %s" % sys.executable)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = glob.glob(str(wheels / "warp_tdt-*.whl"))
    assert "py3-none-any" not in whl  # it holds a native library: platform-tagged
    with zipfile.ZipFile(whl) as z:
        assert "warp_tdt/libwarptdt.so" in z.namelist() or "warp_tdt/libwarptdt.dylib" in z.namelist()
        z.extractall(tmp_path / "site")
    code = ("import warp_tdt, torch; p = warp_tdt.library_path(); print(p); "
            "l = warp_tdt.tdt_loss(torch.zeros(1,3,2,4), torch.zeros(1,3,2,3), torch.tensor([[0]]), "
            "[3], [1], 3, [0,1,2], sigma=0.05, reduction='sum'); print(round(l.item(), 5))")
    env = _env(PYTHONPATH=str(tmp_path / "site"))
    env.pop("WARP_TDT_LIBRARY", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    path, value = r.stdout.split()
    assert path.startswith(str(tmp_path / "site" / "warp_tdt"))
    assert value == "4.15574"


def test_missing_library_advice_for_an_installed_package(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    (site / "warp_tdt").mkdir(parents=True)
    monkeypatch.delenv("WARP_TDT_LIBRARY", raising=False)
    monkeypatch.setattr(_lib, "_PKG_DIR", str(site / "warp_tdt"))
    monkeypatch.setattr(_lib, "_REPO_ROOT", str(tmp_path))  # no CMakeLists.txt: not a checkout
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    _lib._reset_for_tests()
    try:
        with pytest.raises(_lib.LibraryNotFoundError) as e:
            _lib.load()
    finally:
        _lib._reset_for_tests()
    msg = str(e.value)
    assert str(site / "warp_tdt" / "libwarptdt.so") in msg, msg  # where it looked first
    assert "pip install --no-build-isolation --force-reinstall ./pytorch_binding" in msg, msg
    assert "WARP_TDT_LIBRARY=" in msg, msg
    assert "cmake -B build" not in msg, msg  # no build-tree advice outside a checkout


def test_example_trains(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "train_tiny_tdt.py"),
                        "--device", "cpu", "--steps", "60", "--log-every", "20"],
                       env=_env(), capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step")]
    assert len(losses) == 3 and losses[-1] < losses[0], r.stdout
