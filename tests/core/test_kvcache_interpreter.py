"""aotriton_rocm.flash_attn_with_kvcache (and the KV-cache kernels behind it)
on CPU tensors, run by Triton's interpreter, against the float64 reference of
support/kvcache_reference.py, which gathers every key from the cache position by
position and writes the masks, softcap and ALiBi out: dense and paged caches
(page sizes 16, 32, 48, 256), cache_batch_idx, cache_leftpad, the append of
new keys/values (the caches' contents checked afterwards), rotary (GPT-J and
GPT-NeoX), causal/window/softcap/ALiBi, GQA/MQA, Sq = 1 and Sq > 1, 1, 3 and
automatic splits, the logsumexp; and the refusals of bad input."""

from __future__ import annotations

import math

import pytest
import torch

import aotriton_rocm
from support import kvcache_reference as ref
from aotriton_rocm.core import backends

pytest.importorskip("triton", reason="the CPU backend runs kernels in Triton's interpreter")

ATOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _paged(dense_k, dense_v, page, gen, spare_blocks=3):
    """The dense (B, S, Hk, D) caches as paged ones: their pages in a
    shuffled order among spare blocks of noise; returns (k_cache, v_cache,
    block_table)."""
    b, s, hk, d = dense_k.shape
    per = -(-s // page)
    total = b * per + spare_blocks
    table = torch.randperm(total, generator=gen)[:b * per].reshape(b, per).to(torch.int32)
    caches = []
    for dense in (dense_k, dense_v):
        cache = torch.randn(total, page, hk, d, generator=gen).to(dense.dtype)
        for bb in range(b):
            for p in range(per):
                chunk = dense[bb, p * page:(p + 1) * page]
                cache[int(table[bb, p]), :chunk.shape[0]] = chunk
        caches.append(cache)
    return caches[0], caches[1], table


def _check(out, lse, want, want_lse, dtype):
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    err = (out.double() - want).abs().max().item()
    assert err <= ATOL[dtype], err
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - want_lse[finite]).abs().max().item() <= 1e-4 if finite.any() else True
    assert (lse[~finite] == math.inf).all()


# (dtype, D, B, Sq, H, Hk, cache_len, causal, window, softcap, alibi, splits)
DENSE = [
    (torch.float16, 64, 3, 1, 4, 2, 150, False, (-1, -1), 0.0, None, 1),
    (torch.float16, 64, 3, 1, 4, 2, 150, False, (-1, -1), 0.0, None, 3),
    (torch.bfloat16, 128, 2, 5, 8, 1, 97, True, (-1, -1), 0.0, None, 0),
    (torch.float16, 72, 2, 3, 6, 2, 130, False, (4, 0), 5.0, "heads", 3),
    (torch.bfloat16, 256, 2, 1, 2, 2, 70, False, (-1, -1), 0.0, "batch_heads", 3),
    (torch.float16, 32, 2, 7, 4, 4, 40, True, (9, -1), 2.0, "heads", 1),
    (torch.float16, 16, 1, 20, 2, 1, 12, True, (-1, -1), 0.0, None, 2),  # rows that see no key
]


