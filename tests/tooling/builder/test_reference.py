"""AMD's kernels beside ours (tooling/builder/reference*.py, gcn_decode.py,
cycle_model.py): the machine-code decoder against LLVM's assembler
encodings and against triton's own assembly text of the same code object,
the amd-aiter wheel's assembly kernels read by the same reader, AMD's
Triton attention compiled by our triton, and the cycle model's
calibration. The wheel comes from PyPI once per cache
($AOTRITON_ROCM_REFERENCE_CACHE or ~/.cache/aotriton-rocm/reference);
the tests that need it skip only when it cannot be downloaded."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

pytest.importorskip("elftools")

from aotriton_rocm.tooling.builder import cycle_model as CM  # noqa: E402
from aotriton_rocm.tooling.builder.codeobject import ArchLimits, CodeObjectError, inspect_code_object  # noqa: E402
from aotriton_rocm.tooling.builder.gcn_decode import decode  # noqa: E402
from aotriton_rocm.tooling.builder.reference import (ReferenceError, ReferenceWheel, default_cache_dir,  # noqa: E402
                                                     download_wheel)

ROOT = Path(__file__).resolve().parents[3]


# -- the decoder, on encodings from LLVM's assembler ---------------------------

def _words(*hex_bytes: str) -> bytes:
    return b"".join(bytes(int(x, 16) for x in h.split(",")) for h in hex_bytes)


# (bytes as `llvm-mc -arch=amdgcn -mcpu=gfx90a -show-encoding` prints them, expected mnemonic, size)
LLVM_MC = [
    ("0x00,0x80,0xcc,0xd3,0x00,0x05,0x02,0x04", "v_mfma_f32_32x32x8_f16", 8),
    ("0x00,0x80,0xcd,0xd3,0x00,0x05,0x02,0x04", "v_mfma_f32_16x16x16_f16", 8),
    ("0x00,0x40,0xd8,0xd3,0x00,0x01,0x00,0x18", "v_accvgpr_read_b32", 8),
    ("0x00,0x00,0xfe,0xd9,0x00,0x00,0x00,0x00", "ds_read", 8),  # ds_read_b128
    ("0x00,0x00,0xbe,0xd9,0x00,0x00,0x00,0x00", "ds_write", 8),  # ds_write_b128
    ("0x00,0x00,0x7e,0xd8,0x01,0x02,0x00,0x00", "ds_other", 8),  # ds_bpermute_b32
    ("0x70,0x0f,0x8c,0xbf", "s_waitcnt", 4),
    ("0x00,0x00,0x8a,0xbf", "s_barrier", 4),
    ("0x00,0x10,0x5c,0xe0,0x00,0x00,0x00,0x80", "buffer_load", 8),  # buffer_load_dwordx4
    ("0x00,0x10,0x7c,0xe0,0x00,0x00,0x00,0x80", "buffer_store", 8),
    ("0x00,0x80,0x5c,0xdc,0x00,0x00,0x7f,0x00", "global_load", 8),  # global_load_dwordx4
    ("0x01,0x41,0x00,0x7e", "v_trans", 4),  # v_exp_f32_e32
    ("0xff,0x02,0x00,0x02,0x45,0x23,0x01,0x00", "v_valu", 8),  # v_add_f32 with a literal
    ("0xfa,0x02,0x00,0x7e,0x01,0xe4,0x00,0xff", "v_valu", 8),  # v_mov_b32_dpp
    ("0xf9,0x02,0x00,0x7e,0x01,0x05,0x04,0x00", "v_valu", 8),  # v_mov_b32_sdwa
    ("0x01,0xff,0x00,0x80,0x45,0x23,0x01,0x00", "s_alu", 8),  # s_add_u32 with a literal
    ("0x01,0xf8,0x00,0xba,0x45,0x23,0x01,0x00", "s_alu", 8),  # s_setreg_imm32_b32
    ("0x00,0xff,0x06,0xbf,0x45,0x23,0x01,0x00", "s_cmp", 8),
    ("0x00,0x00,0x44,0xd0,0x00,0x03,0x02,0x00", "v_cmp", 8),  # v_cmp_gt_f32_e64
    ("0x00,0x00,0x0a,0xc0,0x00,0x00,0x00,0x00", "s_load", 8),
    ("0x00,0x1d,0x80,0xbe", "s_setpc_b64", 4),
    ("0x00,0x00,0x81,0xbf", "s_endpgm", 4),
]


@pytest.mark.parametrize("hexes,mnemonic,size", LLVM_MC)
def test_decoder_on_llvm_encodings(hexes, mnemonic, size):
    (ins,) = decode(_words(hexes), "gfx90a")
    assert (ins.mnemonic, ins.size) == (mnemonic, size)


def test_decoder_bf16_opcodes_differ_by_arch():
    # v_mfma_f32_32x32x8bf16_1k is VOP3P op 0x66 on gfx90a, 0x60 on gfx940+
    word = _words("0x00,0x80,0xe6,0xd3,0x00,0x05,0x02,0x04")
    assert decode(word, "gfx90a")[0].mnemonic == "v_mfma_f32_32x32x8_bf16"
    assert decode(word[:2] + bytes([0xE0]) + word[3:], "gfx942")[0].mnemonic == "v_mfma_f32_32x32x8_bf16"
    with pytest.raises(CodeObjectError, match="CDNA"):
        decode(word, "gfx1100")


def test_decoder_branches_and_loops():
    """A two-instruction loop: s_cbranch_scc1 back by 2 words (simm16 = -2
    from the next pc) around one MFMA; a forward branch over it."""
    mfma = _words("0x00,0x80,0xcc,0xd3,0x00,0x05,0x02,0x04")
    back = struct.pack("<I", 0xBF850000 | (0x10000 - 3))  # scc1, target = pc + 4 - 12
    code = mfma + back + _words("0x00,0x00,0x81,0xbf")
    ins = decode(code, "gfx942")
    assert [i.mnemonic for i in ins] == ["v_mfma_f32_32x32x8_f16", "s_cbranch_scc1", "s_endpgm"]
    assert ins[1].target == 0
    with pytest.raises(CodeObjectError, match="past the end"):
        decode(mfma[:4], "gfx942")


# -- the cycle model, by hand --------------------------------------------------

def test_cycle_model_on_a_hand_computed_loop():
    lines = ["v_mfma_f32_32x32x8_bf16"] * 4 + ["v_valu"] * 10 + ["v_trans"] * 2 + ["ds_read ; 16"] * 2 + \
            ["buffer_load ; 16", "s_waitcnt", "s_barrier"]
    mix = CM.loop_mix(lines)
    # MFMA 4*32; VALU 10*4 + 2*16; issue 5; LDS 2*64*16/32; VMEM 64*16/16
    assert (mix.mfma, mix.valu, mix.issue, mix.lds, mix.vmem) == (128, 72, 5, 64, 64)
    assert mix.flops == 4 * 2 * 32 * 32 * 8
    e = CM.estimate(mix, waves=4, factor=1.0)
    # 4 waves: max(4 * 128, 128 + 72 + 5 + 64 + 64 = 333) = 512 cycles for 4 iterations
    assert e.cycles == 512 and e.bound == "mfma"
    simds = 304 * 4
    assert e.raw_tflops == pytest.approx(4 * 65536 / 512 * simds * 2.1e9 / 1e12)
    assert e.raw_tflops == pytest.approx(CM.MI300X["peak_fp16_tflops"], rel=1e-3)  # MFMA-bound = peak
    one = CM.estimate(mix, waves=1, factor=1.0)
    assert one.cycles == 333 and one.bound.startswith("latency")


def test_calibration_fit():
    cal = CM.calibrate([("a", 100.0, 50.0), ("b", 100.0, 200.0)])
    assert cal.factor == pytest.approx(1.0)
    assert cal.errors == pytest.approx({"a": 1.0, "b": -0.5})
    assert CM.CALIBRATION.max_error <= CM.STATED_ERROR


# -- the wheel ------------------------------------------------------------------

@pytest.fixture(scope="session")
def aiter_wheel() -> ReferenceWheel:
    cache = default_cache_dir()
    try:
        path = download_wheel(cache)
    except ReferenceError as e:
        pytest.skip(f"amd-aiter unavailable: {e}")
    return ReferenceWheel.open(path, cache)


@pytest.fixture(scope="session")
def limits():
    from aotriton_rocm.tooling.builder.plan import Sources
    from aotriton_rocm.tooling.common.targets import load_targets
    targets = load_targets(Sources.find(ROOT).targets_path)
    return {a: ArchLimits.from_spec(targets.archs[a]) for a in ("gfx942", "gfx950")}


def test_bad_wheel_and_offline_download(tmp_path, monkeypatch):
    bogus = tmp_path / "amd_aiter-0.0-py3-none-any.whl"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(ReferenceError, match="unreadable wheel"):
        ReferenceWheel.open(bogus, tmp_path / "cache")
    with pytest.raises(ReferenceError, match="not an amd-aiter wheel"):
        ReferenceWheel.open(tmp_path / "x.whl", tmp_path / "cache")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(ReferenceError, match="--reference-wheel"):
        download_wheel(tmp_path / "offline", timeout=120)


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_aiter_asm_kernels_read_by_our_reader(aiter_wheel, limits, arch, direction):
    from aotriton_rocm.tooling.builder.reference_report import _asm_figures
    asm = aiter_wheel.asm(arch, direction, 128, "bf16", False)
    assert asm is not None
    info = inspect_code_object(asm.code)
    assert info.arch == arch and len(info.kernels) == 1
    name, fig, lines = _asm_figures(asm.code, arch, limits[arch])
    loop = fig.loop
    assert loop["mfma"] >= 64 and fig.occupancy >= 1 and fig.vgpr_spills == 0
    assert all(not op.startswith("v_mfma_op") for op in loop["matrix_ops"])  # every MFMA named
    assert loop["global_loads"] > 0 and loop["ds_reads"] > 0 and loop["barriers"] > 0
    assert sum(1 for ln in lines if ln.startswith("v_mfma")) == loop["mfma"]


def test_calibration_holds_on_the_wheel(aiter_wheel, limits):
    from aotriton_rocm.tooling.builder.reference_report import calibration_from_wheel
    cal = calibration_from_wheel(aiter_wheel, limits["gfx942"])
    assert set(cal.errors) == set(CM.PUBLISHED)
    assert cal.factor == pytest.approx(CM.CALIBRATION.factor, rel=0.02)  # the stored fit is this wheel's
    assert cal.max_error <= CM.STATED_ERROR
    for name, raw in CM.CALIBRATION_RAW.items():
        assert raw * cal.factor == pytest.approx(CM.PUBLISHED[name], rel=CM.STATED_ERROR)


@pytest.mark.slow
def test_amd_triton_kernel_compiles_and_decodes_like_its_text(aiter_wheel, limits, tmp_path):
    """AMD's Triton forward (head dim 64, bf16) for gfx942 and gfx950 by our
    triton at AMD's configs: the hot loop read from the machine code equals
    the one read from triton's assembly text at compile time."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set")
    pytest.importorskip("triton")
    from aotriton_rocm.tooling.builder.reference_report import build_reference
    from aotriton_rocm.tooling.builder.reference_compile import RefShape, amd_config
    shapes = [RefShape("gfx942", "fwd", "bf16", 64, False), RefShape("gfx950", "fwd", "bf16", 64, False)]
    rep = build_reference(aiter_wheel, [], limits, tmp_path, shapes, jobs=2)
    rows = [r for r in rep.rows if r.who == "amd-triton"]
    assert len(rows) == 2 and all(r.figures is not None for r in rows), [r.note for r in rep.rows]
    from aotriton_rocm.tooling.builder.cache import CompileCache
    cache = CompileCache(tmp_path / "compiled")
    metas = [cache.get(k)[0] for k in _keys(cache)]
    assert len(metas) == 2
    for meta in metas:
        text_loop = dict(meta["stats"]["loop"])
        row = next(r for r in rows if r.shape.arch == meta["target"][1])
        dec_loop = dict(row.figures.loop)
        text_loop.pop("label"), dec_loop.pop("label")
        assert dec_loop == text_loop
    cfg = amd_config(aiter_wheel, shapes[0])
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]) == (128, 64, 4)
    assert rows[0].estimate is not None and rows[1].estimate is None  # the model is CDNA3's
    assert rows[0].figures.loop["mfma"] > 0


