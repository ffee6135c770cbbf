"""The hot loop of real AMD kernels (tooling/builder/amdgcn.py): the flash kernels
compiled now for gfx942 and gfx908, their loops checked against LLVM's own
loop annotations in the same assembly text."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

pytest.importorskip("triton")

from aotriton_rocm.tooling.builder.amdgcn import LoopStats, find_loops, hot_loop, hot_loop_stats  # noqa: E402
from aotriton_rocm.tooling.builder.plan import Sources, Subset, plan_build  # noqa: E402
from aotriton_rocm.tooling.builder.triton_compile import COMPILE_ENV, compile_task, parse_amdgcn_stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PLAIN = "dtype=fp16,pad_head=false,has_bias=false,enable_dropout=false"
# (arch, --only): the forward at head dim 128 (the three CDNA candidates:
# 128x64, 64x64 and the 16x64 decoding tile), dK/dV at head dim 64 (a loop
# nest), the preprocess kernel (no loop)
SUBSETS = (("gfx942", f"kernel=attn_fwd,head_dim=128,{PLAIN}"),
           ("gfx908", f"kernel=attn_fwd,head_dim=128,{PLAIN}"),
           ("gfx942", f"kernel=attn_bwd_dkdv|attn_bwd_preprocess,head_dim=64,{PLAIN}"))
# configs with the AMD backend's options (and upstream's imported tiles, which carry them)
# are left out: the loops are checked on the plain candidates
AMD_OPTIONS = ("PRE_LOAD_V", "waves_per_eu", "matrix_instr_nonkdim", "kpack")


@pytest.fixture(scope="module")
def asm(tmp_path_factory) -> Dict[Tuple[str, str], str]:
    """(arch, variant key) -> amdgcn text, compiled as the build compiles."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set: kernels are not JIT functions")
    mp = pytest.MonkeyPatch()
    for name, value in COMPILE_ENV.items():
        mp.setenv(name, value)
    mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
    out = {}
    try:
        for arch, only in SUBSETS:
            plan = plan_build("6.4", [arch], Sources.find(ROOT), Subset.parse([only]))
            for v, task in plan.items[arch]:
                if not any(o in v.key for o in AMD_OPTIONS):
                    out[(arch, v.key)] = compile_task(task).asm["amdgcn"]
    finally:
        mp.undo()
    return out


def _one(asm, arch: str, kernel: str, config: str = "") -> str:
    (text,) = [t for (a, k), t in asm.items() if a == arch and k.startswith(kernel + "|") and config in k]
    return text


def llvm_loops(text: str) -> Dict[str, Dict]:
    """LLVM's loop annotations, read independently of amdgcn.py: per loop
    header label its depth, whether it is innermost, and for innermost
    loops the blocks marked as its members and the v_mfma lines in them.
    A block starts at a label or a ``; %bb.N:`` line; its annotation is the
    comment on that line and the comment-only lines right after it."""
    blocks: List[Tuple[str, str, List[str]]] = []  # (label, annotation, code lines)
    for line in text.splitlines():
        m = re.match(r"^(\.LBB\d+_\d+):|^; %bb\.\d+:", line)
        if m:
            blocks.append((m.group(1) or "", line.split(";", 1)[-1] if ";" in line else "", []))
        elif blocks and re.match(r"^\s*;", line) and not blocks[-1][2]:
            label, note, code = blocks[-1]
            blocks[-1] = (label, note + " " + line, code)
        elif blocks:
            blocks[-1][2].append(line)
    loops: Dict[str, Dict] = {}
    for label, note, code in blocks:
        h = re.search(r"(Inner )?Loop Header: Depth=(\d+)", note)
        member = re.search(r"in Loop: Header=BB(\d+_\d+)", note)
        key = label if h else f".LBB{member.group(1)}" if member else None
        if key is None:
            continue
        d = loops.setdefault(key, {"blocks": 0, "mfma": 0})
        if h:
            d.update(depth=int(h.group(2)), innermost=bool(h.group(1)))
        d["blocks"] += 1
        d["mfma"] += sum(1 for c in code if re.match(r"^\s+v_mfma", c))
    return loops


def test_loops_match_llvm_annotations(asm):
    assert len(asm) == 8
    for (arch, key), text in asm.items():
        ref = llvm_loops(text)
        loops = find_loops(text)
        assert {lp.label: (lp.depth, lp.innermost) for lp in loops} == \
            {h: (d["depth"], d["innermost"]) for h, d in ref.items()}, (arch, key)
        for lp in loops:
            if lp.innermost:  # LLVM marks an outer loop's direct blocks only
                assert (lp.blocks, lp.mfma) == (ref[lp.label]["blocks"], ref[lp.label]["mfma"]), (arch, key)