@pytest.mark.parametrize("case", DENSE, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_dense_cache(case):
    dtype, d, b, sq, h, hk, cache_len, causal, window, softcap, alibi, splits = case
    gen = _gen(d + 31 * sq + cache_len)
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    rows = b + 2
    k_cache = torch.randn(rows, cache_len + 8, hk, d, generator=gen).to(dtype)
    v_cache = torch.randn(rows, cache_len + 8, hk, d, generator=gen).to(dtype)
    seqlens = torch.randint(1, cache_len + 1, (b,), generator=gen, dtype=torch.int32)
    seqlens[0] = cache_len
    batch_idx = torch.randperm(rows, generator=gen)[:b].to(torch.int32)
    leftpad = torch.minimum(torch.randint(0, 9, (b,), generator=gen, dtype=torch.int32), seqlens - 1)
    slopes = None
    if alibi == "heads":
        slopes = torch.rand(h, generator=gen) * 0.5
    elif alibi == "batch_heads":
        slopes = torch.rand(b, h, generator=gen) * 0.5
    before = k_cache.clone()
    backends.reset_launch_counts()
    out, lse = aotriton_rocm.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, cache_batch_idx=batch_idx,
        cache_leftpad=leftpad, causal=causal, window_size=window, softcap=softcap,
        alibi_slopes=slopes, num_splits=splits, return_softmax_lse=True)
    want, want_lse = ref.attention(q, k_cache, v_cache, seqlens, k_start=leftpad,
                                   cache_batch_idx=batch_idx, alibi_slopes=slopes, causal=causal,
                                   window=window, softcap=softcap)
    _check(out, lse, want, want_lse, dtype)
    assert torch.equal(k_cache, before)  # no k/v: the caches are only read
    counts = backends.launch_counts()
    assert counts[("interpreter:cpu", "attn_fwd_kvcache")] == 1
    combined = counts.get(("interpreter:cpu", "attn_fwd_kvcache_combine"), 0)
    assert combined == (0 if splits == 1 else combined)
    if splits > 1:
        assert combined == 1


# (dtype, D, B, Sq, H, Hk, page, causal, splits)
PAGED = [
    (torch.float16, 64, 2, 1, 4, 2, 16, False, 3),
    (torch.bfloat16, 64, 2, 4, 4, 1, 32, True, 1),
    (torch.float16, 128, 3, 1, 8, 2, 48, False, 0),
    (torch.float16, 40, 2, 6, 2, 2, 48, True, 3),
    (torch.bfloat16, 64, 2, 2, 4, 2, 256, True, 3),
]


