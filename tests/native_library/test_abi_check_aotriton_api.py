"""`aotriton-rocm abi-check` on libaotriton_v2 (AOTriton's C++ API,
native/aotriton_api/): the CMake install of native/ is the previous
release; variants of the 0.13 line's library are compiled here from edited
sources and headers (linked with the same build's core objects) into copies
of that install, versioned 0.1.1, and compared against it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from aotriton_rocm.commands.cli import main as cli_main
from aotriton_rocm.tooling.release import abi_aotriton_api as AA
from aotriton_rocm.tooling.release import abi_native as NA

ROOT = Path(__file__).resolve().parents[2]
LINE, NAME = "0.13", "libaotriton_v2.so.0.13.0"
LBL = f"libaotriton_v2 (AOTriton API {LINE})"
pytestmark = pytest.mark.skipif(AA.find_cxx() is None, reason="needs a C++ compiler")


def _run(cmd):
    r = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-6000:]}", pytrace=False)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} changed: update this test ({old!r})"
    path.write_text(text.replace(old, new, 1))


def compatible(src: Path) -> None:
    """A new function and a new DType enumerator: additions."""
    _edit(src / "include/aotriton/util.h", "bool AOTRITON_API isArchExperimentallySupported(hipStream_t);",
          "bool AOTRITON_API isArchExperimentallySupported(hipStream_t);\n"
          "bool AOTRITON_API isArchFullySupported(hipStream_t);")
    _edit(src / "include/aotriton/dtypes.h", "kUInt64 = 23,", "kUInt64 = 23,\n  kFloat8 = 30,")
    with open(src / "src/runtime.cpp", "a") as f:
        f.write("\nnamespace aotriton {\nbool isArchFullySupported(hipStream_t) { return true; }\n}\n")


def breaking(src: Path) -> None:
    """isArchTechPreview removed, a field appended to attn_fwd_params."""
    _edit(src / "include/aotriton/util.h", "bool AOTRITON_API isArchTechPreview(hipStream_t);", "")
    _edit(src / "src/runtime.cpp", "bool isArchTechPreview(hipStream_t) { return false; }", "")
    _edit(src / "include/aotriton/flash.h", "  int32_t window_right;\n#if AOTRITON_ROCM_API_LINE >= 14\n",
          "  int32_t window_right;\n  uint64_t extra_field;\n#if AOTRITON_ROCM_API_LINE >= 14\n")
    _edit(src / "include/aotriton/flash.h", "#elif AOTRITON_ROCM_API_LINE >= 12\nstatic_assert(sizeof(attn_options) "
          "== 8, \"attn_options ABI\");\nAOTRITON_ROCM_AT(attn_options, deterministic, 4);\n"
          "static_assert(sizeof(attn_fwd_params) == 832",
          "#elif AOTRITON_ROCM_API_LINE >= 12\nstatic_assert(sizeof(attn_options) == 8, \"attn_options ABI\");\n"
          "AOTRITON_ROCM_AT(attn_options, deterministic, 4);\nstatic_assert(sizeof(attn_fwd_params) == 840")


def leaky(src: Path) -> None:
    """The core's aotr_* C API exported too (linked against a libamdhip64 below)."""
    _edit(src / "libaotriton_v2.map", "      aotriton::*;\n    };", "      aotriton::*;\n    };\n    aotr_*;")


def _set_rocm_version(prefix: Path, version: str) -> None:
    x, y, z = version.split(".")
    h = prefix / "include/aotriton_rocm/aotriton_rocm.h"
    if h.is_file():
        text = h.read_text()
        for k, v in (("MAJOR", x), ("MINOR", y), ("PATCH", z)):
            text = re.sub(rf"#define AOTR_VERSION_{k} \d+", f"#define AOTR_VERSION_{k} {v}", text)
        h.write_text(text)
    for config in prefix.glob("include/aotriton_api/*/aotriton/config.h"):
        config.write_text(re.sub(r'#define AOTRITON_ROCM_VERSION "[^"]*"',
                                 f'#define AOTRITON_ROCM_VERSION "{version}"', config.read_text()))


def build_variant(native_build: Path, old: Path, tmp: Path, name: str, edit, link=()) -> Path:
    """``old`` copied to ``tmp/name`` as release 0.1.1, its 0.13 library and
    headers rebuilt from native/aotriton_api/ edited by ``edit``."""
    src = tmp / f"{name}-src"
    shutil.copytree(ROOT / "native" / "aotriton_api", src)
    edit(src)
    prefix = tmp / name
    shutil.copytree(old, prefix, symlinks=True)
    generated = native_build / "aotriton_api" / LINE / "include"
    core = sorted((native_build / "aotriton_api" / "CMakeFiles" / "aotriton_rocm_static_core.dir").rglob("*.o"))
    assert core, "the core's objects are missing from the native build"
    lib = prefix / "lib" / "aotriton_api" / LINE / NAME
    _run([AA.find_cxx(), "-std=c++17", "-O0", "-g0", "-fPIC", "-shared", "-fvisibility=hidden",
          "-fvisibility-inlines-hidden", "-Daotriton_v2_EXPORTS", "-DAOTRITON_ROCM_NO_HIP_RUNTIME_H",
          "-include", ROOT / "native/src/glibc_compat.h", "-I", generated, "-I", src / "include",
          "-I", ROOT / "native/include", *sorted((src / "src").glob("*.cpp")), *core,
          f"-Wl,-soname,{NAME}", f"-Wl,--version-script={src / 'libaotriton_v2.map'}", "-Wl,-z,defs",
          "-Wl,--no-as-needed", *link, "-o", lib, "-ldl", "-lpthread"])
    headers = prefix / "include" / "aotriton_api" / LINE / "aotriton"
    shutil.rmtree(headers)
    shutil.copytree(src / "include" / "aotriton", headers)
    shutil.copy2(generated / "aotriton" / "config.h", headers / "config.h")
    _set_rocm_version(prefix, "0.1.1")
    return prefix


