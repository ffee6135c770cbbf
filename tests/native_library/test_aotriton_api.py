"""libaotriton_v2, our implementation of upstream AOTriton's C++ API
(native/aotriton_api/), on the CPU: for each API line (0.11: params versions
1/3; 0.13, also serving 0.12: 3/6; 0.14: 4/7, and 3/6 callers translated)

- the exported symbols are exactly the ones C++ consumers reference (the
  list below, derived from PyTorch's call sites), unversioned, with the full
  version as soname;
- every size and offset equals upstream's (measured from its headers);
- a program naming every API function links against it with no undefined
  reference;
- a consumer written the way PyTorch calls the API, built the way PyTorch's
  aotriton.cmake consumes a prefix (its include/ and lib/libaotriton_v2.so),
  runs on the stub driver (aotriton_api/stub_scenarios.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
API = HERE / "aotriton_api"
sys.path.insert(0, str(API))

from upstream_layout import UPSTREAM_LAYOUT_0_11, UPSTREAM_LAYOUT_0_13, UPSTREAM_LAYOUT_0_14  # noqa: E402

LINES = {"0.11": ("0.11.2", UPSTREAM_LAYOUT_0_11), "0.13": ("0.13.0", UPSTREAM_LAYOUT_0_13),
         "0.14": ("0.14.0", UPSTREAM_LAYOUT_0_14)}

# -- the symbols, demangled ---------------------------------------------------
T = {r: f"aotriton::TensorView<{r}>" for r in range(5)}
S = "aotriton::StreamTemplate<ihipStream_t*>"
F2, F3 = "aotriton::v2::flash::", "aotriton::v3::flash::"


def _sig(name, *args):
    return f"{name}({', '.join(args)})"


# PyTorch's call sites (aten/src/ATen/native/transformers/: hip/flash_attn/aot/
# mha_all_aot.hip, cuda/attention.cu, cuda/attention_backward.cu,
# cuda/sdp_utils.cpp), the v2 calls included: torch 2.9-2.12 name them in the
# `else` branches of `if constexpr (AOTRITON_ALWAYS_V3_API)`, which still
# leaves them undefined symbols of libtorch_hip.so (and the 0.12 headers of
# torch 2.13 still declare them).
# PyTorch main with AOTriton 0.14b (pytorch PR #197747) keeps the v3 calls,
# check_gpu, the debug draws and the arch queries; upstream's 0.13b and 0.14
# headers no longer declare the v2 attention functions, so no 0.14 build can
# name them.
PYTORCH_V3_CALL_SITES = {
    _sig(F2 + "check_gpu", S),
    _sig(F2 + "debug_simulate_encoded_softmax", T[4], "float", T[0], T[0], "unsigned long", S),
    _sig("aotriton::isArchExperimentallySupported", "ihipStream_t*"),
    _sig(F3 + "attn_fwd", F3 + "attn_fwd_params const&", "int", S, F3 + "attn_options const*"),
    _sig(F3 + "attn_bwd", F3 + "attn_bwd_params const&", "int", S, F3 + "attn_options const*"),
    _sig(F3 + "attn_fwd_params::attn_fwd_params"),
    _sig(F3 + "attn_bwd_params::attn_bwd_params"),
}
PYTORCH_CALL_SITES = PYTORCH_V3_CALL_SITES | {
    _sig(F2 + "attn_fwd", T[4], T[4], T[4], T[4], "float", T[2], T[4], "float", T[0], T[0], "long",
         T[0], T[0], T[4], "bool", T[0], S, F2 + "FwdExtraArguments*"),
    _sig(F2 + "attn_fwd_compact_varlen", T[4], T[4], T[4], T[4], T[1], T[1], "int", "int", "float",
         T[2], T[4], "float", T[0], T[0], "long", T[0], T[0], T[4], "bool", T[0], S,
         F2 + "FwdExtraArguments*"),
    _sig(F2 + "attn_bwd", T[4], T[4], T[4], T[4], "float", T[4], T[4], T[4], T[4], T[4], T[4], T[2],
         T[2], "float", T[0], T[0], "long", "bool", S, F2 + "BwdExtraArguments*"),
    _sig(F2 + "attn_bwd_fused", T[4], T[4], T[4], T[4], "float", T[4], T[4], T[4], T[4], T[4], T[4],
         T[2], "float", T[0], T[0], "long", "bool", S, F2 + "FusedBwdExtraArguments*"),
    _sig(F2 + "attn_bwd_compact_varlen", T[4], T[4], T[4], T[1], T[1], "int", "int", T[4], "float",
         T[4], T[4], T[4], T[4], T[4], T[4], T[2], T[2], "float", T[0], T[0], "long", "bool", S,
         F2 + "BwdExtraArguments*"),
}


def _tensor_view_members(r):
    """util.h declares TensorView<1..4> `extern template`: the library defines
    every member, which consumers built without inlining call."""
    tv, arr = T[r], f"std::array<unsigned long, {r}ul>"
    return {f"{tv}::TensorView()", f"{tv}::TensorView(long, {arr}, {arr}, aotriton::DType)",
            f"{tv}::get_null_tensor(aotriton::DType)"} | {
        f"{tv}::{m}() const" for m in ("data_ptr", "dtype", "kparam_data_ptr", "operator bool",
                                       "size_ptr", "sizes", "stride_ptr", "strides")} | {
        f"{tv}::{m}(int) const" for m in ("size", "stride", "kparam_stride")}


TENSOR_VIEWS = set().union(*(_tensor_view_members(r) for r in (1, 2, 3, 4)))
# util.h's device queries, which other C++ consumers of the API call (e.g.
# DJL's PyTorch engine: getGpuFromStream, getMultiProcessorCount).
UTIL_QUERIES = {_sig("aotriton::getGpuFromStream", "ihipStream_t*"),
                _sig("aotriton::getMultiProcessorCount", "ihipStream_t*")}
TECH_PREVIEW = {_sig("aotriton::isArchTechPreview", "ihipStream_t*")}
EXPECTED = {
    "0.11": PYTORCH_CALL_SITES | TENSOR_VIEWS | UTIL_QUERIES,
    "0.13": PYTORCH_CALL_SITES | TENSOR_VIEWS | UTIL_QUERIES | TECH_PREVIEW,
    "0.14": PYTORCH_V3_CALL_SITES | TENSOR_VIEWS | UTIL_QUERIES | TECH_PREVIEW,
}
# the headers of each line: v2/ up to 0.13, flash/backends.h from 0.14 on
HEADERS = ("config.h", "dtypes.h", "runtime.h", "util.h", "flash.h", "cpp_tune.h")
LINE_HEADERS = {"0.11": HEADERS + ("v2/flash.h",), "0.13": HEADERS + ("v2/flash.h",),
                "0.14": HEADERS + ("flash/backends.h",)}


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=900, **kw)
    if r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-8000:]}",
                    pytrace=False)
    return r.stdout


def _cxx():
    for c in ("c++", "g++", "clang++"):
        if shutil.which(c):
            return c
    pytest.skip("needs a C++ compiler")


@pytest.fixture(scope="module")
def installed(native_build, tmp_path_factory):
    for tool in ("nm", "c++filt", "readelf", "objdump"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool} (binutils)")
    prefix = tmp_path_factory.mktemp("native-install")
    _run(["cmake", "--install", native_build, "--prefix", prefix])
    return prefix


@pytest.fixture(scope="module", params=sorted(LINES))
def line(request):
    return request.param


@pytest.fixture(scope="module")
def prefix(installed, line, tmp_path_factory):
    """An AOTriton-style prefix (lib/libaotriton_v2.so*, include/aotriton/) of
    one line, assembled from the install tree as the prefix command will."""
    version = LINES[line][0]
    p = tmp_path_factory.mktemp(f"aotriton-prefix-{line}")
    (p / "lib").mkdir()
    name = f"libaotriton_v2.so.{version}"
    shutil.copy2(installed / "lib" / "aotriton_api" / line / name, p / "lib" / name)
    (p / "lib" / "libaotriton_v2.so").symlink_to(name)
    shutil.copytree(installed / "include" / "aotriton_api" / line, p / "include")
    return p


def _exports(lib: Path):
    """The mangled names of the defined dynamic symbols ("address type name")."""
    return [row.split()[2] for row in _run(["nm", "-D", "--defined-only", lib]).splitlines()
            if len(row.split()) == 3]


def test_install_layout(installed, line):
    version = LINES[line][0]
    libdir = installed / "lib" / "aotriton_api" / line
    assert (libdir / f"libaotriton_v2.so.{version}").is_file()
    assert (libdir / "libaotriton_v2.so").resolve().name == f"libaotriton_v2.so.{version}"
    headers = installed / "include" / "aotriton_api" / line / "aotriton"
    for h in LINE_HEADERS[line]:
        assert (headers / h).is_file(), h
    other = "flash/backends.h" if line != "0.14" else "v2/flash.h"
    assert not (headers / other).exists(), other
    config = (headers / "config.h").read_text()
    major, minor, patch = version.split(".")
    for k, v in (("MAJOR", major), ("MINOR", minor), ("PATCH", patch)):
        assert f"#define AOTRITON_VERSION_{k} {v}u" in config


def test_setup_py_renders_what_cmake_installs(installed, line):
    """The editable build's headers (setup.py) == CMake's install, config.h included."""
    pkg = HERE.parents[1] / "src" / "aotriton_rocm" / "include" / "aotriton_api" / line / "aotriton"
    if not (pkg / "config.h").is_file():
        pytest.skip("no editable build in src/aotriton_rocm/include (scripts/dev-env.sh makes one)")
    cmake = installed / "include" / "aotriton_api" / line / "aotriton"
    files = sorted(p.relative_to(cmake) for p in cmake.rglob("*.h"))
    assert files == sorted(p.relative_to(pkg) for p in pkg.rglob("*.h"))
    for rel in files:
        assert (pkg / rel).read_text() == (cmake / rel).read_text(), rel


@pytest.fixture
def release_build(native_build):
    """The checks of what ships: the sanitizer run's Debug + ASan library links
    the ASan runtime (newer symbol versions) and is not what the wheel carries."""
    from conftest import _sanitized
    if _sanitized(native_build):
        pytest.skip("checks the shipped (release) library; the sanitizer run builds a Debug + ASan one")


def test_exported_symbols_are_the_call_sites(prefix, line, release_build):
    lib = prefix / "lib" / f"libaotriton_v2.so.{LINES[line][0]}"
    mangled = _exports(lib)
    assert mangled and all(m.startswith("_ZN8aotriton") or m.startswith("_ZNK8aotriton")
                           for m in mangled), mangled
    demangled = set(_run(["c++filt", *mangled]).splitlines())
    assert demangled == EXPECTED[line], (sorted(demangled - EXPECTED[line]),
                                         sorted(EXPECTED[line] - demangled))


def test_soname_is_the_file_name_and_symbols_are_unversioned(prefix, line, release_build):
    name = f"libaotriton_v2.so.{LINES[line][0]}"
    dyn = _run(["readelf", "-d", prefix / "lib" / name])
    assert f"Library soname: [{name}]" in dyn
    assert "libaotriton_rocm" not in dyn and "libamdhip64" not in dyn and "libcuda" not in dyn
    sections = _run(["readelf", "-S", "-W", prefix / "lib" / name])
    assert ".gnu.version_d" not in sections  # no version definitions
    # loadable where the runtime wheel is (manylinux_2_28: glibc 2.28, GCC 8's libstdc++)
    import re
    limits = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 25), "CXXABI": (1, 3, 11)}
    symbols = _run(["objdump", "-T", prefix / "lib" / name])
    for lib, version in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)", symbols):
        assert tuple(int(x) for x in version.split(".")) <= limits[lib], (lib, version)


def test_sizes_and_offsets_match_upstream(prefix, line, tmp_path):
    exe = tmp_path / "layout"
    extra = {"0.11": [], "0.13": ["-DLAYOUT_V3_FIELDS"],
             "0.14": ["-DLAYOUT_V3_FIELDS", "-DLAYOUT_VARLEN_BITS"]}[line]
    _run([_cxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", *extra, "-I", prefix / "include",
          API / "layout.cpp", "-o", exe])
    measured = {}
    for row in _run([exe]).splitlines():
        key, value = row.rsplit(" ", 1)
        measured[key] = int(value)
    assert measured == LINES[line][1]


def test_every_api_function_links(prefix, line, tmp_path, release_build):
    """What upstream's header lets a consumer call resolves in our library."""
    exe = tmp_path / "call_sites"
    _run([_cxx(), "-std=c++17", "-O0", "-Wall", "-Werror", "-I", prefix / "include",
          API / "call_sites.cpp", "-o", exe, "-Wl,--no-undefined", prefix / "lib" / "libaotriton_v2.so",
          f"-Wl,-rpath,{prefix / 'lib'}"])
    undefined = set(_run(["nm", "-u", exe]).split())
    wanted = {u for u in undefined if "8aotriton" in u}
    assert wanted and wanted <= set(_exports(prefix / "lib" / f"libaotriton_v2.so.{LINES[line][0]}"))