@pytest.mark.parametrize("case", PAGED, ids=lambda c: "-".join(map(str, c)).replace("torch.", ""))
def test_paged_cache(case):
    dtype, d, b, sq, h, hk, page, causal, splits = case
    gen = _gen(page + d + sq)
    cache_len = 300
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    dense_k = torch.randn(b, cache_len, hk, d, generator=gen).to(dtype)
    dense_v = torch.randn(b, cache_len, hk, d, generator=gen).to(dtype)
    k_cache, v_cache, table = _paged(dense_k, dense_v, page, gen)
    seqlens = torch.tensor([cache_len, 1 + cache_len // 3, 77][:b], dtype=torch.int32)
    out, lse = aotriton_rocm.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=causal,
        num_splits=splits, return_softmax_lse=True)
    want, want_lse = ref.attention(q, k_cache, v_cache, seqlens, block_table=table, causal=causal)
    _check(out, lse, want, want_lse, dtype)
    # the same keys read from the dense cache: the same attention
    want_dense, _ = ref.attention(q, dense_k, dense_v, seqlens, causal=causal)
    assert torch.allclose(want, want_dense)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_append_with_rotary(paged, interleaved, causal):
    dtype, d, b, sq, h, hk, new = torch.float16, 64, 2, 3, 4, 2, 3
    gen = _gen(int(paged) * 4 + int(interleaved) * 2 + int(causal))
    cache_len, rot_half = 96, 16
    q = torch.randn(b, sq, h, d, generator=gen).to(dtype)
    k_new = torch.randn(b, new, hk, d, generator=gen).to(dtype)
    v_new = torch.randn(b, new, hk, d, generator=gen).to(dtype)
    angles = torch.rand(cache_len + 8, rot_half, generator=gen) * 6.28
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    seqlens = torch.tensor([40, 77], dtype=torch.int32)
    batch_idx = None
    if paged:
        k_cache = torch.randn(12, 16, hk, d, generator=gen).to(dtype)
        v_cache = torch.randn(12, 16, hk, d, generator=gen).to(dtype)
        table = torch.randperm(12, generator=gen)[:12].reshape(2, 6).to(torch.int32)
    else:
        k_cache = torch.randn(3, cache_len, hk, d, generator=gen).to(dtype)
        v_cache = torch.randn(3, cache_len, hk, d, generator=gen).to(dtype)
        table = None
        batch_idx = torch.tensor([2, 0], dtype=torch.int32)
    k0, v0 = k_cache.clone(), v_cache.clone()
    out = aotriton_rocm.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        cache_batch_idx=batch_idx, block_table=table, causal=causal,
        rotary_interleaved=interleaved, num_splits=2)
    positions = [[int(seqlens[bb]) + i for i in range(new)] for bb in range(b)]
    k_rot = ref.rotate(k_new, cos, sin, positions, interleaved)
    q_pos = [[int(seqlens[bb]) + (i if causal else 0) for i in range(sq)] for bb in range(b)]
    q_rot = ref.rotate(q, cos, sin, q_pos, interleaved).to(dtype)
    # the caches: the new rows where they belong, everything else untouched
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for bb in range(b):
        for i, p in enumerate(positions[bb]):
            if paged:
                slot = (int(table[bb, p // 16]), p % 16)
            else:
                slot = (int(batch_idx[bb]), p)
            written[slot] = True
            assert torch.allclose(k_cache[slot].double(), k_rot[bb, i], atol=2e-3, rtol=1e-3)
            assert torch.equal(v_cache[slot], v_new[bb, i])
    assert torch.equal(k_cache[~written], k0[~written]) and torch.equal(v_cache[~written], v0[~written])
    want, _ = ref.attention(q_rot, k_cache, v_cache, seqlens + new, cache_batch_idx=batch_idx,
                            block_table=table, causal=causal)
    assert (out.double() - want).abs().max().item() <= 4e-3


@pytest.mark.parametrize("new", [1, 2])
@pytest.mark.parametrize("sliced", [False, True], ids=["contiguous", "sliced"])
def test_append_lands_where_it_belongs(new, sliced):
    """k/v appended in place: the one-copy path over merged (row, position)
    rows, and a sliced cache whose rows cannot merge (index_put_); every
    other cache entry untouched."""
    gen = _gen(new + 2 * int(sliced))
    b, hk, d, cap = 2, 2, 64, 48
    full = torch.randn(b, cap + 16 * int(sliced), hk, d, generator=gen).half()
    k_cache = full[:, :cap]
    v_cache = torch.randn(b, cap, hk, d, generator=gen).half()
    k0, v0 = k_cache.clone(), v_cache.clone()
    k_new = torch.randn(b, new, hk, d, generator=gen).half()
    v_new = torch.randn(b, new, hk, d, generator=gen).half()
    seqlens = torch.tensor([5, 30], dtype=torch.int32)
    q = torch.randn(b, 1, 4, d, generator=gen).half()
    aotriton_rocm.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens)
    written = torch.zeros(b, cap, dtype=torch.bool)
    for bb in range(b):
        rows = slice(int(seqlens[bb]), int(seqlens[bb]) + new)
        written[bb, rows] = True
        assert torch.equal(k_cache[bb, rows], k_new[bb]) and torch.equal(v_cache[bb, rows], v_new[bb])
    assert torch.equal(k_cache[~written], k0[~written]) and torch.equal(v_cache[~written], v0[~written])


def test_rotary_dim_below_head_dim_keeps_the_rest():
    gen = _gen(5)
    x = torch.randn(1, 2, 3, 32, generator=gen).to(torch.float16)
    angles = torch.rand(10, 4, generator=gen)
    from aotriton_rocm.integrations.kvcache_api import apply_rotary
    got = apply_rotary(x, angles.cos(), angles.sin(), torch.tensor([[3, 7]]), True)
    assert torch.equal(got[..., 8:], x[..., 8:])
    want = ref.rotate(x, angles.cos(), angles.sin(), [[3, 7]], True)
    assert torch.allclose(got.double(), want, atol=2e-3)


def test_default_seqlens_and_int_seqlens():
    gen = _gen(9)
    q = torch.randn(2, 1, 2, 32, generator=gen).half()
    kc = torch.randn(2, 50, 1, 32, generator=gen).half()
    vc = torch.randn(2, 50, 1, 32, generator=gen).half()
    full = aotriton_rocm.flash_attn_with_kvcache(q, kc, vc)
    want, _ = ref.attention(q, kc, vc, torch.tensor([50, 50]))
    assert (full.double() - want).abs().max() <= 2e-3
    part = aotriton_rocm.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=17)
    want, _ = ref.attention(q, kc, vc, torch.tensor([17, 17]))
    assert (part.double() - want).abs().max() <= 2e-3


def test_auto_splits():
    # a long cache and few programs: the runtime splits (on the host's 8
    # compute units) and the combine merges the splits
    gen = _gen(11)
    q = torch.randn(1, 1, 2, 64, generator=gen).half()
    kc = torch.randn(1, 600, 1, 64, generator=gen).half()
    vc = torch.randn(1, 600, 1, 64, generator=gen).half()
    backends.reset_launch_counts()
    out = aotriton_rocm.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=600)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd_kvcache_combine")] == 1
    want, _ = ref.attention(q, kc, vc, torch.tensor([600]))
    assert (out.double() - want).abs().max() <= 2e-3


