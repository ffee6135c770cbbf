"""`aotriton-rocm abi-check` on libaotriton_rocm, the C library: variants of
native/ compiled here into install prefixes (lib/libaotriton_rocm.so.X.Y,
include/aotriton_rocm/aotriton_rocm.h), compared by the header check and by
libabigail (abidw/abidiff)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aotriton_rocm.commands.cli import main as cli_main
from aotriton_rocm.tooling.release import abi_native as NA
from aotriton_rocm.tooling.release import c_header as CH

ROOT = Path(__file__).resolve().parents[3]
CC = CH.find_cc()
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler to build libaotriton_rocm")
needs_abigail = pytest.mark.skipif(not NA.have_libabigail(),
                                   reason=f"libabigail missing: {NA.INSTALL_ABIGAIL}")

HDR = "include/aotriton_rocm/aotriton_rocm.h"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} changed: update this test ({old!r})"
    path.write_text(text.replace(old, new, 1))


def _set_version(src: Path, version: str) -> None:
    x, y, z = version.split(".")
    for k, v in (("MAJOR", x), ("MINOR", y), ("PATCH", z)):
        h = src / HDR
        h.write_text(__import__("re").sub(rf"#define AOTR_VERSION_{k} \d+", f"#define AOTR_VERSION_{k} {v}",
                                          h.read_text()))
    _edit(src / HDR, '#define AOTR_ABI_LINE "0.1"', f'#define AOTR_ABI_LINE "{x}.{y}"')
    _edit(src / "src/libaotriton_rocm.map", "AOTR_0.1", f"AOTR_{x}.{y}")


def remove_function(src: Path) -> None:
    _edit(src / HDR, "AOTR_API const char *aotr_abi_line(void);\n", "")
    _edit(src / "src/error.c", "const char *aotr_abi_line(void) { return AOTR_ABI_LINE; }", "")


def change_field_type(src: Path) -> None:
    _edit(src / HDR, "    int32_t rank;  /* 0..AOTR_MAX_RANK */", "    int64_t rank;")


def insert_field(src: Path) -> None:
    _edit(src / HDR, "    int32_t device; /* device index */",
          "    int32_t device; /* device index */\n    int32_t flags;")


FWD_TAIL = "    aotr_tensor seq_starts_q, seq_starts_k, seqlens_k;\n} aotr_attn_fwd_params;"


def compatible(src: Path) -> None:
    _edit(src / HDR, FWD_TAIL, FWD_TAIL.replace("\n}", "\n    int32_t extra_flags;\n}"))
    _edit(src / HDR, "AOTR_API const char *aotr_abi_line(void);\n",
          "AOTR_API const char *aotr_abi_line(void);\nAOTR_API int aotr_new_feature(void);\n")
    with open(src / "src/error.c", "a") as f:
        f.write("\nint aotr_new_feature(void) { return 1; }\n")


def build(tmp: Path, name: str, version: str, edit=None, debug: bool = True) -> Path:
    """Compile a variant of native/ into the install prefix ``tmp/name``."""
    src = tmp / f"{name}-src"
    shutil.copytree(ROOT / "native", src)
    if version != "0.1.0":
        _set_version(src, version)
    if edit is not None:
        edit(src)
    line = ".".join(version.split(".")[:2])
    prefix = tmp / name
    (prefix / "lib").mkdir(parents=True)
    (prefix / "include/aotriton_rocm").mkdir(parents=True)
    lib = prefix / "lib" / f"libaotriton_rocm.so.{line}"
    sources = sorted(map(str, (src / "src").glob("*.c")))
    # the argument-slot tables (native/CMakeLists.txt's aotr_slots)
    subprocess.run([sys.executable, str(src / "gen_slots.py"), str(ROOT / "kernels/variants.toml"),
                    str(src / "generated"), *sources], check=True)
    subprocess.run([CC, "-shared", "-fPIC", "-std=c11", "-O0", "-g" if debug else "-g0",
                    "-fvisibility=hidden", "-D_GNU_SOURCE", "-include", str(src / "src/glibc_compat.h"),
                    "-I", str(src / "include"), "-I", str(src / "src"), "-I", str(src / "generated"),
                    f"-Wl,-soname,libaotriton_rocm.so.{line}",
                    f"-Wl,--version-script={src / 'src/libaotriton_rocm.map'}", "-Wl,-z,defs",
                    "-o", str(lib), *sources, "-ldl", "-lpthread"],
                   check=True)
    os.symlink(lib.name, prefix / "lib" / "libaotriton_rocm.so")
    shutil.copy2(src / HDR, prefix / HDR)
    return prefix


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    t = tmp_path_factory.mktemp("native-abi")
    return {
        "old": build(t, "old", "0.1.0"),
        "compatible": build(t, "compatible", "0.1.1", compatible),
        "removed": build(t, "removed", "0.1.1", remove_function),
        "field_type": build(t, "field_type", "0.1.1", change_field_type),
        "inserted": build(t, "inserted", "0.1.1", insert_field),
        "next_line": build(t, "next_line", "0.2.0", insert_field),
        "old_nodebug": build(t, "old_nodebug", "0.1.0", debug=False),
        "inserted_nodebug": build(t, "inserted_nodebug", "0.1.1", insert_field, debug=False),
    }


def _abi_check(capsys, old, new, *extra):
    rc = cli_main(["abi-check", str(old), str(new), *extra])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.fixture(params=["libabigail", "header only"])
def mode(request, monkeypatch):
    if request.param == "header only":
        monkeypatch.setattr(NA, "have_libabigail", lambda: False)
    elif not NA.have_libabigail():
        pytest.skip(f"libabigail missing: {NA.INSTALL_ABIGAIL}")
    return request.param


BREAKS = {
    "removed": [r" header: function aotr_abi_line removed \(was const char \*\(\)\)",
                r": exported symbol aotr_abi_line@AOTR_0\.1 removed"],
    "field_type": [r" header: struct aotr_tensor: field rank type changed: int32_t -> int64_t",
                   r" header: struct aotr_tensor: field sizes offset changed: 16 -> 24"],
    "inserted": [r" header: struct aotr_attn_fwd_params: field stream offset changed: 8 -> 16",
                 r" header: struct aotr_attn_fwd_params: field flags \(int32_t\) inserted at offset 8, "
                 r"inside the old 1256 bytes"],
}
ABIGAIL_BREAKS = {
    "removed": r"\(libabigail\): function aotr_abi_line removed",
    "field_type": r"\(libabigail\): struct aotr_tensor: field rank type changed: int32_t -> int64_t",
    "inserted": r"\(libabigail\): struct aotr_attn_fwd_params: field stream offset changed: 8 -> 16",
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(BREAKS))
def test_breaking_point_release_is_refused(libs, capsys, mode, variant):
    import re
    rc, out = _abi_check(capsys, libs["old"], libs[variant])
    assert rc == 1, out
    for pat in BREAKS[variant]:
        assert re.search(r"breaking: C library" + pat, out), (pat, out)
    assert "REFUSED: 0.1.1 is a point release of the 0.1 ABI line" in out
    if mode == "libabigail":
        assert re.search(r"breaking: C library " + ABIGAIL_BREAKS[variant], out), out
        assert "libabigail (abidw + abidiff) read the libraries' DWARF" in out
        assert "abidiff (exit" in out
    else:
        assert "WARNING: libabigail is not installed" in out and "apt-get install abigail-tools" in out


@pytest.mark.slow
def test_compatible_point_release_is_accepted(libs, capsys, mode):
    rc, out = _abi_check(capsys, libs["old"], libs["compatible"])
    assert rc == 0, out
    assert "breaking" not in out
    assert "compatible addition: C library header: new function aotr_new_feature: int ()" in out
    assert "compatible addition: C library: new exported symbol aotr_new_feature@AOTR_0.1" in out
    assert ("compatible addition: C library header: struct aotr_attn_fwd_params: new field extra_flags "
            "(int32_t) appended at offset 1256") in out
    if mode == "libabigail":
        assert "C library (libabigail): struct aotr_attn_fwd_params: new field extra_flags" in out
    assert "OK: 0.1.1 is ABI compatible with 0.1.0" in out


@pytest.mark.slow
def test_new_abi_line_may_break(libs, capsys, mode):
    rc, out = _abi_check(capsys, libs["old"], libs["next_line"])
    assert rc == 0, out
    assert ("breaking (allowed: new ABI line): C library: soname changed: libaotriton_rocm.so.0.1 -> "
            "libaotriton_rocm.so.0.2") in out
    assert "symbol aotr_abi_line version node changed: AOTR_0.1 -> AOTR_0.2" in out
    assert "starts the new ABI line 0.2" in out


@pytest.mark.slow
def test_new_abi_line_must_change_the_soname(libs, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(libs["next_line"], bad, symlinks=True)
    lib = bad / "lib" / "libaotriton_rocm.so.0.2"
    subprocess.run(["patchelf", "--set-soname", "libaotriton_rocm.so.0.1", str(lib)], check=True) \
        if shutil.which("patchelf") else pytest.skip("needs patchelf")
    rc, out = _abi_check(capsys, libs["old"], bad)
    assert rc == 1 and ("REFUSED: the C library's soname is libaotriton_rocm.so.0.1, the ABI line 0.2 "
                        "needs libaotriton_rocm.so.0.2") in out, out


@pytest.mark.slow
@needs_abigail
def test_without_dwarf_libabigail_reads_stand_ins(libs, capsys):
    """The runtime wheel's library is built with -g0: libabigail then reads
    stand-ins compiled with -g from the shipped headers."""
    rc, out = _abi_check(capsys, libs["old_nodebug"], libs["inserted_nodebug"])
    assert rc == 1, out
    assert "read stand-ins compiled with -g from the shipped headers" in out
    assert ("breaking: C library (libabigail): struct aotr_attn_fwd_params: field stream offset changed: "
            "8 -> 16") in out
    rc, out = _abi_check(capsys, libs["old_nodebug"], libs["old"])
    assert rc == 0 and "no ABI changes" in out, out


@pytest.mark.slow
def test_require_libabigail(libs, capsys, monkeypatch):
    monkeypatch.setattr(NA, "have_libabigail", lambda: False)
    rc, out = _abi_check(capsys, libs["old"], libs["compatible"], "--require-libabigail")
    assert rc == 2 and "abidiff/abidw not found: install libabigail's abidiff/abidw: apt-get install " \
                       "abigail-tools" in out, out


def test_layout_rules_match_the_compiler():
    header = ROOT / "native" / HDR
    model, fields = CH.parse_header(header.read_text())
    assert CH._rule_layout(fields, model.callbacks) == CH._cc_layout(header, fields, CC)
    assert model.callbacks["aotr_host_launch_fn"] == \
        "int32_t (void *, const char *, const uint32_t[3], const uint64_t *, size_t)"
    assert model.functions["aotr_find_archive"] == "aotr_status (const char *, const char *, char *, size_t)"
    assert model.enums["aotr_status"]["AOTR_OUT_OF_MEMORY"] == 9


def test_header_parser_is_strict():
    with pytest.raises(CH.NativeAbiError, match="unsupported declaration"):
        CH.parse_header("AOTR_API int (*aotr_callback)(int);\n")


def _strip_score_mod(header: Path) -> None:
    """The params structs as they were before softcap and ALiBi were appended."""
    import re

    text = header.read_text()
    for struct in ("aotr_attn_fwd_params", "aotr_attn_bwd_params"):
        text, n = re.subn(r"    /\* ---- appended in 0\.1 .*?(\} " + struct + ";)", r"\1", text,
                          count=1, flags=re.S)
        assert n == 1, struct
    header.write_text(text)


def test_appending_softcap_and_alibi_is_a_compatible_point_release(tmp_path, capsys, mode):
    """This line's own change: softcap and alibi_slopes appended to the
    params structs (headers compared; libabigail through stand-ins)."""
    old = build(tmp_path, "before", "0.1.0", debug=False)
    _strip_score_mod(old / HDR)
    new = build(tmp_path, "after", "0.1.1", debug=False)
    rc, out = _abi_check(capsys, old, new)
    assert rc == 0, out
    assert "breaking" not in out
    for struct in ("aotr_attn_fwd_params", "aotr_attn_bwd_params"):
        assert (f"struct {struct}: new field softcap (float) appended at offset") in out, out
        assert (f"struct {struct}: new field alibi_slopes (aotr_tensor) appended at offset") in out
    assert "OK: 0.1.1 is ABI compatible with 0.1.0" in out
