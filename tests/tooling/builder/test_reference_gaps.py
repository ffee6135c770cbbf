"""The written reasons for the reference column's gaps
(tooling/builder/reference_gaps.py, kernels/tuning/gap-reasons.toml): a
figure below AMD's without a reason is flagged, one with a reason shows it,
in the text report and in its JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("elftools")

from aotriton_rocm.tooling.builder.reference_compile import RefShape  # noqa: E402
from aotriton_rocm.tooling.builder.reference_gaps import (METRICS, REASONS_FILE, ReasonsError, find_gaps,  # noqa: E402
                                                           load_reasons)
from aotriton_rocm.tooling.builder.reference_report import (ReferenceReport, RefRow, format_reference,  # noqa: E402
                                                            reference_json)
from aotriton_rocm.tooling.builder.report_model import Figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FWD = RefShape("gfx942", "fwd", "bf16", 128, False)
BWD = RefShape("gfx942", "bwd", "fp16", 64, False)


def _fig(occupancy: int, mfma: int, instructions: int, global_loads: int, ds_reads: int) -> Figures:
    loop = {"mfma": mfma, "instructions": instructions, "global_loads": global_loads, "ds_reads": ds_reads,
            "ds_writes": 0, "waitcnt": 0, "barriers": 0, "matrix_ops": {"v_mfma_f32_32x32x8_bf16": mfma}}
    return Figures(occupancy=occupancy, vgpr=128, agpr=0, registers=128, sgpr=40, lds=0, vgpr_spills=0,
                   sgpr_spills=0, scratch=0, loop=loop)


def _rows():
    return [
        # forward: occupancy 1 < 2, same mix otherwise
        RefRow(FWD, "ours", "attn_fwd", "128x64", _fig(1, 64, 64 + 400, 8, 32)),
        RefRow(FWD, "amd-triton", "_attn_fwd", "128x64 wpe2", _fig(2, 64, 64 + 400, 8, 32)),
        # backward dq loop: twice the global loads per MFMA; dkdv loop: level
        RefRow(BWD, "ours", "attn_bwd_dq", "64x32", _fig(2, 20, 20 + 100, 4, 10), loop="dq"),
        RefRow(BWD, "ours", "attn_bwd_dkdv", "32x64", _fig(2, 20, 20 + 100, 2, 10), loop="dkdv"),
        RefRow(BWD, "amd-triton", "bwd [dq loop]", "x", _fig(2, 20, 20 + 100, 2, 10), loop="dq"),
        RefRow(BWD, "amd-triton", "bwd [dkdv loop]", "x", _fig(2, 20, 20 + 100, 2, 10), loop="dkdv"),
    ]


def _reasons(tmp_path: Path, body: str):
    p = tmp_path / "reasons.toml"
    p.write_text(body, encoding="utf-8")
    return load_reasons(p)


REASON = """
[[reason]]
arch = "gfx942"
kernel = "attn_fwd"
dtypes = ["bf16"]
head_dims = [128]
metrics = ["occupancy"]
text = "waves_per_eu 1 in   the\\n shipped config"
"""


def test_gap_with_reason_shows_it_and_without_is_flagged(tmp_path):
    gaps = find_gaps(_rows(), _reasons(tmp_path, REASON))
    by_kernel = {g.kernel: g for g in gaps}
    assert set(by_kernel) == {"attn_fwd", "attn_bwd_dq"}  # the level dkdv loop is no gap
    fwd, dq = by_kernel["attn_fwd"], by_kernel["attn_bwd_dq"]
    assert [m for m, _ in fwd.worse] == ["occupancy"] and fwd.unexplained == []
    assert "  reason (occupancy): waves_per_eu 1 in the shipped config" in fwd.lines()
    assert [m for m, _ in dq.worse] == ["global_loads"] and dq.unexplained == ["global_loads"]
    assert dq.lines()[-1] == "  UNEXPLAINED: global loads"
    assert dq.to_json()["reasons"] == {"global_loads": None}
    assert fwd.to_json()["reasons"]["occupancy"].startswith("waves_per_eu 1")


def test_reason_must_match_arch_kernel_dtype_head_dim_and_figure(tmp_path):
    for wrong in ('arch = "gfx942"', 'dtypes = ["bf16"]', 'head_dims = [128]', 'metrics = ["occupancy"]'):
        other = {'arch = "gfx942"': 'arch = "gfx950"', 'dtypes = ["bf16"]': 'dtypes = ["fp16"]',
                 'head_dims = [128]': 'head_dims = [64]', 'metrics = ["occupancy"]': 'metrics = ["ds_reads"]'}[wrong]
        (fwd,) = [g for g in find_gaps(_rows(), _reasons(tmp_path, REASON.replace(wrong, other)))
                  if g.kernel == "attn_fwd"]
        assert fwd.unexplained == ["occupancy"], wrong


def test_report_text_and_json_carry_reasons(tmp_path):
    rep = ReferenceReport(wheel="amd_aiter-test.whl", rows=_rows(), reasons=_reasons(tmp_path, REASON))
    text = format_reference(rep)
    assert "reason (occupancy): waves_per_eu 1" in text and "UNEXPLAINED: global loads" in text
    assert "2 gap(s), 1 with unexplained figures" in text
    doc = reference_json(rep)
    assert [g["unexplained"] for g in doc["gaps"]] == [[], ["global_loads"]]


def test_a_shorter_buckets_kernel_is_a_gap_of_its_own_and_configs_narrow_a_reason(tmp_path):
    # the kernel shipped for short sequences: twice the global loads per MFMA
    bucket = RefRow(FWD, "ours", "attn_fwd", "64x64", _fig(2, 64, 64 + 400, 16, 32), bucket="q<=64")
    narrowed = REASON.replace('metrics = ["occupancy"]', 'metrics = ["occupancy", "global_loads"]\nconfigs = ["64x64"]')
    gaps = {g.config: g for g in find_gaps(_rows() + [bucket], _reasons(tmp_path, narrowed))}
    assert gaps["64x64"].text.startswith("gfx942 fwd bf16 d128 attn_fwd [q<=64] (64x64;")
    assert gaps["64x64"].unexplained == [] and gaps["64x64"].to_json()["bucket"] == "q<=64"
    # the open bucket's 128x64 is not among the reason's configs
    assert gaps["128x64"].unexplained == ["occupancy"]


@pytest.mark.parametrize("body, message", [
    (REASON.replace('metrics = ["occupancy"]', 'metrics = ["speed"]'), "unknown metric"),
    (REASON.replace('head_dims = [128]\n', ''), "lacks head_dims"),
    (REASON.replace('"waves_per_eu 1 in   the\\n shipped config"', '"  "'), "empty text"),
    ("[[reason]\n", "reasons.toml"),
])
def test_malformed_reasons_are_refused(tmp_path, body, message):
    with pytest.raises(ReasonsError, match=message):
        _reasons(tmp_path, body)


def test_checked_in_reasons_load_and_name_known_kernels():
    reasons = load_reasons(ROOT / "kernels" / REASONS_FILE)
    assert reasons, "kernels/tuning/gap-reasons.toml is empty or missing"
    for r in reasons:
        assert r.arch in ("gfx942", "gfx950", "gfx90a", "gfx908")
        assert r.kernel in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")
        assert set(r.metrics) <= set(METRICS) and set(r.dtypes) <= {"fp16", "bf16"}
        assert r.configs, f"{r.arch} {r.kernel}: name the configs the reason speaks of"
