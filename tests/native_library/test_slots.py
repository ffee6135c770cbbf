"""The C core's argument-slot tables come from kernels/variants.toml
(native/gen_slots.py): a disagreement between the two fails the build with a
message naming the argument, not the first launch. Each case edits a copy of
variants.toml, runs the generator and compiles the core's includers of the
tables against its output. And setup.py and CMake build from one source list."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NATIVE_SRC, ROOT, _c_compiler

VARIANTS = (ROOT / "kernels" / "variants.toml").read_text()
CORE = sorted(str(p) for p in (NATIVE_SRC / "src").glob("*.c"))
INCLUDERS = tuple(Path(p).name for p in CORE if '#include "slots.h"' in Path(p).read_text())


def generate(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    variants = tmp_path / "variants.toml"
    variants.write_text(text)
    return subprocess.run([sys.executable, NATIVE_SRC / "gen_slots.py", variants, tmp_path / "gen", *CORE],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def compile_core(tmp_path: Path) -> subprocess.CompletedProcess:
    cc = _c_compiler() or pytest.skip("needs a C compiler")
    return subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-fsyntax-only", "-Werror",
                           "-I", NATIVE_SRC / "include", "-I", NATIVE_SRC / "src", "-I", tmp_path / "gen",
                           *(NATIVE_SRC / "src" / f for f in INCLUDERS)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kernel_block(kernel: str) -> str:
    start = VARIANTS.index(f"[kernels.{kernel}]")
    return VARIANTS[start:VARIANTS.index("\n]\n", start)]


def edit_kernel(kernel: str, old: str, new: str) -> str:
    block = kernel_block(kernel)
    assert old in block
    return VARIANTS.replace(block, block.replace(old, new))


def test_tables_of_the_real_variants_compile(tmp_path):
    r = generate(tmp_path, VARIANTS)
    assert r.returncode == 0, r.stdout
    header = (tmp_path / "gen" / "aotr_slots.h").read_text()
    assert "AOTR_SLOT_stride_qz," in header and "AOTR_KERNEL_attn_fwd," in header
    r = compile_core(tmp_path)
    assert r.returncode == 0, r.stdout


def test_an_argument_the_core_does_not_fill_fails_generation(tmp_path):
    r = generate(tmp_path, edit_kernel("attn_fwd", '["softcap", "fp32"]',
                                       '["softcap", "fp32"], ["temperature", "fp32"]'))
    assert r.returncode == 1
    assert "no C source fills argument temperature (names AOTR_SLOT_temperature)" in r.stdout


def test_an_argument_gone_from_every_kernel_fails_compilation(tmp_path):
    r = generate(tmp_path, edit_kernel("dropout_uniform", ', ["encode_keep", "i32"]', ""))
    assert r.returncode == 0, r.stdout
    r = compile_core(tmp_path)
    assert r.returncode != 0
    assert re.search(r"dropout\.c:\d+:\d+: error: .AOTR_SLOT_encode_keep. undeclared", r.stdout), r.stdout


def test_a_kind_change_fails_generation(tmp_path):
    r = generate(tmp_path, edit_kernel("attn_bwd_dq", '["stride_dqz", "i32"]', '["stride_dqz", "i64"]'))
    assert r.returncode == 1
    assert ("argument stride_dqz is i32 in kernel attn_bwd_dq_convert but i64 in kernel attn_bwd_dq: "
            "the C core passes one value per name") in r.stdout


def test_reordered_strides_fail_compilation(tmp_path):
    text = edit_kernel("attn_fwd", '["stride_qz", "i32"], ["stride_qh", "i32"]',
                       '["stride_qh", "i32"], ["stride_qz", "i32"]')
    assert generate(tmp_path, text).returncode == 0
    r = compile_core(tmp_path)
    assert r.returncode != 0
    assert ('static assertion failed: "variants.toml: AOTR_SLOT_stride_qh must follow '
            'AOTR_SLOT_stride_qz') in r.stdout, r.stdout


def test_a_renamed_kernel_fails_compilation(tmp_path):
    text = VARIANTS.replace("[kernels.attn_bwd_preprocess", "[kernels.attn_bwd_prep")
    assert generate(tmp_path, text).returncode == 0
    r = compile_core(tmp_path)
    assert r.returncode != 0
    assert "AOTR_KERNEL_attn_bwd_preprocess" in r.stdout and "undeclared" in r.stdout, r.stdout


def test_an_optional_argument_must_exist(tmp_path):
    r = generate(tmp_path, edit_kernel("attn_bwd_fused", ', ["dropout_p", "fp32"]', ""))
    assert r.returncode == 1
    assert "kernel attn_bwd_fused has no argument dropout_p (gen_slots.py's OPTIONAL_ARGS names it)" in r.stdout


def test_one_source_list():
    """setup.py and CMake read native/sources.cmake: every C file of native/src is in it,
    and every C++ file of native/aotriton_api/src and native/torch."""
    text = (NATIVE_SRC / "sources.cmake").read_text()
    listed = re.search(r"set\(AOTR_CORE_SOURCES\s+([^)]*)\)", text).group(1).split()
    assert sorted(listed) == sorted(f"src/{Path(p).name}" for p in CORE)
    api = re.search(r"set\(AOTR_API_SOURCES\s+([^)]*)\)", text).group(1).split()
    assert sorted(api) == sorted(f"src/{p.name}" for p in (NATIVE_SRC / "aotriton_api" / "src").glob("*.cpp"))
    torch = re.search(r"set\(AOTR_TORCH_SOURCES\s+([^)]*)\)", text).group(1).split()
    assert sorted(torch) == sorted(p.name for p in (NATIVE_SRC / "torch").glob("*.cpp"))
