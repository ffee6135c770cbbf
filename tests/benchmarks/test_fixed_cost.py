"""benchmarks/fixed_cost.py on the CPU: the line it fits and how it spreads
a call's fit over query blocks (the timing itself needs a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fixed_cost as FC  # noqa: E402


def test_line_fit_recovers_a_line_through_noise():
    xs = [1, 2, 4, 8, 16, 32]
    ys = [70.0 + 27.5 * x + (0.5 if i % 2 else -0.5) for i, x in enumerate(xs)]
    slope, intercept = FC.line_fit(xs, ys)
    assert slope == pytest.approx(27.5, abs=0.05)
    assert intercept == pytest.approx(70.0, abs=1.0)


def test_line_fit_needs_two_distinct_points():
    with pytest.raises(ValueError):
        FC.line_fit([4, 4], [1.0, 2.0])


def test_per_query_block_divides_by_the_waves():
    # 2048 query blocks on 128 multiprocessors: 16 in turn on each
    fit = FC.per_query_block(slope_us=32.0, intercept_us=80.0, query_blocks=2048, processors=128)
    assert fit == {"per_key_block_us": 2.0, "fixed_us": 5.0}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_without_a_gpu_it_says_so(capsys):
    assert FC.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