def _base(**kw):
    gen = _gen(3)
    args = dict(q=torch.randn(2, 1, 4, 64, generator=gen).half(),
                k_cache=torch.randn(4, 32, 2, 64, generator=gen).half(),
                v_cache=torch.randn(4, 32, 2, 64, generator=gen).half())
    args.update(kw)
    return args


@pytest.mark.parametrize("kw, message", [
    (dict(k_cache=torch.zeros(4, 40, 2, 64).half(), v_cache=torch.zeros(4, 40, 2, 64).half(),
          block_table=torch.zeros(2, 2, dtype=torch.int32)), "multiple of 16"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int32),
          cache_batch_idx=torch.zeros(2, dtype=torch.int32)), "cache_batch_idx cannot be used"),
    (dict(block_table=torch.zeros(2, 2, dtype=torch.int64)), "int32"),
    (dict(q=torch.zeros(2, 4, 64).half()), "4-D"),
    (dict(k=torch.zeros(2, 1, 2, 64).half(), cache_seqlens=3), "given together"),
    (dict(k=torch.zeros(2, 1, 2, 64).half(), v=torch.zeros(2, 1, 2, 64).half()), "cache_seqlens"),
    (dict(k=torch.zeros(2, 1, 3, 64).half(), v=torch.zeros(2, 1, 3, 64).half(), cache_seqlens=3),
     "nheads_k"),
    (dict(q=torch.zeros(2, 1, 4, 264).half(), k_cache=torch.zeros(4, 32, 2, 264).half(),
          v_cache=torch.zeros(4, 32, 2, 264).half()), "head_dim 264"),
    (dict(q=torch.zeros(2, 1, 4, 64), k_cache=torch.zeros(4, 32, 2, 64),
          v_cache=torch.zeros(4, 32, 2, 64)), "fp16 and bf16"),
    (dict(q=torch.zeros(2, 1, 3, 64).half()), "multiple of key/value heads"),
    (dict(alibi_slopes=torch.zeros(3)), "alibi_slopes"),
    (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), "int32"),
    (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), "(batch,)"),
    (dict(cache_leftpad=torch.zeros(2, dtype=torch.int64)), "cache_leftpad must be a contiguous int32"),
    (dict(v_cache=torch.zeros(4, 16, 2, 64).half()), "one shape"),
    (dict(k=torch.zeros(2, 5, 2, 64).half(), v=torch.zeros(2, 5, 2, 64).half(), cache_seqlens=30),
     "past the cache"),
    (dict(rotary_cos=torch.zeros(40, 8)), "given together"),
    (dict(rotary_cos=torch.zeros(40, 8), rotary_sin=torch.zeros(40, 8)), "pass k and v"),
    (dict(num_splits=-1), "num_splits"),
    (dict(window_size=(1.5, 0)), "window_size"),
    (dict(softcap=-1.0), "softcap"),
])
def test_refusals(kw, message):
    with pytest.raises(ValueError, match="flash_attn_with_kvcache") as info:
        aotriton_rocm.flash_attn_with_kvcache(**_base(**kw))
    assert message in str(info.value)


