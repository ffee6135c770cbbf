"""benchmarks/sustained_power.py on the CPU: how it reads nvidia-smi's
samples and how it refuses to run without an NVIDIA GPU (the run itself
needs one; the H100 figures are in docs/BUILD.md, "Speed limits")."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import sustained_power as P  # noqa: E402

LOG = """\
2026/11/25 00:59:01.100, 120.50 W, 1980 MHz, 0x0000000000000000
2026/11/25 00:59:01.200, 690.10 W, 1605 MHz, 0x0000000000000004
2026/11/25 00:59:01.300, [N/A], 1590 MHz, 0x0000000000000004
2026/11/25 00:59:01.400, 701.00 W, 1575 MHz, 0x0000000000000004
2026/11/25 00:59:01.500, 300.00 W, 1980 MHz, 0x0000000000000000
"""


def _at(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()


def test_samples_inside_the_span_only_and_unreadable_power_skipped(tmp_path):
    log = tmp_path / "smi.csv"
    log.write_text(LOG)
    rows = P.samples_between(log, _at("2026/11/25 00:59:01.150"), _at("2026/11/25 00:59:01.450"))
    assert rows == [(690.1, 1605.0, "0x0000000000000004"), (701.0, 1575.0, "0x0000000000000004")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_a_gpu(capsys):
    assert P.main(["--seconds", "2"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