def _keys(cache):
    return [p.stem for p in cache.root.glob("*/*.json")]


def test_report_options():
    import argparse
    from aotriton_rocm.tooling.builder.static_report import ReportOptions, add_report_arguments
    p = add_report_arguments(argparse.ArgumentParser())
    o = ReportOptions.from_args(p.parse_args(["b", "--reference-wheel", "w.whl", "--reference-jobs", "2"]))
    assert o.reference and o.reference_wheel == Path("w.whl") and o.reference_jobs == 2
    o = ReportOptions.from_args(p.parse_args(["b", "--reference", "--reference-cache", "c"]))
    assert o.reference and o.reference_wheel is None and o.reference_cache == Path("c")
    assert not ReportOptions.from_args(p.parse_args(["b"])).reference


def test_fallback_is_our_kernel_at_amds_config(aiter_wheel):
    """Where AMD's kernel does not compile, ours is compiled at AMD's config:
    the tasks carry AMD's tiles, early V load and backend options."""
    pytest.importorskip("triton")
    from aotriton_rocm.tooling.builder.reference_compile import RefShape, amd_config
    from aotriton_rocm.tooling.builder.reference_report import _fallback_tasks
    fwd = RefShape("gfx942", "fwd", "bf16", 128, False)
    cfg = amd_config(aiter_wheel, fwd)
    ((kernel, task),) = _fallback_tasks(fwd, cfg, ROOT)
    cx, opts = dict(task.constexprs), dict(task.options)
    assert kernel == "attn_fwd" and (cx["BLOCK_M"], cx["BLOCK_N"]) == (cfg["BLOCK_M"], cfg["BLOCK_N"])
    assert cx["PRE_LOAD_V"] == cfg["PRELOAD_V"] and opts["waves_per_eu"] == cfg["waves_per_eu"]
    assert opts["num_warps"] == cfg["num_warps"] and "-amdcfg-" in task.cache_key
    bwd = RefShape("gfx950", "bwd", "fp16", 64, True)
    cfg = amd_config(aiter_wheel, bwd)
    tasks = dict(_fallback_tasks(bwd, cfg, ROOT))
    assert set(tasks) == {"attn_bwd_dkdv", "attn_bwd_dq"}
    dkdv, dq = dict(tasks["attn_bwd_dkdv"].constexprs), dict(tasks["attn_bwd_dq"].constexprs)
    assert (dkdv["BLOCK_M"], dkdv["BLOCK_N"]) == (cfg["BLOCK_M1"], cfg["BLOCK_N1"])
    assert (dq["BLOCK_M"], dq["BLOCK_N"]) == (cfg["BLOCK_M2"], cfg["BLOCK_N2"])
    assert dict(tasks["attn_bwd_dq"].options)["matrix_instr_nonkdim"] == cfg["matrix_instr_nonkdim"]
