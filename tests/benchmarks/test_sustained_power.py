"""benchmarks/sustained_power.py on the CPU: how it reads nvidia-smi's
samples and how it refuses to run without an NVIDIA GPU (the run itself
needs one; the H100 figures are in docs/PERFORMANCE-NOTEBOOK.md, "Speed limits")."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sustained_power as P  # noqa: E402

A = "GPU-1f6b2c1e-0000-4000-8000-00000000000a"
B = "GPU-1f6b2c1e-0000-4000-8000-00000000000b"
LOG = f"""\
2026/11/25 00:59:01.100, {A}, 120.50 W, 1980 MHz, 0x0000000000000000
2026/11/25 00:59:01.200, {A}, 690.10 W, 1605 MHz, 0x0000000000000004
2026/11/25 00:59:01.300, {A}, [N/A], 1590 MHz, 0x0000000000000004
2026/11/25 00:59:01.400, {A}, 701.00 W, 1575 MHz, 0x0000000000000004
2026/11/25 00:59:01.500, {A}, 300.00 W, 1980 MHz, 0x0000000000000000
"""
OTHER_GPU = f"""\
2026/11/25 00:59:01.200, {B}, 80.00 W, 345 MHz, 0x0000000000000001
2026/11/25 00:59:01.400, {B}, 81.00 W, 345 MHz, 0x0000000000000001
"""


def _at(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()


def test_samples_inside_the_span_only_and_unreadable_power_skipped(tmp_path):
    log = tmp_path / "smi.csv"
    log.write_text(LOG)
    rows = P.samples_between(P.read_samples(log), _at("2026/11/25 00:59:01.150"), _at("2026/11/25 00:59:01.450"))
    assert rows == [(690.1, 1605.0, "0x0000000000000004"), (701.0, 1575.0, "0x0000000000000004")]


def test_with_several_gpus_only_the_devices_samples(tmp_path):
    log = tmp_path / "smi.csv"
    log.write_text(LOG + OTHER_GPU)
    span = _at("2026/11/25 00:59:01.150"), _at("2026/11/25 00:59:01.450")
    # torch may give the uuid without nvidia-smi's "GPU-" prefix
    assert P.samples_between(P.read_samples(log, uuid=B.removeprefix("GPU-")), *span) == [
        (80.0, 345.0, "0x0000000000000001"), (81.0, 345.0, "0x0000000000000001")]
    assert len(P.samples_between(P.read_samples(log, uuid=A), *span)) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_a_gpu(capsys):
    assert P.main(["--seconds", "2"]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