def test_a_refused_append_leaves_the_caches_alone():
    """The library's rules (here: the page size) refuse the call before the
    new keys are written."""
    kc, vc = torch.zeros(4, 40, 2, 64).half(), torch.zeros(4, 40, 2, 64).half()
    new = torch.ones(2, 1, 2, 64).half()
    with pytest.raises(ValueError, match="multiple of 16"):
        aotriton_rocm.flash_attn_with_kvcache(
            **_base(k_cache=kc, v_cache=vc), k=new, v=new, cache_seqlens=3,
            block_table=torch.zeros(2, 2, dtype=torch.int32))
    assert not kc.any() and not vc.any()


def test_an_append_to_caches_laid_out_apart_is_checked_as_the_forward_runs():
    """Caches whose rows are not 16-element aligned (a view of a wider
    buffer): the forward runs on copies, so the library's check before the
    append must accept them too; the same refusal comes twice (its verdict
    is remembered)."""
    gen = _gen(5)
    wide_k = torch.randn(2, 32, 2, 72, generator=gen).half()
    wide_v = torch.randn(2, 32, 2, 72, generator=gen).half()
    kc, vc = wide_k[..., :64], wide_v[..., :64]
    q = torch.randn(2, 1, 4, 64, generator=gen).half()
    new = torch.randn(2, 1, 2, 64, generator=gen).half()
    out = aotriton_rocm.flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=5)
    assert torch.equal(kc[:, 5], new[:, 0]) and torch.equal(vc[:, 5], new[:, 0])
    want, _ = ref.attention(q, kc, vc, torch.tensor([6, 6]))
    assert (out.double() - want).abs().max() <= 2e-3
    before = kc.clone()
    for _ in range(2):
        with pytest.raises(ValueError, match="query heads \\(3\\) must be a multiple"):
            aotriton_rocm.flash_attn_with_kvcache(q[:, :, :3], kc, vc, new, new, cache_seqlens=7)
    assert torch.equal(kc, before)


# torch's _flash_attention_forward with seqused_k / block_table / num_splits
# (the op function its CUDA-key override runs; CPU tensors here).

def _packed(seqs):
    return torch.tensor([0, *torch.tensor(seqs).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("causal", [False, True])
def test_torch_op_dense_seqused_k_and_splits(causal):
    from aotriton_rocm.integrations import torch_integration as ti
    gen = _gen(21 + int(causal))
    b, sq, sk, h, hk, d = 3, 4, 90, 4, 2, 64
    q = torch.randn(b, sq, h, d, generator=gen).half()
    k = torch.randn(b, sk, hk, d, generator=gen).half()
    v = torch.randn(b, sk, hk, d, generator=gen).half()
    used = torch.tensor([90, 33, 5], dtype=torch.int32)
    backends.reset_launch_counts()
    out, lse, *_ = ti.flash_attention_forward(q, k, v, None, None, sq, sk, 0.0, causal, False,
                                              scale=0.2, seqused_k=used, num_splits=3)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd_kvcache_combine")] == 1
    want, want_lse = ref.attention(q, k, v, used, scale=0.2, causal=causal)
    _check(out, lse, want, want_lse, torch.float16)
    # num_splits alone: the same attention over every key
    out2, *_ = ti.flash_attention_forward(q, k, v, None, None, sq, sk, 0.0, causal, False,
                                          num_splits=2)
    want2, _ = ref.attention(q, k, v, torch.full((b,), sk), causal=causal)
    assert (out2.double() - want2).abs().max() <= 2e-3


@pytest.mark.parametrize("paged", [False, True])
def test_torch_op_varlen_seqused_k_and_block_table(paged):
    from aotriton_rocm.integrations import torch_integration as ti
    gen = _gen(40 + int(paged))
    h, hk, d, page = 4, 1, 32, 16
    q_lens, k_lens = [3, 1, 5], [40, 17, 64]
    used = torch.tensor([31, 17, 2], dtype=torch.int32)
    cu_q, cu_k = _packed(q_lens), _packed(k_lens)
    q = torch.randn(sum(q_lens), h, d, generator=gen).bfloat16()
    keys = [torch.randn(n, hk, d, generator=gen).bfloat16() for n in k_lens]
    values = [torch.randn(n, hk, d, generator=gen).bfloat16() for n in k_lens]
    if paged:
        dense_k = torch.zeros(3, 64, hk, d).bfloat16()
        dense_v = torch.zeros(3, 64, hk, d).bfloat16()
        for bb in range(3):
            dense_k[bb, :k_lens[bb]], dense_v[bb, :k_lens[bb]] = keys[bb], values[bb]
        k, v, table = _paged(dense_k, dense_v, page, gen)
    else:
        k, v, table = torch.cat(keys), torch.cat(values), None
    out, lse, *_ = ti.flash_attention_forward(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), 0.0,
                                              True, False, seqused_k=used, block_table=table)
    assert out.shape == q.shape and lse.shape == (h, q.shape[0])
    for bb in range(3):
        rows = slice(int(cu_q[bb]), int(cu_q[bb + 1]))
        n = int(used[bb])
        want, want_lse = ref.attention(q[rows][None], keys[bb][None, :n], values[bb][None, :n],
                                       torch.tensor([n]), causal=True)
        _check(out[rows][None], lse[:, rows][None], want, want_lse, torch.bfloat16)
    if paged:  # without seqused_k: cu_seqlens_k's lengths
        out, *_ = ti.flash_attention_forward(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), 0.0,
                                             False, False, block_table=table)
        for bb in range(3):
            rows = slice(int(cu_q[bb]), int(cu_q[bb + 1]))
            want, _ = ref.attention(q[rows][None], keys[bb][None], values[bb][None],
                                    torch.tensor([k_lens[bb]]))
            assert (out[rows][None].double() - want).abs().max() <= 1.6e-2


