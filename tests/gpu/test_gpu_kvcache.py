"""flash_attn_with_kvcache, paged flash_attn_varlen_func and torch's
_flash_attention_forward with seqused_k / block_table / num_splits on a real
GPU (the H100 via the sm_90 target), against the float32 reference of
support/kvcache_reference.py (the cache gathered position by position, masks
explicit): dense and paged caches (pages of 16, 32, 48, 256), cache_batch_idx,
leftpad, the append (cache contents checked), rotary, causal/window/softcap/
ALiBi, GQA, decode (Sq = 1) and chunks (Sq > 1), splits 1 / 3 / automatic,
CUDA-graph replays. Skipped without a GPU or an installed image for its arch."""

from __future__ import annotations


import pytest
import torch

import aotriton_rocm
from support import kvcache_reference as ref
from aotriton_rocm.core import backends
from support import gpu
from support.gpu import ours as _ours  # noqa: E402

pytestmark = pytest.mark.gpu


ATOL = {torch.float16: 4e-3, torch.bfloat16: 2.4e-2}


def _rand(*shape, dtype=torch.float16, gen):
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


def _gen(seed):
    return torch.Generator("cuda").manual_seed(seed)


def _paged(dense_k, dense_v, page, gen):
    b, s, hk, d = dense_k.shape
    per = -(-s // page)
    total = b * per + 5
    table = torch.randperm(total, device="cuda", generator=gen)[:b * per].reshape(b, per).int()
    k = _rand(total, page, hk, d, dtype=dense_k.dtype, gen=gen)
    v = _rand(total, page, hk, d, dtype=dense_k.dtype, gen=gen)
    padded = per * page
    src_k = torch.zeros(b, padded, hk, d, dtype=dense_k.dtype, device="cuda")
    src_v = torch.zeros_like(src_k)
    src_k[:, :s], src_v[:, :s] = dense_k, dense_v
    k[table.long()] = src_k.view(b, per, page, hk, d)
    v[table.long()] = src_v.view(b, per, page, hk, d)
    return k, v, table


def _check(out, lse, want, want_lse, dtype):
    assert torch.isfinite(out).all()
    err = (out.float() - want).abs().max().item()
    assert err <= ATOL[dtype], err
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    if finite.any():
        assert (lse[finite] - want_lse[finite]).abs().max().item() <= 2e-3


# (dtype, D, B, Sq, H, Hk, cache_len, page, causal, window, softcap, alibi, splits)
CASES = [
    (torch.float16, 128, 8, 1, 32, 8, 8192, None, False, (-1, -1), 0.0, False, 0),
    (torch.bfloat16, 128, 1, 1, 32, 8, 8192, 256, False, (-1, -1), 0.0, False, 0),
    (torch.float16, 128, 2, 1, 32, 8, 4000, 16, True, (-1, -1), 0.0, False, 3),
    (torch.float16, 64, 3, 64, 8, 1, 3000, 48, True, (-1, -1), 0.0, False, 0),
    (torch.bfloat16, 72, 2, 17, 6, 2, 1500, 32, False, (100, 0), 30.0, True, 1),
    (torch.float16, 256, 2, 5, 4, 4, 2000, None, True, (-1, -1), 0.0, True, 3),
    (torch.float16, 64, 4, 300, 16, 4, 1200, 256, True, (-1, -1), 0.0, False, 0),
    (torch.bfloat16, 128, 2, 1, 8, 8, 20000, None, False, (512, -1), 0.0, False, 0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_kvcache_matches_reference(case):
    dtype, d, b, sq, h, hk, cache_len, page, causal, window, softcap, alibi, splits = case
    gen = _gen(d + sq + cache_len)
    q = _rand(b, sq, h, d, dtype=dtype, gen=gen)
    dense_k = _rand(b, cache_len, hk, d, dtype=dtype, gen=gen)
    dense_v = _rand(b, cache_len, hk, d, dtype=dtype, gen=gen)
    seqlens = torch.randint(1, cache_len + 1, (b,), device="cuda", generator=gen).int()
    seqlens[0] = cache_len
    slopes = torch.rand(b, h, device="cuda", generator=gen) * 0.1 if alibi else None
    kw = dict(cache_seqlens=seqlens, causal=causal, window_size=window, softcap=softcap,
              alibi_slopes=slopes, num_splits=splits, return_softmax_lse=True)
    if page is None:
        k_cache, v_cache, table = dense_k, dense_v, None
        leftpad = torch.minimum(torch.randint(0, 50, (b,), device="cuda", generator=gen).int(),
                                seqlens - 1)
        kw["cache_leftpad"] = leftpad
    else:
        k_cache, v_cache, table = _paged(dense_k, dense_v, page, gen)
        leftpad = None
        kw["block_table"] = table
    backends.reset_launch_counts()
    out, lse = aotriton_rocm.flash_attn_with_kvcache(q, k_cache, v_cache, **kw)
    torch.cuda.synchronize()
    assert _ours("attn_fwd_kvcache") == 1
    if splits > 1:
        assert _ours("attn_fwd_kvcache_combine") == 1
    want, want_lse = ref.attention_fast(q, dense_k, dense_v, seqlens, k_start=leftpad,
                                        alibi_slopes=slopes, causal=causal, window=window,
                                        softcap=softcap)
    _check(out, lse, want, want_lse, dtype)


def test_auto_splits_on_this_gpu():
    cus = torch.cuda.get_device_properties(0).multi_processor_count
    gen = _gen(1)
    q = _rand(1, 1, 32, 128, gen=gen)
    kc = _rand(1, 8192, 8, 128, gen=gen)
    backends.reset_launch_counts()
    out = aotriton_rocm.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=8192)
    torch.cuda.synchronize()
    # 8 programs leave most of `cus` compute units idle: the runtime splits
    assert 8 * 5 < cus * 4 and _ours("attn_fwd_kvcache_combine") == 1
    want, _ = ref.attention_fast(q, kc, kc, torch.tensor([8192]))
    assert (out.float() - want).abs().max() <= 4e-3


@pytest.mark.parametrize("page", [None, 16, 256])
@pytest.mark.parametrize("interleaved", [True, False])
def test_append_with_rotary(page, interleaved):
    d, b, sq, h, hk, new = 128, 3, 4, 16, 4, 4
    gen = _gen(7 + int(interleaved))
    cap = 1024
    q = _rand(b, sq, h, d, gen=gen)
    k_new, v_new = _rand(b, new, hk, d, gen=gen), _rand(b, new, hk, d, gen=gen)
    angles = torch.rand(cap, 32, device="cuda", generator=gen) * 6.28
    cos, sin = angles.cos().half(), angles.sin().half()
    seqlens = torch.tensor([0, 500, 1019], dtype=torch.int32, device="cuda")
    dense_k, dense_v = _rand(b, cap, hk, d, gen=gen), _rand(b, cap, hk, d, gen=gen)
    if page is None:
        k_cache, v_cache, table = dense_k.clone(), dense_v.clone(), None
    else:
        k_cache, v_cache, table = _paged(dense_k, dense_v, page, gen)
    k0 = k_cache.clone()
    out = aotriton_rocm.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        block_table=table, causal=True, rotary_interleaved=interleaved)
    positions = seqlens.long()[:, None] + torch.arange(new, device="cuda")
    from aotriton_rocm.integrations.kvcache_api import apply_rotary
    k_rot = apply_rotary(k_new, cos, sin, positions, interleaved)
    q_rot = apply_rotary(q, cos, sin, seqlens.long()[:, None] + torch.arange(sq, device="cuda"),
                         interleaved)
    for bb in range(b):
        for i in range(new):
            p = int(positions[bb, i])
            slot = (bb, p) if table is None else (int(table[bb, p // page]), p % page)
            assert torch.equal(k_cache[slot], k_rot[bb, i])
            assert torch.equal(v_cache[slot], v_new[bb, i])
            k0[slot] = k_rot[bb, i]
    assert torch.equal(k_cache, k0)  # nothing else written
    # GPU rotary against the float64 loop reference
    want_rot = ref.rotate(k_new.cpu(), cos.cpu(), sin.cpu(), positions.cpu().tolist(), interleaved)
    assert (k_rot.cpu().double() - want_rot).abs().max() <= 4e-3
    want, _ = ref.attention_fast(q_rot, k_cache, v_cache, seqlens + new, block_table=table,
                                 causal=True)
    assert (out.float() - want).abs().max() <= 4e-3


@pytest.mark.parametrize("new", [1, 4])
@pytest.mark.parametrize("page", [None, 16])
def test_append_writes_the_new_rows(new, page):
    """k/v appended without rotary (dense caches take the two-op path): the
    new rows land at each batch's positions, nothing else changes, and the
    attention over the caches matches the reference."""
    d, b, h, hk, cap = 64, 3, 8, 2, 1024
    gen = _gen(11 + new)
    q = _rand(b, 1, h, d, gen=gen)
    k_new, v_new = _rand(b, new, hk, d, gen=gen), _rand(b, new, hk, d, gen=gen)
    seqlens = torch.tensor([0, 500, cap - new], dtype=torch.int32, device="cuda")
    dense_k, dense_v = _rand(b, cap, hk, d, gen=gen), _rand(b, cap, hk, d, gen=gen)
    if page is None:
        k_cache, v_cache, table = dense_k.clone(), dense_v.clone(), None
    else:
        k_cache, v_cache, table = _paged(dense_k, dense_v, page, gen)
    k0, v0 = k_cache.clone(), v_cache.clone()
    out = aotriton_rocm.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                                cache_seqlens=seqlens, block_table=table,
                                                causal=True)
    for bb in range(b):
        for i in range(new):
            p = int(seqlens[bb]) + i
            slot = (bb, p) if table is None else (int(table[bb, p // page]), p % page)
            k0[slot], v0[slot] = k_new[bb, i], v_new[bb, i]
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)
    want, _ = ref.attention_fast(q, k_cache, v_cache, seqlens + new, block_table=table,
                                 causal=True)
    assert (out.float() - want).abs().max() <= 4e-3


def test_decode_step_in_a_cuda_graph():
    gen = _gen(3)
    b, h, hk, d, cap = 4, 32, 8, 128, 4096
    q = _rand(b, 1, h, d, gen=gen)
    k_cache, v_cache = _rand(b, cap, hk, d, gen=gen), _rand(b, cap, hk, d, gen=gen)
    k_new, v_new = _rand(b, 1, hk, d, gen=gen), _rand(b, 1, hk, d, gen=gen)
    seqlens = torch.tensor([100, 2000, 4000, 7], dtype=torch.int32, device="cuda")
    call = lambda: aotriton_rocm.flash_attn_with_kvcache(  # noqa: E731
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens)
    eager = call()
    graph, captured = gpu.captured(call)
    seqlens += 1  # the next step: the graph reads the new lengths
    graph.replay()
    torch.cuda.synchronize()
    want, _ = ref.attention_fast(q, k_cache, v_cache, seqlens + 1)
    assert (captured.float() - want).abs().max() <= 4e-3
    assert not torch.equal(captured, eager)


def test_paged_varlen_func():
    gen = _gen(11)
    h, hk, d, page = 8, 2, 128, 32
    q_lens, k_lens = [1, 37, 200], [900, 37, 1500]
    cu_q = torch.tensor([0, 1, 38, 238], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 900, 937, 2437], dtype=torch.int32, device="cuda")
    q = _rand(sum(q_lens), h, d, gen=gen)
    dense_k, dense_v = _rand(3, 1500, hk, d, gen=gen), _rand(3, 1500, hk, d, gen=gen)
    k, v, table = _paged(dense_k, dense_v, page, gen)
    out, lse, _ = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 1500,
                                                       causal=True, return_attn_probs=True,
                                                       block_table=table)
    for bb in range(3):
        rows = slice(int(cu_q[bb]), int(cu_q[bb + 1]))
        want, want_lse = ref.attention_fast(q[rows][None], dense_k[bb:bb + 1], dense_v[bb:bb + 1],
                                            torch.tensor([k_lens[bb]]), causal=True)
        _check(out[rows][None], lse[:, rows][None], want, want_lse, torch.float16)


FA = torch.ops.aten._flash_attention_forward.default
HAS_PAGED = "block_table" in str(FA._schema)


@pytest.mark.parametrize("kind", ["dense_seqused", "varlen_seqused", "paged", "splits"])
def test_torch_op_runs_our_kernels(kind):
    if kind in ("paged", "splits") and not HAS_PAGED:
        pytest.skip(f"torch {torch.__version__}'s _flash_attention_forward has no "
                    "block_table / num_splits")
    gen = _gen(len(kind))
    b, sq, h, hk, d, sk = 2, 3, 8, 2, 64, 700
    q = _rand(b, sq, h, d, gen=gen)
    k, v = _rand(b, sk, hk, d, gen=gen), _rand(b, sk, hk, d, gen=gen)
    used = torch.tensor([700, 123], dtype=torch.int32, device="cuda")
    aotriton_rocm.enable()
    try:
        backends.reset_launch_counts()
        if kind == "dense_seqused":
            out, lse, *_ = FA(q, k, v, None, None, sq, sk, 0.0, True, False, seqused_k=used)
            want, want_lse = ref.attention_fast(q, k, v, used, causal=True)
        elif kind == "splits":
            out, lse, *_ = FA(q, k, v, None, None, sq, sk, 0.0, False, False, num_splits=4)
            want, want_lse = ref.attention_fast(q, k, v, torch.tensor([sk, sk]))
            assert _ours("attn_fwd_kvcache_combine") == 1
        elif kind == "paged":
            kc, vc, table = _paged(k, v, 256, gen)
            out, lse, *_ = FA(q, kc, vc, None, None, sq, sk, 0.0, True, False, seqused_k=used,
                              block_table=table)
            want, want_lse = ref.attention_fast(q, k, v, used, causal=True)
        else:
            cu_q = torch.tensor([0, sq, 2 * sq], dtype=torch.int32, device="cuda")
            cu_k = torch.tensor([0, sk, 2 * sk], dtype=torch.int32, device="cuda")
            out, lse, *_ = FA(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, sq,
                              sk, 0.0, True, False, seqused_k=used)
            out = out.view(b, sq, h, d)
            lse = lse.view(h, b, sq).transpose(0, 1)
            want, want_lse = ref.attention_fast(q, k, v, used, causal=True)
        torch.cuda.synchronize()
        assert _ours("attn_fwd_kvcache") == 1
        _check(out, lse, want, want_lse, torch.float16)
    finally:
        aotriton_rocm.disable()