def test_headers_take_hip_types_from_hip_runtime_h(prefix, tmp_path):
    """With a hip_runtime.h on the include path the headers use it (PyTorch's
    build); the layouts stay the same."""
    (tmp_path / "hip").mkdir()
    (tmp_path / "hip" / "hip_runtime.h").write_text(
        "#pragma once\n#define FAKE_HIP_RUNTIME 1\ntypedef struct ihipStream_t *hipStream_t;\n"
        "typedef enum hipError_t { hipSuccess = 0, hipErrorInvalidSymbol = 13 } hipError_t;\n")
    src = tmp_path / "t.cpp"
    src.write_text("#include <aotriton/flash.h>\nstatic_assert(FAKE_HIP_RUNTIME == 1, \"\");\n"
                   "static_assert(AOTRITON_ROCM_HIP_RUNTIME_H == 1, \"\");\nint main() { return 0; }\n")
    _run([_cxx(), "-std=c++17", "-Werror", "-I", tmp_path, "-I", prefix / "include", src, "-o",
          tmp_path / "t"])


@pytest.fixture(scope="module")
def consumer(prefix, line, tmp_path_factory):
    build = tmp_path_factory.mktemp(f"consumer-{line}")
    _run(["cmake", "-S", API / "consumer", "-B", build, f"-DAOTRITON_INSTALLED_PREFIX={prefix}",
          "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", build])
    return build / "libaotriton_api_consumer.so"