def test_flash_attn_varlen_func_paged():
    gen = _gen(50)
    h, hk, d = 2, 2, 64
    q_lens, k_lens = [2, 6], [50, 9]
    cu_q, cu_k = _packed(q_lens), _packed(k_lens)
    q = torch.randn(sum(q_lens), h, d, generator=gen).half()
    dense_k = torch.randn(2, 64, hk, d, generator=gen).half()
    dense_v = torch.randn(2, 64, hk, d, generator=gen).half()
    k, v, table = _paged(dense_k, dense_v, 32, gen)
    out, lse, probs = aotriton_rocm.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=True, window_size=(3, -1),
        return_attn_probs=True, block_table=table)
    assert probs.numel() == 0 and lse.shape == (h, q.shape[0])  # no dropout: empty, as flash-attn
    for bb in range(2):
        rows = slice(int(cu_q[bb]), int(cu_q[bb + 1]))
        want, want_lse = ref.attention(q[rows][None], dense_k[bb:bb + 1], dense_v[bb:bb + 1],
                                       torch.tensor([k_lens[bb]]), causal=True, window=(3, -1))
        _check(out[rows][None], lse[:, rows][None], want, want_lse, torch.float16)
    with pytest.raises(ValueError, match="dropout"):
        aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 50, dropout_p=0.1,
                                             block_table=table)


# --- paged KV with tensors that require grad: the forward runs, a backward is refused ----