def test_forward_hot_loop(asm):
    for arch in ("gfx942", "gfx908"):
        for config in ("BLOCK_M=128,BLOCK_N=64", "BLOCK_M=64,BLOCK_N=64"):
            text = _one(asm, arch, "attn_fwd", config)
            loops = find_loops(text)
            # the full-tile loop and the masked (boundary/causal) loop: same dots,
            # the masked one has more instructions; the hot loop is the lean one
            assert len(loops) == 2 and all(lp.depth == 1 and lp.innermost for lp in loops)
            full, masked = sorted(loops, key=lambda lp: lp.instructions)
            assert full.mfma == masked.mfma > 0 and hot_loop(loops) == full
            assert full.global_loads > 0 and full.ds_reads > 0 and full.waitcnt > 0
            # every matrix op is a 32x32x8 fp16 MFMA (8192 multiply-adds)
            (op,) = full.matrix_ops
            assert re.fullmatch(r"v_mfma_f32_32x32x8_?f16", op) and full.matrix_ops[op] == full.mfma
        # 128x64 at head dim 128: each of the 4 waves does a quarter of
        # QK^T (128x64x128) and PV (128x128x64) in one iteration, no more
        big = hot_loop(find_loops(_one(asm, arch, "attn_fwd", "BLOCK_M=128,BLOCK_N=64")))
        assert big.mfma * 32 * 32 * 8 * 4 == 2 * 128 * 64 * 128
        # the single-block loop body: every v_mfma between its label and the
        # branch back to it
        text = _one(asm, arch, "attn_fwd", "BLOCK_M=128,BLOCK_N=64")
        body = re.search(re.escape(big.label) + r":(.*?)\n\s+s_cbranch_\w+ " + re.escape(big.label) + r"\n",
                         text, re.S).group(1)
        assert big.blocks == 1 and len(re.findall(r"^\s+v_mfma", body, re.M)) == big.mfma


def test_loop_nest_and_no_loop(asm):
    loops = find_loops(_one(asm, "gfx942", "attn_bwd_dkdv"))
    outer = [lp for lp in loops if not lp.innermost]
    inner = [lp for lp in loops if lp.innermost]
    # one loop over the key blocks' row blocks, with two inner loops (full, masked)
    assert len(outer) == 1 and outer[0].depth == 1 and [lp.depth for lp in inner] == [2, 2]
    assert outer[0].mfma == sum(lp.mfma for lp in inner)  # the outer body holds both
    hot = hot_loop(loops)
    assert hot in inner and hot.mfma > 0 and hot.instructions == min(lp.instructions for lp in inner)
    stats = hot_loop_stats(_one(asm, "gfx942", "attn_bwd_dkdv"))
    assert stats["loops"] == 3 and stats["mfma"] == hot.mfma and stats["depth"] == 2
    # the elementwise preprocess kernel has no loop
    pre = _one(asm, "gfx942", "attn_bwd_preprocess")
    assert find_loops(pre) == [] and hot_loop_stats(pre) is None
    assert parse_amdgcn_stats(pre)["loop"] is None


def test_compile_stats_carry_the_hot_loop(asm):
    text = _one(asm, "gfx942", "attn_fwd", "BLOCK_M=128,BLOCK_N=64")
    stats = parse_amdgcn_stats(text)
    hot = hot_loop(find_loops(text))
    assert stats["loop"]["mfma"] == hot.mfma and stats["loop"]["label"] == hot.label
    assert stats["loop"]["loops"] == 2 and stats["mfma"] is True


def test_synthetic_rotated_loop():
    # a loop entered in the middle (latch block above the header), as LLVM
    # lays out rotated loops, plus a forward branch that is no loop
    text = """
k:
\ts_mov_b32 s0, 0
\ts_cbranch_scc1 .LBB0_9
\ts_branch .LBB0_2
.LBB0_1:
\tv_mfma_f32_32x32x8_f16 a[0:15], v[0:1], v[2:3], a[0:15]
\tds_read_b128 v[4:7], v8
.LBB0_2:
\tglobal_load_dwordx4 v[0:3], v[10:11], off
\ts_waitcnt vmcnt(0)
\ts_cmp_lt_i32 s0, s1
\ts_cbranch_scc1 .LBB0_1
.LBB0_9:
\ts_endpgm
"""
    (lp,) = find_loops(text)
    assert isinstance(lp, LoopStats)
    assert (lp.label, lp.depth, lp.blocks, lp.instructions) == (".LBB0_2", 1, 2, 6)
    assert (lp.mfma, lp.ds_reads, lp.global_loads, lp.waitcnt) == (1, 1, 1, 1)
