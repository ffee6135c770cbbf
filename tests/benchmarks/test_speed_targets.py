"""benchmarks/speed_targets.py: which checks apply to a cell, how a report's
ratios are judged, and its exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import speed_targets as T  # noqa: E402


def _row(head_dim, seqlen, fwd, bwd, label="standard", causal=False, dtype="bf16"):
    """A report row: ours at 100 TFLOP/s; FLASH and CUDNN such that ours /
    FLASH = fwd[0] (and bwd) and ours / CUDNN = fwd[1]."""
    return {"shape": {"label": label, "head_dim": head_dim, "seqlen_q": seqlen, "seqlen_k": seqlen,
                      "causal": causal, "dtype": dtype},
            "tflops": {"fwd": {"aotriton-rocm": 100.0, "FLASH": 100.0 / fwd[0], "CUDNN": 100.0 / fwd[1]},
                       "bwd": {"aotriton-rocm": 100.0, "FLASH": 100.0 / bwd}}}


def test_the_checks_of_a_cell():
    assert [(c.pass_name, c.peer, c.target) for c in T.checks_for(256, 1024)] == [
        ("fwd", "FLASH", 1.0), ("bwd", "FLASH", 1.0)]
    assert [(c.pass_name, c.peer, c.target) for c in T.checks_for(128, 2048)] == [
        ("fwd", "FLASH", 1.0), ("bwd", "FLASH", 1.2), ("fwd", "CUDNN", 0.85)]
    # the whole standard grid: 2 dtypes x 3 head dims x 2 masks x 6 lengths, 176 checks
    n = sum(len(T.checks_for(d, s)) for d in (64, 128, 256) for s in (512, 1024, 2048, 4096, 8192, 16384))
    assert 2 * 2 * n == 176


def test_a_report_judged(tmp_path, capsys):
    rows = [_row(64, 1024, (1.1, 0.5), 1.05),        # short: no CUDNN check, 1.0x backward suffices
            _row(128, 4096, (1.3, 0.84), 1.19),      # below: CUDNN 0.84 and backward 1.19
            _row(128, 4096, (1.3, 0.9), 1.3, label="decode")]  # not a standard shape: not judged
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"meta": {}, "rows": rows}))
    assert T.main([str(report)]) == 1
    out = capsys.readouterr().out
    assert "3 of 5 checks met" in out
    assert "below: bf16 head dim 128 S=4096 full fwd / CUDNN 0.8400 < 0.85" in out
    assert "below: bf16 head dim 128 S=4096 full bwd / FLASH 1.1900 < 1.2" in out
    assert "| 128 | no | 4096 | 1.30 | 0.84! | 1.19! |" in out


def test_a_missing_figure_is_below_target(tmp_path, capsys):
    row = _row(256, 512, (1.2, 0.6), 1.1)
    del row["tflops"]["bwd"]["aotriton-rocm"]  # e.g. the cell fell back to torch's kernel
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"meta": {}, "rows": [row]}))
    assert T.main([str(report)]) == 1
    assert "bwd / FLASH no figure" in capsys.readouterr().out


def test_all_met(tmp_path, capsys):
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"meta": {}, "rows": [_row(64, 16384, (1.5, 0.9), 1.3)]}))
    assert T.main([str(report)]) == 0
    assert "3 of 3 checks met" in capsys.readouterr().out