def _math_f32(q, keys, values, causal):
    """torch's math SDPA in float32 of one sequence: q (Sq, H, D) against keys
    and values (Sk, Hk, D), causal aligned bottom-right (flash-attn's rule)."""
    sq, h, _ = q.shape
    sk, hk, _ = keys.shape
    qt, kt, vt = (t.float().transpose(0, 1)[None] for t in (q, keys, values))
    kt, vt = (t.repeat_interleave(h // hk, dim=1) for t in (kt, vt))
    mask = None
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    return out[0].transpose(0, 1)


def _paged_problem(seed, dtype=torch.float16):
    gen = _gen(seed)
    h, hk, d, page = 4, 2, 64, 16
    q_lens, k_lens = [3, 7], [40, 21]
    cu_q, cu_k = _packed(q_lens), _packed(k_lens)
    q = torch.randn(sum(q_lens), h, d, generator=gen).to(dtype)
    dense_k = torch.randn(2, 48, hk, d, generator=gen).to(dtype)
    dense_v = torch.randn(2, 48, hk, d, generator=gen).to(dtype)
    k, v, table = _paged(dense_k, dense_v, page, gen)
    return q, k, v, table, cu_q, cu_k, q_lens, k_lens, dense_k, dense_v


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_func_paged_requires_grad_runs_forward(causal):
    q, k, v, table, cu_q, cu_k, q_lens, k_lens, dense_k, dense_v = _paged_problem(60 + causal)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    backends.reset_launch_counts()
    out, lse, _ = aotriton_rocm.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=causal, block_table=table,
        return_attn_probs=True)
    assert backends.launch_counts()[("interpreter:cpu", "attn_fwd_kvcache")] >= 1
    assert out.requires_grad and not lse.requires_grad
    for bb in range(2):
        rows = slice(int(cu_q[bb]), int(cu_q[bb + 1]))
        n = k_lens[bb]
        want = _math_f32(q[rows].detach(), dense_k[bb, :n], dense_v[bb, :n], causal)
        torch.testing.assert_close(out[rows].detach().float(), want, atol=2e-3, rtol=0)
    # the same forward without autograd gives the same numbers
    with torch.no_grad():
        plain = aotriton_rocm.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens),
                                                     max(k_lens), causal=causal,
                                                     block_table=table)
    assert not plain.requires_grad and torch.equal(plain, out.detach())
    with pytest.raises(NotImplementedError, match="no backward through block_table.*packed"):
        out.float().sum().backward()
    assert q.grad is None and k.grad is None and v.grad is None


def test_flash_attn_with_kvcache_paged_requires_grad_runs_forward():
    """flash-attn's KV-cache function is inference only: inputs that require
    grad are accepted and the output is outside autograd, as there."""
    gen = _gen(70)
    b, sq, h, hk, d, page = 2, 2, 4, 2, 64, 16
    q = torch.randn(b, sq, h, d, generator=gen).half().requires_grad_(True)
    dense_k = torch.randn(b, 40, hk, d, generator=gen).half()
    dense_v = torch.randn(b, 40, hk, d, generator=gen).half()
    k_cache, v_cache, table = _paged(dense_k, dense_v, page, gen)
    k_cache.requires_grad_(True)
    seqlens = torch.tensor([33, 12], dtype=torch.int32)
    out = aotriton_rocm.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                block_table=table, causal=True)
    assert not out.requires_grad
    for bb in range(b):
        n = int(seqlens[bb])
        want = _math_f32(q[bb].detach(), dense_k[bb, :n], dense_v[bb, :n], True)
        torch.testing.assert_close(out[bb].float(), want, atol=2e-3, rtol=0)


def test_torch_op_paged_backward_is_refused():
    """``aten::_flash_attention_forward`` with block_table runs whatever the
    inputs' requires_grad; torch's autograd then calls the backward op
    without the block table: refused with the reason, never computed as if
    the paged keys were packed ones (and never handed to torch's kernel)."""
    from aotriton_rocm.integrations import torch_integration as ti
    q, k, v, table, cu_q, cu_k, q_lens, k_lens, dense_k, dense_v = _paged_problem(80)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out, lse, rng, unused, _ = ti.flash_attention_forward(
        q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), 0.0, True, False, block_table=table)
    rows = slice(int(cu_q[1]), int(cu_q[2]))
    want = _math_f32(q[rows].detach(), dense_k[1, :k_lens[1]], dense_v[1, :k_lens[1]], True)
    torch.testing.assert_close(out[rows].detach().float(), want, atol=2e-3, rtol=0)
    with pytest.raises(NotImplementedError, match="paged KV cache.*block_table"):
        ti.flash_attention_backward(torch.ones_like(out), q, k, v, out, lse, cu_q, cu_k,
                                    max(q_lens), max(k_lens), 0.0, True, rng, unused)
