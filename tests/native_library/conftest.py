"""Shared fixtures of the libaotriton_rocm (native/) tests.

``native_build``: the CMake build directory of native/, configured and built
once per session into a temporary directory. Environment:

- ``AOTR_NATIVE_BUILD_DIR``: reuse this build directory (it is brought up to
  date with ``cmake --build``; configured first if it has no CMakeCache.txt).
- ``AOTR_NATIVE_CMAKE_ARGS``: extra configure arguments, e.g.
  ``-DAOTR_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug``.

``torch_ext``: libaotriton_rocm_torch.so (native/torch/) built in that
directory against the installed torch's headers (cmake -DAOTR_BUILD_TORCH=ON);
skipped without torch >= 2.10 or a C++ compiler.

``native_env``: the environment for subprocesses that load the library into
a Python interpreter (ctypes): with a sanitizer build it preloads the ASan
runtime.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Dict

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE_SRC = ROOT / "native"


def _c_compiler() -> str:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return ""


def _run(cmd, what: str) -> None:
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        pytest.fail(f"{what} failed ({shlex.join(map(str, cmd))}):\n{r.stdout[-6000:]}", pytrace=False)


@pytest.fixture(scope="session")
def native_build(tmp_path_factory) -> Path:
    if shutil.which("cmake") is None:
        pytest.skip("native tests need cmake on PATH (apt install cmake / pip install cmake)")
    if not _c_compiler():
        pytest.skip("native tests need a C compiler (cc, gcc or clang; or set CC)")
    reuse = os.environ.get("AOTR_NATIVE_BUILD_DIR")
    build = Path(reuse) if reuse else tmp_path_factory.mktemp("native-build")
    if not (build / "CMakeCache.txt").exists():
        args = shlex.split(os.environ.get("AOTR_NATIVE_CMAKE_ARGS", ""))
        _run(["cmake", "-S", NATIVE_SRC, "-B", build, *args], "configuring native/")
    _run(["cmake", "--build", build, "-j2"], "building native/")
    return build


def _sanitized(build: Path) -> bool:
    cache = build / "CMakeCache.txt"
    return cache.exists() and "AOTR_SANITIZE:BOOL=ON" in cache.read_text(errors="replace")


@pytest.fixture(scope="session")
def native_env(native_build) -> Dict[str, str]:
    env = dict(os.environ)
    if _sanitized(native_build):
        cc = _c_compiler()
        asan = subprocess.run([cc, "-print-file-name=libasan.so"], stdout=subprocess.PIPE,
                              text=True).stdout.strip()
        env["LD_PRELOAD"] = asan
        env["ASAN_OPTIONS"] = "detect_leaks=0"  # the interpreter's own allocations
    return env


def _torch_include() -> str:
    torch = pytest.importorskip("torch")
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 10):
        pytest.skip(f"the torch extension needs torch >= 2.10 (this is {torch.__version__})")
    from torch.utils.cpp_extension import include_paths
    for path in include_paths():
        if (Path(path) / "torch/csrc/stable/library.h").is_file():
            return path
    pytest.skip("torch's headers (torch/csrc/stable) are not installed")


@pytest.fixture(scope="session")
def torch_ext(native_build) -> Path:
    include = _torch_include()
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "g++", "clang++")):
        pytest.skip("the torch extension needs a C++ compiler")
    cache = (native_build / "CMakeCache.txt").read_text(errors="replace")
    if "AOTR_BUILD_TORCH:BOOL=ON" not in cache or f"TORCH_INCLUDE_DIR:PATH={include}" not in cache:
        _run(["cmake", "-S", NATIVE_SRC, "-B", native_build, "-DAOTR_BUILD_TORCH=ON",
              f"-DTORCH_INCLUDE_DIR={include}"], "configuring native/ with the torch extension")
        _run(["cmake", "--build", native_build, "-j2"], "building the torch extension")
    return native_build / "libaotriton_rocm_torch.so"


@pytest.fixture
def stub(native_build, monkeypatch):
    """The library under test with the stub driver (an sm_90 device with 132
    compute units that records launches instead of running them): (driver
    path, the driver's ctypes handle, reset)."""
    import ctypes

    from aotriton_rocm.core import native
    from aotriton_rocm._version import ABI_VERSION

    path = native_build / "tests" / "libaotr_stub_driver.so"
    monkeypatch.setenv(native.ENV_VAR, str(native_build / f"libaotriton_rocm.so.{ABI_VERSION}"))
    monkeypatch.setenv("AOTR_STUB_CUDA_ARCH", "9.0")
    monkeypatch.setenv("AOTR_STUB_COMPUTE_UNITS", "132")
    monkeypatch.setattr(native, "_lib", None)
    lib = ctypes.CDLL(str(path))
    lib.aotr_stub_reset()
    return path, lib