def test_consumer_on_the_stub_driver(consumer, prefix, line, native_build):
    pytest.importorskip("torch")
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    out = _run([sys.executable, API / "stub_scenarios.py", consumer, stub,
                prefix / "lib" / "aotriton.images", line])
    assert out.strip().endswith("ok"), out


def test_013_consumer_on_the_014_library(consumer, installed, line, native_build, tmp_path):
    """A program built against the 0.13 headers (params versions 3/6) runs on
    the 0.14 library put in place of libaotriton_v2.so.0.13.0 (torch-dropin's
    swap), every call translated as upstream's 0.14 library translates it."""
    if line != "0.13":
        pytest.skip("the 0.13 consumer only")
    pytest.importorskip("torch")
    swapped = tmp_path / "lib"
    swapped.mkdir()
    shutil.copy2(installed / "lib" / "aotriton_api" / "0.14" / "libaotriton_v2.so.0.14.0",
                 swapped / "libaotriton_v2.so.0.13.0")
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    import os
    env = {**os.environ, "LD_LIBRARY_PATH": str(swapped)}
    # the library the consumer loads is the 0.14 one (its soname says so)
    out = _run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1]); "
                "print(open('/proc/self/maps').read())", consumer], env=env)
    assert str(swapped / "libaotriton_v2.so.0.13.0") in out
    out = _run([sys.executable, API / "stub_scenarios.py", consumer, stub,
                swapped / "aotriton.images", "0.13", "0.14"], env=env)
    assert out.strip().endswith("ok"), out


def test_full_image_in_a_conda_layout(consumer, prefix, line, native_build, tmp_path):
    """check_gpu vouches for an image of every variant found six directories
    up ($PREFIX/share/aotriton-rocm from torch/lib); head dims that are not
    multiples of 8 are staged once."""
    pytest.importorskip("torch")
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    v2 = next((prefix / "lib").glob("libaotriton_v2.so.*"))
    out = _run([sys.executable, API / "full_image_scenario.py", consumer, stub, v2,
                tmp_path / "env"])
    assert out.strip().endswith("ok"), out