@pytest.fixture(scope="module")
def releases(native_build, tmp_path_factory):
    from conftest import _sanitized

    if _sanitized(native_build):
        pytest.skip("the variants link the core's objects: not with the sanitizer build's")
    t = tmp_path_factory.mktemp("v2-abi")
    old = t / "old"
    _run(["cmake", "--install", native_build, "--prefix", old])
    fake = t / "fake-hip"
    fake.mkdir()
    (fake / "hip.c").write_text("int fake_hip_symbol(void) { return 0; }\n")
    _run(["cc", "-shared", "-fPIC", "-Wl,-soname,libamdhip64.so", "-o", fake / "libamdhip64.so", fake / "hip.c"])
    return {
        "old": old,
        "compatible": build_variant(native_build, old, t, "compatible", compatible),
        "breaking": build_variant(native_build, old, t, "breaking", breaking),
        "leaky": build_variant(native_build, old, t, "leaky", leaky, link=[f"-L{fake}", "-l:libamdhip64.so"]),
    }


@pytest.fixture(autouse=True)
def header_only_c_library(monkeypatch):
    """The C library is the same on both sides; libabigail's reading of it is
    test_abi_check_native's (and slow)."""
    monkeypatch.setattr(NA, "have_libabigail", lambda: False)


def _abi_check(capsys, old, new):
    rc = cli_main(["abi-check", str(old), str(new)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_install_reads_both_lines(releases, capsys):
    rc, out = _abi_check(capsys, releases["old"], releases["old"])
    assert rc == 0 and "no ABI changes" in out, out
    for line in ("0.11", "0.13", "0.14"):
        assert f"note: libaotriton_v2 (AOTriton API {line}): layouts of" in out
    # the 0.14 line: VarlenBits' bit positions are compared too (the wire word)
    v14 = AA.scan_api_libs(releases["old"] / "lib", releases["old"] / "include")["0.14"]
    fl = "aotriton::v3::flash::"
    assert v14.types[fl + "VarlenMode"].fields == [
        ("stacked", 0, "uint8_t:1 at bit 0"), ("length", 0, "uint8_t:2 at bit 1"),
        ("position", 0, "uint8_t:2 at bit 3"), ("reserved", 0, "uint8_t:3 at bit 5")]
    assert ("lse_layout", 2, "uint16_t:2 at bit 16") in v14.types[fl + "VarlenBits"].fields
    assert ("varlen_bits", 1232, "VarlenBits") in v14.types[fl + "attn_bwd_params"].fields
    assert (v14.constants[fl + "attn_fwd_params::kVersion"], v14.constants[fl + "attn_bwd_params::kVersion"],
            v14.constants[fl + "OpAttnBwdBackend::kFlyc"]) == (4, 7, 3)
    assert AA.release_problems(v14) == []
    lib = AA.scan_api_libs(releases["old"] / "lib", releases["old"] / "include")[LINE]
    fwd = lib.types["aotriton::v3::flash::attn_fwd_params"]
    assert fwd.size == 832 and ("philox_offset2", 680, "uint64_t") in fwd.fields
    assert lib.types["aotriton::TensorView<4>"].size == 80
    assert lib.constants["aotriton::v3::flash::attn_bwd_params::kVersion"] == 6
    assert lib.enums["aotriton::DType"]["kBFloat16"] == 3
    assert AA.release_problems(lib) == []


def test_compatible_point_release_is_accepted(releases, capsys):
    rc, out = _abi_check(capsys, releases["old"], releases["compatible"])
    assert rc == 0, out
    assert f"compatible addition: {LBL}: new exported symbol aotriton::isArchFullySupported(ihipStream_t*)" in out
    assert f"compatible addition: {LBL}: enum aotriton::DType: new enumerator kFloat8 = 30" in out
    assert "breaking" not in out and "OK: 0.1.1 is ABI compatible with 0.1.0" in out


def test_removed_function_and_changed_layout_are_refused(releases, capsys):
    rc, out = _abi_check(capsys, releases["old"], releases["breaking"])
    assert rc == 1, out
    assert (f"breaking: {LBL}: exported symbol removed: aotriton::isArchTechPreview(ihipStream_t*) "
            "(_ZN8aotriton17isArchTechPreviewEP12ihipStream_t)") in out
    assert f"breaking: {LBL}: aotriton::v3::flash::attn_fwd_params: size changed: 832 -> 840 bytes" in out
    assert (f"breaking: {LBL}: aotriton::v3::flash::attn_fwd_params: field extra_field (uint64_t) added at "
            "offset 832") in out
    assert "REFUSED: 0.1.1 is a point release of the 0.1 ABI line" in out
    assert "0.11" not in "".join(ln for ln in out.splitlines() if ln.strip().startswith("breaking"))


def test_exports_outside_the_namespace_and_gpu_runtime_needed_are_refused(releases, capsys):
    rc, out = _abi_check(capsys, releases["old"], releases["leaky"])
    assert rc == 1, out
    assert f"REFUSED: NEW's libaotriton_v2 is not releasable: {LBL}: exports" in out
    assert "symbol(s) outside namespace aotriton" in out and "aotr_runtime_create" in out
    assert f"{LBL}: needs libamdhip64.so (DT_NEEDED)" in out
