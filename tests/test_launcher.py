"""The driver layer and the kernel launcher, on CPU.

The native launcher is compiled from the current _launch.c (setuptools, into a
temporary folder) and exercised through real C function pointers: ctypes
callbacks with the cuLaunchKernel prototype that decode kernelParams. The
CUDA and HIP drivers run against fake driver libraries made of ctypes
callbacks, so their prototypes, out-parameters, context and device handling
run for real; only the GPU is missing.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
import warnings
from ctypes import POINTER, c_char_p, c_int, c_uint, c_void_p
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
try:
    import aotriton_rocm.driver  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))

from aotriton_rocm import driver as drv  # noqa: E402
from aotriton_rocm.driver import DriverError, Kernel, launcher  # noqa: E402
from aotriton_rocm.driver import cuda as cuda_mod  # noqa: E402
from aotriton_rocm.driver import hip as hip_mod  # noqa: E402

SOURCE = ROOT / "src" / "aotriton_rocm" / "driver" / "_launch.c"
_BUILT: list = []  # the path of the session's freshly built extension

LAUNCH_PROTO = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint,
                                c_uint, c_uint, c_void_p, POINTER(c_void_p), POINTER(c_void_p))

_READERS = {
    "p": ctypes.c_uint64, "z": ctypes.c_uint64, "?": ctypes.c_uint8, "b": ctypes.c_int8,
    "B": ctypes.c_uint8, "h": ctypes.c_int16, "H": ctypes.c_uint16, "i": ctypes.c_int32,
    "I": ctypes.c_uint32, "l": ctypes.c_int64, "L": ctypes.c_uint64, "f": ctypes.c_float,
    "d": ctypes.c_double,
}


def fp32(x: float) -> float:
    return struct.unpack("=f", struct.pack("=f", x))[0]


# -- the native extension, built from the current source --------------------------------------

def _declared_extension() -> dict:
    """The launcher's [[tool.setuptools.ext-modules]] entry of pyproject.toml."""
    import tomllib

    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (ext,) = [e for e in doc["tool"]["setuptools"]["ext-modules"]
              if e["name"] == "aotriton_rocm.driver._launch"]
    return ext


def _build_native(out: Path) -> Path:
    """Build _launch.c the way pyproject.toml declares it, into `out`."""
    from setuptools import Distribution, Extension

    decl = _declared_extension()
    ext = Extension("_launch", [str(ROOT / s) for s in decl["sources"]],
                    define_macros=[tuple(m) for m in decl.get("define-macros", [])],
                    extra_compile_args=decl.get("extra-compile-args", []),
                    extra_link_args=decl.get("extra-link-args", []),
                    py_limited_api=decl.get("py-limited-api", False))
    dist = Distribution({"name": "aotriton-launch-test", "ext_modules": [ext]})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(out / "lib")
    cmd.build_temp = str(out / "tmp")
    cmd.ensure_finalized()
    cmd.run()
    return Path(cmd.get_ext_fullpath("_launch"))


