"""benchmarks/bench_attention.py on the CPU: which passes it times (the
timing itself needs a GPU) and how it refuses a bad --passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_attention as B  # noqa: E402


def _counting_attend():
    calls = []

    def attend(q, k, v):
        calls.append(torch.is_grad_enabled())
        return F.scaled_dot_product_attention(q, k, v)
    return attend, calls


def _inputs():
    q, k, v = (torch.randn(1, 2, 8, 16, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(1, 2, 8, 16)


def test_forward_only_builds_no_graph():
    attend, calls = _counting_attend()
    fns = B.pass_fns(attend, *_inputs(), passes=("fwd",))
    assert list(fns) == ["fwd"] and calls == []
    fns["fwd"]()
    assert calls == [False]  # under no_grad


def test_all_passes_in_order_and_bwd_replays_one_graph():
    attend, calls = _counting_attend()
    fns = B.pass_fns(attend, *_inputs())
    assert list(fns) == list(B.PASSES) and calls == [True]  # the graph bwd replays
    fns["bwd"]()
    fns["bwd"]()  # retained: a second replay works, with no new forward
    assert calls == [True]
    fns["fwd+bwd"]()
    assert calls == [True, True]


@pytest.mark.parametrize("passes", ["fwd,xyz", ""])
def test_bad_passes_are_refused(passes, capsys):
    with pytest.raises(SystemExit) as exc:
        B.main(["--passes", passes])
    assert exc.value.code == 2 and "--passes" in capsys.readouterr().err
