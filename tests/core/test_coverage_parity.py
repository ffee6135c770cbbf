"""attention.unsupported_reason, the Python route's verdict, against
aotr_attn_check alone over a grid of requests: Python asks the C core for the
shared rules and adds only torch's own checks (devices, masks, the
offsets' tensors) and the kernels' single head dim; over the grid the two
must accept the same requests and refuse the others with the same words."""

from __future__ import annotations

import itertools

import pytest
import torch

from aotriton_rocm.core import attention, native

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


class _AcceptsAll:
    """A backend whose images cover every variant: the grid judges the shared
    rules, not one backend's coverage."""

    def unsupported_reason(self, *args, **kwargs):
        return None


@pytest.fixture(autouse=True)
def _any_backend(monkeypatch):
    monkeypatch.setattr(attention, "backend_for", lambda t: _AcceptsAll())


def _c_reason(q, k, v, *, dropout_p=0.0, causal=False, varlen=None) -> str | None:
    cu = None if varlen is None else (varlen.cu_seqlens_q, varlen.cu_seqlens_k)
    seqlens = (0, 0) if varlen is None else (varlen.max_seqlen_q, varlen.max_seqlen_k)
    p = native.make_problem(q, k, v, scale=0.125, causal=causal, dropout_p=dropout_p,
                            cu_seqlens=cu, max_seqlens=seqlens)
    status = native.library().aotr_attn_check(p)
    return None if status == native.OK else native.error(status).message


def _cases():
    dense = []
    for dtype, d, (h, hk), p, (sq, sk) in itertools.product(
            (F16, BF16, F32, torch.int32), (1, 7, 8, 72, 512, 513), ((4, 2), (4, 3), (2, 2)),
            (0.0, 0.5, 1.0, -0.25), ((5, 9), (5, 0), (0, 9))):
        q = torch.empty(2, h, sq, d, dtype=dtype)
        k = torch.empty(2, hk, sk, d, dtype=dtype)
        dense.append((f"{dtype}-d{d}-h{h}/{hk}-p{p}-s{sq}/{sk}", q, k, k.clone(), p, None))
    q, k = torch.empty(2, 4, 5, 64, dtype=F16), torch.empty(3, 2, 9, 64, dtype=F16)
    dense.append(("batch-mismatch", q, k, k.clone(), 0.0, None))
    dense.append(("q-3d", q[0], k[0], k[0].clone(), 0.0, None))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    packed_q, packed_k = torch.empty(7, 4, 64, dtype=F16), torch.empty(7, 2, 64, dtype=F16)
    for name, cu_q, cu_k in (("varlen", cu, cu), ("varlen-lengths-differ", cu, cu[:2]),
                             ("varlen-int64", cu.long(), cu.long())):
        varlen = attention.Varlen(cu_q, cu_k, 4, 4)
        dense.append((name, packed_q, packed_k, packed_k.clone(), 0.0, varlen))
    return dense


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_python_and_c_agree(case):
    _, q, k, v, p, varlen = case
    py = attention.unsupported_reason(q, k, v, dropout_p=p, varlen=varlen)
    c = _c_reason(q, k, v, dropout_p=p, varlen=varlen)
    assert (py is None) == (c is None), (py, c)
    if py is not None:
        assert py == c