@pytest.fixture(scope="session")
def native(tmp_path_factory):
    try:
        path = _build_native(tmp_path_factory.mktemp("native"))
    except Exception as e:  # noqa: BLE001 - no compiler: fall back to the installed build
        if launcher.native_launch is None:
            pytest.skip(f"cannot build _launch.c ({e}) and no built extension is installed; "
                        "build it: python -c 'from setuptools import setup; setup()' "
                        "build_ext --inplace")
        return sys.modules["aotriton_rocm.driver._launch"]
    assert path.name.endswith(".abi3.so"), path
    _BUILT.append(path)
    spec = importlib.util.spec_from_file_location("_launch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["native", "ctypes"])
def launch(request, native):
    return native.launch if request.param == "native" else launcher.ctypes_launch


class Recorder:
    """A C function pointer with the cuLaunchKernel prototype that decodes
    kernelParams by `signature` while the call is on (the values live on the
    launcher's stack)."""

    def __init__(self, signature: bytes, rc: int = 0):
        self.signature = signature.decode()
        self.rc = rc
        self.calls = []
        self._cb = LAUNCH_PROTO(self._call)
        self.address = ctypes.cast(self._cb, c_void_p).value

    def _call(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values, addresses = [], []
        for i, code in enumerate(self.signature):
            addr = params[i]
            addresses.append(addr)
            values.append(_READERS[code].from_address(addr).value)
        self.calls.append(dict(function=f, grid=(gx, gy, gz), block=(bx, by, bz),
                               shared=shared, stream=stream, values=values,
                               addresses=addresses, params_null=not params,
                               extra_null=not extra))
        return self.rc


FN = 0xF00D_0000_1234
STREAM = 0x5EED_0000_0042


def call(launch, rec, args, *, grid=(3, 2, 1), block=(256, 1, 1), shared=49152,
         stream=STREAM, signature=None):
    sig = rec.signature.encode() if signature is None else signature
    return launch(rec.address, FN, *grid, *block, shared, stream, sig, tuple(args))


# -- packing ----------------------------------------------------------------------------------

def test_every_code_is_packed_exactly(launch):
    sig = b"ppp?bBhHiIIlLLfffddizz"
    args = [0x7F12_3456_7890, 2**64 - 1, None, True, -128, 255, -32768, 65535, -5, 0,
            2**32 - 1, -2**63, 2**64 - 1, 0, 0.1, -3.4e38, float("inf"), 0.1, -1e300,
            2**31 - 1]
    rec = Recorder(sig)
    assert call(launch, rec, args) == 0
    (c,) = rec.calls
    assert c["function"] == FN
    assert c["grid"] == (3, 2, 1) and c["block"] == (256, 1, 1)
    assert c["shared"] == 49152 and c["stream"] == STREAM
    assert c["extra_null"] and not c["params_null"]
    v = c["values"]
    assert v[:3] == [0x7F12_3456_7890, 2**64 - 1, 0]
    assert v[3:14] == [1, -128, 255, -32768, 65535, -5, 0, 2**32 - 1, -2**63, 2**64 - 1, 0]
    assert v[14] == fp32(0.1) and v[14] != 0.1  # rounded to fp32, not truncated bits
    assert v[15] == fp32(-3.4e38) and v[16] == math.inf
    assert v[17] == 0.1 and v[18] == -1e300
    assert v[19] == 2**31 - 1
    assert v[20:] == [0, 0]  # the two scratch pointers are NULL
    # one 8-byte-aligned slot per parameter
    assert all(a % 8 == 0 for a in c["addresses"])
    assert len(set(c["addresses"])) == len(sig)


def test_narrow_values_do_not_leak_into_their_slot(launch):
    rec = Recorder(b"LLLL")  # read back every slot as a whole 8 bytes
    call(launch, rec, [-1, 7, -1, 1.0], signature=b"iIbf")
    assert rec.calls[0]["values"] == [0xFFFF_FFFF, 7, 0xFF, 0x3F80_0000]


def test_reused_buffers_hold_no_stale_values(launch):
    rec = Recorder(b"LLLLL")
    call(launch, rec, [-1, -1, 2**62, -1.5e300, 2**63 - 1], signature=b"ilpdl")
    call(launch, rec, [3, 4, None, 0.5, 1], signature=b"iIpfh")
    assert rec.calls[1]["values"] == [3, 4, 0, 0x3F00_0000, 1]
    call(launch, rec, [-2, 5, 6, 0.25, 7], signature=b"bBpfl")
    assert rec.calls[2]["values"] == [0xFE, 5, 6, 0x3E80_0000, 7]


def test_int_like_and_float_like_values(launch):
    class Idx:
        def __index__(self):
            return 42

    rec = Recorder(b"ilpfd")
    call(launch, rec, [Idx(), False, Idx(), 3, 2**60])
    assert rec.calls[0]["values"] == [42, 0, 42, 3.0, float(2**60)]


def test_nan_passes_through(launch):
    rec = Recorder(b"fd")
    call(launch, rec, [math.nan, math.nan])
    assert all(math.isnan(x) for x in rec.calls[0]["values"])


def test_no_parameters(launch):
    rec = Recorder(b"")
    assert launch(rec.address, FN, 1, 1, 1, 32, 1, 1, 0, 0, b"", ()) == 0
    assert rec.calls[0]["values"] == [] and rec.calls[0]["stream"] is None


def test_driver_result_is_returned(launch):
    rec = Recorder(b"i", rc=719)
    assert call(launch, rec, [1]) == 719


def test_empty_grid_launches_nothing(launch):
    rec = Recorder(b"i")
    for grid in ((0, 1, 1), (5, 0, 1), (5, 1, 0)):
        assert call(launch, rec, [1], grid=grid) == 0
    assert rec.calls == []


def test_empty_grid_still_checks_arguments(launch):
    rec = Recorder(b"i")
    with pytest.raises(OverflowError):
        call(launch, rec, [2**31], grid=(0, 1, 1))


@pytest.mark.parametrize("code,value", [
    ("i", 2**31), ("i", -2**31 - 1), ("I", -1), ("I", 2**32), ("l", 2**63),
    ("l", -2**63 - 1), ("L", -1), ("L", 2**64), ("p", -1), ("p", 2**64), ("b", 128),
    ("B", -1), ("h", -32769), ("H", 65536), ("?", 2), ("f", 1e39), ("f", -3.5e38),
    ("f", 2**1024 - 2**970), ("d", 10**400),
])
def test_out_of_range_raises_overflow(launch, code, value):
    rec = Recorder(("i" + code + "i").encode())
    with pytest.raises(OverflowError, match=r"kernel argument 1 \("):
        call(launch, rec, [0, value, 0])
    assert rec.calls == []


@pytest.mark.parametrize("code,value", [
    ("i", 1.5), ("i", "3"), ("l", None), ("p", 1.0), ("p", b"x"), ("f", "1.0"), ("d", None),
    ("f", b"1"),
])
def test_wrong_type_raises_type_error(launch, code, value):
    rec = Recorder(code.encode())
    with pytest.raises(TypeError, match=r"kernel argument 0 \("):
        call(launch, rec, [value])


def test_wrong_argument_count(launch):
    rec = Recorder(b"iizz")
    with pytest.raises(TypeError, match=r"takes 2 arguments \(3 given\)"):
        call(launch, rec, [1, 2, 3])
    with pytest.raises(TypeError, match=r"takes 2 arguments \(1 given\)"):
        call(launch, rec, [1])
    assert rec.calls == []


def test_argument_limit(launch):
    n = launcher.MAX_ARGS
    rec = Recorder(b"i" * n)
    call(launch, rec, list(range(-n // 2, n - n // 2)))
    assert rec.calls[0]["values"] == list(range(-n // 2, n - n // 2))
    with pytest.raises(ValueError, match="at most"):
        launch(rec.address, FN, 1, 1, 1, 1, 1, 1, 0, 0, b"i" * (n + 1), tuple([0] * (n + 1)))


def test_bad_signature_and_containers(launch):
    rec = Recorder(b"i")
    with pytest.raises(ValueError, match="unknown kernel signature code b'x' at position 1"):
        call(launch, rec, [1, 2], signature=b"ix")
    with pytest.raises(TypeError, match="signature must be bytes"):
        call(launch, rec, [1], signature="i")
    with pytest.raises(TypeError, match="args must be a tuple"):
        launch(rec.address, FN, 1, 1, 1, 1, 1, 1, 0, 0, b"i", [1])


@pytest.mark.parametrize("pos,value,exc", [
    (0, 0, ValueError), (1, 0, ValueError), (0, -1, OverflowError), (2, 2**32, OverflowError),
    (3, -1, OverflowError), (5, 1.0, TypeError), (8, 2**32, OverflowError),
    (9, -1, OverflowError), (9, None, TypeError), (1, 2**64, OverflowError),
])
def test_launch_configuration_is_checked(launch, pos, value, exc):
    rec = Recorder(b"i")
    argv = [rec.address, FN, 1, 1, 1, 64, 1, 1, 0, 0, b"i", (1,)]
    argv[pos] = value
    with pytest.raises(exc):
        launch(*argv)
    assert rec.calls == []


def test_native_and_ctypes_agree_on_errors(native):
    rec = Recorder(b"ifp")
    cases = [[2**31, 1.0, 0], [0, 1e40, 0], [0, 1.0, -5], [0, "x", 0], [1.5, 1.0, 0]]
    for args in cases:
        outcomes = []
        for impl in (native.launch, launcher.ctypes_launch):
            try:
                call(impl, rec, args)
                outcomes.append(None)
            except Exception as e:  # noqa: BLE001
                outcomes.append((type(e), str(e)))
        assert outcomes[0] == outcomes[1], args


def test_native_module_constants(native):
    assert native.PROTOCOL == 1
    assert native.MAX_ARGS == launcher.MAX_ARGS
    assert set(native.CODES) == set(launcher._CODE_NAMES)
    assert native.launch(native.noop_launch_address(), 1, 1, 1, 1, 1, 1, 1, 0, 0, b"ip",
                         (1, 2)) == 0


def test_launch_from_many_threads(launch):
    rec = Recorder(b"l")
    errors = []

    def work(k):
        try:
            for j in range(200):
                assert call(launch, rec, [k * 1000 + j]) == 0
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seen = sorted(c["values"][0] for c in rec.calls)
    assert seen == sorted(k * 1000 + j for k in range(4) for j in range(200))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_source_compiles_cleanly_in_strict_mode(tmp_path):
    include = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Wconversion", "-Werror",
                    "-fPIC", "-DPy_LIMITED_API=0x03090000", f"-I{include}", "-c", str(SOURCE),
                    "-o", str(tmp_path / "x.o")], check=True)


def test_extension_needs_only_libc_and_the_stable_abi(native):
    """manylinux: DT_NEEDED is libc alone (auditwheel must see a libc), the glibc
    symbol versions are ancient, everything else comes from Python's stable ABI."""
    elftools = pytest.importorskip("elftools.elf.elffile")
    if not _BUILT:
        pytest.skip("extension not built in this session")
    import re

    with open(_BUILT[0], "rb") as f:
        elf = elftools.ELFFile(f)
        dyn = elf.get_section_by_name(".dynamic")
        needed = [t.needed for t in dyn.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
        versions = set()
        undefined = set()
        for sym in elf.get_section_by_name(".dynsym").iter_symbols():
            if sym["st_shndx"] == "SHN_UNDEF" and sym.name:
                undefined.add(sym.name)
        verneed = elf.get_section_by_name(".gnu.version_r")
        if verneed is not None:
            for _, auxes in verneed.iter_versions():
                versions.update(a.name for a in auxes)
    assert needed == ["libc.so.6"], needed
    glibc = [tuple(map(int, re.findall(r"\d+", v))) for v in versions if v.startswith("GLIBC_")]
    assert all(v <= (2, 17) for v in glibc), versions
    libc_syms = {n for n in undefined if not n.startswith(("Py", "_Py"))}
    assert libc_syms <= {"__cxa_finalize", "__gmon_start__", "_ITM_registerTMCloneTable",
                         "_ITM_deregisterTMCloneTable"}, libc_syms


# -- signatures -------------------------------------------------------------------------------

def test_signature_for_maps_triton_types():
    types = ["*fp16", "*fp32", "i32", "i64", "u32", "u64", "fp32", "fp64", "i1", "i8", "u8",
             "i16", "u16", "*i8", "*i8"]
    assert launcher.signature_for(types) == b"ppilILfd?bBhHzz"


@pytest.mark.parametrize("types,match", [
    (["*fp16"], "fewer than 2"),
    (["*fp16", "i32", "i32"], "trailing scratch pointer"),
    (["constexpr", "*i8", "*i8"], "constexpr"),
    (["fp16", "*i8", "*i8"], "does not support"),
    (["bf16", "*i8", "*i8"], "does not support"),
])
def test_signature_for_rejects(types, match):
    with pytest.raises(ValueError, match=match):
        launcher.signature_for(types)


def test_signature_for_limit():
    with pytest.raises(ValueError, match="at most"):
        launcher.signature_for(["i32"] * launcher.MAX_ARGS + ["*i8", "*i8"])


# -- Kernel, with a fake driver ---------------------------------------------------------------

class FakeDriver:
    backend = "cuda"

    def __init__(self, recorder, *, recover=False):
        self.launch_fn = recorder.address
        self.loads = []
        self.recover = recover
        self.recovered = []

    def load_function(self, device_index, image, symbol, shared, key):
        self.loads.append((device_index, image, symbol, shared, key))
        return 0x1000 + device_index

    def recover_launch(self, code, device_index):
        self.recovered.append((code, device_index))
        return self.recover

    def launch_error(self, code, *, device_index, what):
        return DriverError(f"failed {code} on {device_index}: {what}", code=code)


ARG_TYPES = ["*fp16", "*fp16", "i32", "i64", "fp32", "*i8", "*i8"]


def make_kernel(rec, impl, **kw):
    fake = FakeDriver(rec, **{k: kw.pop(k) for k in ("recover",) if k in kw})
    k = Kernel(kw.pop("backend", "cuda"), b"\x7fELF-cubin", "attn_fwd", 4, kw.pop("warp_size", 32),
               kw.pop("shared", 65536), kw.pop("arg_types", ARG_TYPES), driver=fake,
               launch_impl=impl, **kw)
    return k, fake


def test_kernel_launch_packs_and_appends_scratch(launch):
    rec = Recorder(b"ppilfzz")
    k, fake = make_kernel(rec, launch)
    assert k.signature == b"ppilfzz" and k.num_args == 5 and k.block == (128, 1, 1)
    k.launch((7, 4, 2), STREAM, 0, 0x1000, 0x2000, -3, 2**40, 0.5)
    k.launch([1], 0, 0, 0x1000, 0x2000, 1, 2, 0.25)
    k.launch(9, 0, 1, 0x1000, 0x2000, 1, 2, 0.25)
    assert [c["grid"] for c in rec.calls] == [(7, 4, 2), (1, 1, 1), (9, 1, 1)]
    c = rec.calls[0]
    assert c["function"] == 0x1000 and rec.calls[2]["function"] == 0x1001
    assert c["block"] == (128, 1, 1) and c["shared"] == 65536 and c["stream"] == STREAM
    assert c["values"] == [0x1000, 0x2000, -3, 2**40, 0.5, 0, 0]
    # loaded once per device, keyed by the code object's sha256
    import hashlib

    sha = hashlib.sha256(b"\x7fELF-cubin").hexdigest()
    assert fake.loads == [(0, b"\x7fELF-cubin", "attn_fwd", 65536, sha),
                          (1, b"\x7fELF-cubin", "attn_fwd", 65536, sha)]


def test_kernel_block_uses_warp_size():
    rec = Recorder(b"ppilfzz")
    k, _ = make_kernel(rec, launcher.ctypes_launch, backend="hip", warp_size=64)
    k.launch((1, 1, 1), 0, 0, 1, 2, 3, 4, 5.0)
    assert rec.calls[0]["block"] == (256, 1, 1)


def test_kernel_argument_errors(launch):
    rec = Recorder(b"ppilfzz")
    k, _ = make_kernel(rec, launch)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        k.launch((1, 1, 1), 0, 0, 1, 2, 3)
    with pytest.raises(OverflowError, match="kernel argument 2"):
        k.launch((1, 1, 1), 0, 0, 1, 2, 2**31, 4, 5.0)
    with pytest.raises(ValueError, match="grid"):
        k.launch((1, 1, 1, 1), 0, 0, 1, 2, 3, 4, 5.0)
    assert rec.calls == []


def test_kernel_launch_failure_raises_driver_error(launch):
    rec = Recorder(b"ppilfzz", rc=701)
    k, fake = make_kernel(rec, launch)
    with pytest.raises(DriverError, match="failed 701 on 0: attn_fwd grid=.2, 1, 1."):
        k.launch((2, 1, 1), 0, 0, 1, 2, 3, 4, 5.0)
    assert fake.recovered == [(701, 0)]


def test_kernel_launch_retried_after_recovery(launch):
    rec = Recorder(b"ppilfzz", rc=201)
    k, fake = make_kernel(rec, launch, recover=True)
    with pytest.raises(DriverError):  # still failing after the retry
        k.launch((2, 1, 1), 0, 0, 1, 2, 3, 4, 5.0)
    assert len(rec.calls) == 2
    rec.rc = 0
    k.launch((2, 1, 1), 0, 0, 1, 2, 3, 4, 5.0)


@pytest.mark.parametrize("kw,exc", [
    (dict(backend="opencl"), ValueError), (dict(warp_size=64), ValueError),
    (dict(backend="hip", warp_size=16), ValueError), (dict(shared=-1), ValueError),
    (dict(arg_types=["i32"]), ValueError),
])
def test_kernel_rejects_bad_launch_data(kw, exc):
    rec = Recorder(b"")
    with pytest.raises(exc):
        make_kernel(rec, launcher.ctypes_launch, **kw)
    with pytest.raises(ValueError):
        Kernel("cuda", b"x", "f", 64, 32, 0, ["*i8", "*i8"])  # 2048 threads
    with pytest.raises(ValueError):
        Kernel("cuda", b"", "f", 4, 32, 0, ["*i8", "*i8"])


def test_select_launch(monkeypatch):
    monkeypatch.setenv("AOTRITON_ROCM_LAUNCHER", "ctypes")
    assert launcher.select_launch() is launcher.ctypes_launch
    monkeypatch.setenv("AOTRITON_ROCM_LAUNCHER", "bogus")
    with pytest.raises(ValueError):
        launcher.select_launch()
    monkeypatch.delenv("AOTRITON_ROCM_LAUNCHER")
    monkeypatch.setattr(launcher, "native_launch", None)
    monkeypatch.setattr(launcher, "_warned_fallback", False)
    with pytest.warns(RuntimeWarning, match="ctypes fallback"):
        assert launcher.select_launch() is launcher.ctypes_launch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert launcher.select_launch() is launcher.ctypes_launch  # warned once only
    monkeypatch.setenv("AOTRITON_ROCM_LAUNCHER", "native")
    with pytest.raises(ImportError):
        launcher.select_launch()


def test_installed_extension_is_used_when_present():
    if launcher.native_launch is None:
        pytest.skip("the in-place extension is not built")
    assert launcher.select_launch() is launcher.native_launch


# -- drivers on a machine without one ---------------------------------------------------------

def _library_present(names):
    for n in names:
        try:
            ctypes.CDLL(n)
            return True
        except OSError:
            pass
    return False


@pytest.mark.skipif(_library_present(["libcuda.so.1"]), reason="a CUDA driver is installed")
def test_cuda_driver_missing_is_a_driver_error():
    drv._drivers.pop("cuda", None)
    with pytest.raises(DriverError, match="libcuda.so.1") as e:
        drv.get_driver("cuda")
    assert "NVIDIA GPU" in str(e.value) and e.value.backend == "cuda"
    # a Kernel can be built without a driver; its launch reports the same error
    k = Kernel("cuda", b"\x7fELF", "k", 4, 32, 0, ["i32", "*i8", "*i8"])
    with pytest.raises(DriverError, match="libcuda.so.1"):
        k.launch((1, 1, 1), 0, 0, 1)


@pytest.mark.skipif(_library_present(hip_mod.CANDIDATES), reason="a HIP runtime is installed")
def test_hip_runtime_missing_is_a_driver_error():
    drv._drivers.pop("hip", None)
    with pytest.raises(DriverError, match="libamdhip64.so.6") as e:
        drv.get_driver("rocm")
    assert "ROCm" in str(e.value) and e.value.backend == "hip"


def test_missing_library_message_is_forced(monkeypatch):
    monkeypatch.setattr(cuda_mod, "LIBRARY", "libcuda-missing-for-test.so.1")
    with pytest.raises(DriverError, match="libcuda-missing-for-test.so.1.*NVIDIA GPU"):
        cuda_mod.CudaDriver()
    monkeypatch.setattr(hip_mod, "CANDIDATES", ("libamdhip64-missing-for-test.so",))
    monkeypatch.setattr(hip_mod, "mapped_library", lambda prefix: None)
    with pytest.raises(DriverError, match="libamdhip64-missing-for-test.so.*ROCm"):
        hip_mod.HipDriver()


def test_unknown_backend():
    with pytest.raises(ValueError):
        drv.get_driver("metal")


def test_mapped_library_finds_loaded_objects():
    import _ctypes

    so = getattr(_ctypes, "__file__", None)
    if so and so.endswith(".so"):
        path = drv._base.mapped_library(Path(so).name.split(".")[0])
        assert path is not None and Path(path).samefile(so)
    assert drv._base.mapped_library("libdefinitely-not-loaded") is None


# -- the CUDA and HIP drivers against fake driver libraries -----------------------------------

class FakeLib:
    """Attributes are C function pointers (ctypes callbacks) standing in for
    a driver library's exports."""

    def __init__(self):
        self._keep = []

    def add(self, name, restype, argtypes, fn):
        proto = ctypes.CFUNCTYPE(restype, *argtypes)
        cb = proto(fn)
        self._keep.append(cb)
        # a separate function pointer object to the callback, like a CDLL attribute
        setattr(self, name, proto(ctypes.cast(cb, c_void_p).value))


_STRINGS = {}


def _cstr(s: bytes) -> int:
    buf = _STRINGS.setdefault(s, ctypes.create_string_buffer(s))
    return ctypes.addressof(buf)


class FakeCuda:
    NDEV = 2

    def __init__(self, launch_rec):
        self.tls = threading.local()
        self.calls = []
        self.modules = {}
        self.attributes = []
        lib = self.lib = FakeLib()
        P = POINTER
        lib.add("cuInit", c_int, [c_uint], lambda flags: 0)

        lib.add("cuGetErrorName", c_int, [c_int, P(c_void_p)],
                lambda code, out: self._write_str(out, b"CUDA_ERROR_%d" % code)
                if code in (0, 1, 209, 500, 201, 701) else 1)
        lib.add("cuGetErrorString", c_int, [c_int, P(c_void_p)],
                lambda code, out: self._write_str(out, b"description of %d" % code)
                if code in (0, 1, 209, 500, 201, 701) else 1)

        def device_get(out, ordinal):
            if not 0 <= ordinal < self.NDEV:
                return 101
            out[0] = ordinal
            return 0

        lib.add("cuDeviceGet", c_int, [P(c_int), c_int], device_get)

        def device_attr(out, attr, dev):
            self.calls.append(("cuDeviceGetAttribute", attr, dev))
            out[0] = 232448 if attr == 97 else 0
            return 0

        lib.add("cuDeviceGetAttribute", c_int, [P(c_int), c_int, c_int], device_attr)

        def retain(out, dev):
            self.calls.append(("cuDevicePrimaryCtxRetain", dev))
            out[0] = 0xC0000 + dev
            return 0

        lib.add("cuDevicePrimaryCtxRetain", c_int, [P(c_void_p), c_int], retain)

        def get_current(out):
            out[0] = self.current() or None
            return 0

        lib.add("cuCtxGetCurrent", c_int, [P(c_void_p)], get_current)

        def set_current(ctx):
            self.calls.append(("cuCtxSetCurrent", ctx))
            self.stack()[:] = [ctx] if ctx else []
            return 0

        lib.add("cuCtxSetCurrent", c_int, [c_void_p], set_current)

        def push(ctx):
            self.calls.append(("cuCtxPushCurrent_v2", ctx))
            self.stack().append(ctx)
            return 0

        lib.add("cuCtxPushCurrent_v2", c_int, [c_void_p], push)

        def pop(out):
            self.calls.append(("cuCtxPopCurrent_v2",))
            out[0] = self.stack().pop()
            return 0

        lib.add("cuCtxPopCurrent_v2", c_int, [P(c_void_p)], pop)

        def load(out, image):
            head = ctypes.string_at(image, 4)
            self.calls.append(("cuModuleLoadData", self.current(), head))
            if head != b"\x7fELF":
                return 200
            if self.current() == 0xC0000 + 1 and self.fail_device1:
                return 209
            handle = 0xA000 + len(self.modules)
            self.modules[handle] = self.current()
            out[0] = handle
            return 0

        self.fail_device1 = False
        lib.add("cuModuleLoadData", c_int, [P(c_void_p), c_void_p], load)
        lib.add("cuModuleUnload", c_int, [c_void_p],
                lambda m: self.calls.append(("cuModuleUnload", m)) or 0)

        def get_function(out, module, name):
            self.calls.append(("cuModuleGetFunction", module, name))
            if name != b"attn_fwd":
                return 500
            out[0] = module + 0x100
            return 0

        lib.add("cuModuleGetFunction", c_int, [P(c_void_p), c_void_p, c_char_p], get_function)

        def set_attr(fn, attr, value):
            self.attributes.append((fn, attr, value))
            return 1 if value > 232448 else 0

        lib.add("cuFuncSetAttribute", c_int, [c_void_p, c_int, c_int], set_attr)
        lib.cuLaunchKernel = LAUNCH_PROTO(launch_rec.address)

    @staticmethod
    def _write_str(out, s):
        out[0] = _cstr(s)
        return 0

    def stack(self):
        if not hasattr(self.tls, "stack"):
            self.tls.stack = []
        return self.tls.stack

    def current(self):
        s = self.stack()
        return s[-1] if s else 0


@pytest.fixture
def fake_cuda(monkeypatch):
    rec = Recorder(b"pilzz")
    fake = FakeCuda(rec)
    monkeypatch.setattr(cuda_mod, "open_library",
                        lambda names, **kw: (fake.lib, "fake-libcuda.so.1"))
    monkeypatch.setattr(cuda_mod, "mapped_library", lambda prefix: None)
    driver = cuda_mod.CudaDriver()
    return fake, driver, rec


def test_cuda_driver_loads_in_the_device_primary_context(fake_cuda, native):
    fake, driver, rec = fake_cuda
    assert driver.launch_fn == rec.address
    k = Kernel("cuda", b"\x7fELF cubin", "attn_fwd", 4, 32, 65536, ["*fp16", "i32", "i64",
                                                                   "*i8", "*i8"],
               driver=driver, launch_impl=native.launch)
    # no current context on this thread: the primary context is made current
    k.launch((1, 1, 1), 0, 0, 0x1234, -7, 2**40)
    assert ("cuCtxSetCurrent", 0xC0000) in fake.calls
    assert fake.current() == 0xC0000
    assert fake.modules == {0xA000: 0xC0000}
    assert fake.attributes == [(0xA100, 8, 65536)]  # shared > 48 KiB opt-in
    assert rec.calls[-1]["function"] == 0xA100
    assert rec.calls[-1]["values"] == [0x1234, -7, 2**40, 0, 0]
    # another device while device 0 is current: pushed, loaded, popped
    fake.calls.clear()
    k.launch((1, 1, 1), 0, 1, 0x1234, -7, 2**40)
    names = [c[0] for c in fake.calls]
    assert names.index("cuCtxPushCurrent_v2") < names.index("cuModuleLoadData") \
        < names.index("cuCtxPopCurrent_v2")
    assert fake.modules[0xA001] == 0xC0001 and fake.current() == 0xC0000
    assert rec.calls[-1]["function"] == 0xA101
    # cached: no more loads
    fake.calls.clear()
    k.launch((1, 1, 1), 0, 1, 0, 0, 0)
    k2 = Kernel("cuda", b"\x7fELF cubin", "attn_fwd", 4, 32, 65536, k.arg_types, driver=driver)
    k2.load(0)
    assert not any(c[0] == "cuModuleLoadData" for c in fake.calls)


def test_cuda_driver_small_shared_needs_no_attribute(fake_cuda):
    fake, driver, _ = fake_cuda
    driver.load_function(0, b"\x7fELF", "attn_fwd", 49152, "k1")
    assert fake.attributes == []


def test_cuda_driver_errors_name_the_call(fake_cuda):
    fake, driver, _ = fake_cuda
    with pytest.raises(DriverError) as e:
        driver.load_function(0, b"\x7fELF", "missing_symbol", 0, "k1")
    err = e.value
    assert (err.function, err.code, err.error_name) == ("cuModuleGetFunction", 500,
                                                       "CUDA_ERROR_500")
    assert "description of 500" in str(err) and "'missing_symbol'" in str(err)
    assert ("cuModuleUnload", 0xA000) in fake.calls  # no leaked module
    with pytest.raises(DriverError, match="allows at most 232448") as e:
        driver.load_function(0, b"\x7fELF", "attn_fwd", 300000, "k2")
    assert e.value.function == "cuFuncSetAttribute"
    fake.fail_device1 = True
    with pytest.raises(DriverError, match="another GPU architecture"):
        driver.load_function(1, b"\x7fELF", "attn_fwd", 0, "k3")
    with pytest.raises(DriverError, match="no such device index") as e:
        driver.load_function(5, b"\x7fELF", "attn_fwd", 0, "k4")
    assert e.value.function == "cuDeviceGet" and e.value.code == 101
    assert fake.current() == 0xC0000  # every failure left the thread as it was
    # an unknown code still gives a readable error
    err = driver.error("cuLaunchKernel", 12345)
    assert "CUDA_ERROR_UNRECOGNIZED (12345)" in str(err)


def test_cuda_launch_recovers_missing_context_on_a_new_thread(fake_cuda, native):
    fake, driver, rec = fake_cuda
    k = Kernel("cuda", b"\x7fELF", "attn_fwd", 4, 32, 0, ["*fp16", "i32", "i64", "*i8", "*i8"],
               driver=driver, launch_impl=native.launch)
    k.load(0)
    outcome = []

    def thread_body():
        # The fake cuLaunchKernel cannot see contexts; emulate the driver's
        # answer for a thread without one on the first try.
        rec.rc = 201
        orig = rec._call

        def once(*a):
            rec.rc = 201 if fake.current() == 0 else 0
            return orig(*a)

        rec._cb2 = LAUNCH_PROTO(once)
        driver.launch_fn = ctypes.cast(rec._cb2, c_void_p).value
        k._per_device.clear()
        try:
            k.launch((1, 1, 1), 0, 0, 1, 2, 3)
            outcome.append(fake.current())
        except Exception as e:  # noqa: BLE001
            outcome.append(e)

    t = threading.Thread(target=thread_body)
    t.start()
    t.join()
    assert outcome == [0xC0000]


class FakeHip:
    def __init__(self, launch_rec):
        self.device = 0
        self.calls = []
        self.modules = {}
        lib = self.lib = FakeLib()
        P = POINTER
        lib.add("hipInit", c_int, [c_uint], lambda flags: 0)
        lib.add("hipGetErrorName", c_void_p, [c_int], lambda code: _cstr(b"hipError%d" % code))
        lib.add("hipGetErrorString", c_void_p, [c_int], lambda code: _cstr(b"hip text %d" % code))

        def get_device(out):
            out[0] = self.device
            return 0

        lib.add("hipGetDevice", c_int, [P(c_int)], get_device)

        def set_device(d):
            self.calls.append(("hipSetDevice", d))
            if not 0 <= d < 2:
                return 101
            self.device = d
            return 0

        lib.add("hipSetDevice", c_int, [c_int], set_device)

        def load(out, image):
            self.calls.append(("hipModuleLoadData", self.device))
            if ctypes.string_at(image, 4) != b"\x7fELF":
                return 200
            handle = 0xB000 + len(self.modules)
            self.modules[handle] = self.device
            out[0] = handle
            return 0

        lib.add("hipModuleLoadData", c_int, [P(c_void_p), c_void_p], load)
        lib.add("hipModuleUnload", c_int, [c_void_p],
                lambda m: self.calls.append(("hipModuleUnload", m)) or 0)

        def get_function(out, module, name):
            if name != b"attn_fwd":
                return 500
            out[0] = module + 0x10
            return 0

        lib.add("hipModuleGetFunction", c_int, [P(c_void_p), c_void_p, c_char_p], get_function)
        lib.hipModuleLaunchKernel = LAUNCH_PROTO(launch_rec.address)


@pytest.fixture
def fake_hip(monkeypatch):
    rec = Recorder(b"pfdzz")
    fake = FakeHip(rec)
    opened = []

    def open_library(names, **kw):
        opened.append(list(names))
        return fake.lib, names[0]

    monkeypatch.setattr(hip_mod, "open_library", open_library)
    monkeypatch.setattr(hip_mod, "mapped_library",
                        lambda prefix: "/opt/torch/lib/libamdhip64.so" if prefix == "libamdhip64"
                        else None)
    driver = hip_mod.HipDriver()
    return fake, driver, rec, opened


def test_hip_driver_prefers_the_loaded_runtime(fake_hip):
    fake, driver, rec, opened = fake_hip
    assert opened == [["/opt/torch/lib/libamdhip64.so", "libamdhip64.so", "libamdhip64.so.7",
                       "libamdhip64.so.6"]]
    assert driver.library == "/opt/torch/lib/libamdhip64.so"


def test_hip_driver_loads_per_device_and_restores_the_device(fake_hip, native):
    fake, driver, rec, _ = fake_hip
    k = Kernel("hip", b"\x7fELF hsaco", "attn_fwd", 4, 64, 98304, ["*bf16", "fp32", "fp64",
                                                                   "*i8", "*i8"],
               driver=driver, launch_impl=native.launch)
    k.launch((2, 3, 4), 0xABC, 1, 0x10, 0.1, 0.1)
    assert fake.modules == {0xB000: 1}
    assert fake.device == 0
    assert [c for c in fake.calls if c[0] == "hipSetDevice"] == [("hipSetDevice", 1),
                                                                ("hipSetDevice", 0)]
    c = rec.calls[-1]
    assert c["function"] == 0xB010 and c["block"] == (256, 1, 1) and c["shared"] == 98304
    assert c["grid"] == (2, 3, 4) and c["stream"] == 0xABC
    assert c["values"] == [0x10, fp32(0.1), 0.1, 0, 0]
    fake.calls.clear()
    k.launch((1, 1, 1), 0, 0, 0, 0.0, 0.0)  # current device: no switching
    assert fake.calls == [("hipModuleLoadData", 0)]


def test_hip_driver_errors(fake_hip):
    fake, driver, _, _ = fake_hip
    with pytest.raises(DriverError, match=r"hipModuleLoadData failed with hipError200 \(200\): "
                                          r"hip text 200\. the code object is not a valid"):
        driver.load_function(1, b"junk", "attn_fwd", 0, "x")
    assert fake.device == 0
    with pytest.raises(DriverError, match="symbol 'nope'") as e:
        driver.load_function(0, b"\x7fELF", "nope", 0, "y")
    assert e.value.function == "hipModuleGetFunction" and e.value.code == 500
    assert ("hipModuleUnload", 0xB000) in fake.calls
    with pytest.raises(DriverError, match="no such device index"):
        driver.load_function(7, b"\x7fELF", "attn_fwd", 0, "z")
    err = driver.launch_error(98, device_index=0, what="k")
    assert "hipModuleLaunchKernel" in str(err) and "launching k on device 0" in str(err)
