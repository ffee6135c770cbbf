"""What ``aotriton-rocm tune`` runs to time a kernel at a sequence length,
and how it checks a winner against an independent reference.

A workload calls the runtime's own op (attention forward / backward, the
KV-cache forward, the dropout draws) under the tuning backend, so every
kernel gets its arguments exactly as in production; the tuner then times
the one launch it is tuning. Shapes follow the standard FlashAttention
benchmark: ``tokens`` = batch * seqlen, ``hidden`` = heads * head dim.

Checks run the op once more at a small shape inside the bucket with the
winner forced, against torch's math attention in float64, with the smoke
test's tolerance model (smoke.tolerance: the error may be a few times that
of the same math in the input dtype). Build-time only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ...core import attention, kvcache
from ...core.dropout_masks import fill_dropout_uniform
from ...commands.smoke import tolerance

__all__ = ["Workload", "workload_for", "DROPOUT_P", "KVCACHE_HEADS", "KVCACHE_SEQLENS", "NOT_TUNED"]

# Kernels tune leaves alone: the fused backward has one tile by construction
# (two warpgroups of 64 keys), and its MIN_SEQLEN, where it takes over from
# the split kernels, is a comparison of routes (docs/PERFORMANCE-NOTEBOOK.md, "The fused
# backward"), not of its own configs; its dQ conversion follows it. The
# dropout state kernel is one program storing two numbers.
NOT_TUNED = ("attn_bwd_fused", "attn_bwd_dq_convert", "philox_state")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DROPOUT_P = 0.1
KVCACHE_HEADS = (32, 8)  # query heads, key/value heads (a Llama-style GQA decode step)
KVCACHE_BATCH = 8
KVCACHE_SEQLENS = (8192, 65536)
DRAWS_HEADS = 16
# The shortest bucket of the kernels chosen by seqlen_q serves decoding: a
# few new query rows against a long context. It is timed so: seqlen_q = the
# bound against DECODE_SEQLEN_K keys (or half the tokens, if fewer), over
# tokens / DECODE_TOKENS_PER_ROW (batch x heads) rows; 512 rows of 8192 keys
# at the default 16k tokens, as bench_attention.py's decode shape. dK/dV,
# chosen by seqlen_k, is timed at that shape too when the bucket is asked
# for: its winner becomes the point's decoding tile (tuning.py, "Decoding"),
# not a key-length bucket.
DECODE_BUCKET = 16
DECODE_SEQLEN_K = 8192
DECODE_TOKENS_PER_ROW = 32

@dataclass
class Workload:
    """``prepare(seqlen)`` -> inputs; ``run(inputs, causal)`` calls the op
    (under the tuning backend); ``variants``: the causal settings timed (the
    times add up); ``check(seqlen)`` -> (ok, text), run with the winner
    forced; ``shape(seqlen)``: the timed shape in words. ``same_bits``: the
    output must not depend on the config at all: the tuner also compares
    ``check``'s output with the variants.toml config's, bit for bit."""
    prepare: Callable[[Optional[int]], Any]
    run: Callable[[Any, bool], None]
    variants: Tuple[bool, ...]
    check: Callable[[Optional[int]], Tuple[bool, str, Any]]
    shape: Callable[[Optional[int]], str]
    same_bits: bool = False
    per_seqlen: bool = True  # False: timed once, the choice serves every bucket
    decode_rows: Optional[int] = None  # the length timed as decoding, for a decoding tile


def workload_for(kernel: str, functional: Dict[str, Any], device: torch.device, *,
                 tokens: int, hidden: int, open_seqlen: int,
                 unmasked_head_dims: Tuple[int, ...] = ()) -> Workload:
    """``unmasked_head_dims``: the head dims where the kernel has an unmasked
    (pad_head = false) variant, which a masked one is timed beside."""
    if kernel in ("attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"):
        return _attention(kernel, functional, device, tokens, hidden, open_seqlen,
                          unmasked_head_dims)
    if kernel in ("attn_fwd_kvcache", "attn_fwd_kvcache_combine"):
        return _kvcache(functional, device)
    if kernel == "dropout_uniform":
        return _draws(device, open_seqlen)
    raise ValueError(f"tune has no workload for kernel {kernel!r}")


def _head_dim(functional: Dict[str, Any], unmasked_head_dims: Tuple[int, ...]) -> int:
    """The real head dim timed: the tile width, or 8 less for a masked
    variant that has an unmasked fast path at that width (what such a
    variant runs in production)."""
    block = int(functional["head_dim"])
    return block - 8 if functional.get("pad_head") and block in unmasked_head_dims else block


def _allowed(name: str, ours: torch.Tensor, ref64: torch.Tensor,
             ref_lp: torch.Tensor) -> Tuple[bool, str]:
    err = (ours.double() - ref64).abs().max().item()
    tol = tolerance(name, (ref_lp.double() - ref64).abs().max().item())
    ok = err <= tol and math.isfinite(err)
    return ok, f"{name} {err:.3g} <= {tol:.3g}" if ok else f"{name} {err:.3g} > {tol:.3g}"


def _reference(q, k, v, do, *, causal: bool, bias, keep, p: float, dtype):
    """out (and dq, dk, dv with ``do``) of torch's math attention in ``dtype``
    (k and v may have fewer heads: GQA)."""
    q, k, v = (t.detach().to(dtype).requires_grad_(do is not None) for t in (q, k, v))
    sq, sk = q.shape[-2], k.shape[-2]
    mask = None if bias is None else bias.to(dtype)
    if causal:  # bottom-right aligned, as the kernels' causal mask
        hidden = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq).logical_not()
        causal_bias = torch.zeros(sq, sk, dtype=dtype, device=q.device).masked_fill(hidden, float("-inf"))
        mask = causal_bias if mask is None else mask + causal_bias
    out, _ = torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, mask, p, False, keep, enable_gqa=k.shape[1] != q.shape[1])
    if do is None:
        return {"out": out.detach()}
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do.to(dtype))
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def _attention(kernel: str, functional: Dict[str, Any], device, tokens, hidden,
               open_seqlen, unmasked_head_dims) -> Workload:
    dtype = DTYPES[functional["dtype"]]
    d = _head_dim(functional, unmasked_head_dims)
    heads = max(1, hidden // int(functional["head_dim"]))
    has_bias = bool(functional.get("has_bias"))
    p = DROPOUT_P if functional.get("enable_dropout") else 0.0
    backward = kernel != "attn_fwd"
    checked = {"attn_fwd": ("out",), "attn_bwd_preprocess": ("dq", "dk", "dv"),
               "attn_bwd_dkdv": ("dk", "dv"), "attn_bwd_dq": ("dq",)}[kernel]

    def seqlen_of(s):
        return open_seqlen if s is None else s

    def dims(s):
        """(batch, heads, seqlen_q, seqlen_k) timed for bucket ``s``."""
        s = seqlen_of(s)
        if s <= DECODE_BUCKET:
            rows = max(1, tokens // DECODE_TOKENS_PER_ROW)
            return max(1, rows // heads), heads, s, max(s, min(DECODE_SEQLEN_K, tokens // 2))
        return max(1, tokens // s), heads, s, s

    def make(b, h, sq, sk):
        g = torch.Generator(device=device).manual_seed(1234 + sq + sk)
        q, do = (torch.randn((b, h, sq, d), generator=g, device=device, dtype=dtype)
                 for _ in range(2))
        k, v = (torch.randn((b, h, sk, d), generator=g, device=device, dtype=dtype)
                for _ in range(2))
        bias = (torch.randn((1, 1, sq, sk), generator=g, device=device, dtype=dtype)
                if has_bias else None)
        return q, k, v, do, bias

    def call(inputs, causal):
        q, k, v, do, bias = inputs
        rng = attention.new_rng_state(device)
        rng = (rng[0], rng[1])
        out, lse = attention.forward(q, k, v, is_causal=causal, bias=bias, dropout_p=p, rng=rng)
        grads = (attention.backward(do, q, k, v, out, lse, is_causal=causal, bias=bias,
                                    dropout_p=p, rng=rng) if backward else None)
        return out, grads, rng

    def prepare(s):
        return make(*dims(s))

    def run(inputs, causal):
        call(inputs, causal)

    def check(s):
        # inside the bucket, not a multiple of any tile: the masked edges run
        sc = max(16, min(seqlen_of(s), 1024) - 3)
        q, k, v, do, bias = inputs = make(2, 3, sc, sc)
        texts, ok = [], True
        for causal in (False, True):
            out, grads, rng = call(inputs, causal)
            keep = None
            if p:
                draws = torch.empty((2, 3, sc, sc), dtype=torch.float32, device=device)
                keep = fill_dropout_uniform(draws, rng[0], rng[1]) > p
            ours = {"out": out}
            if grads is not None:
                ours.update(zip(("dq", "dk", "dv"), grads))
            ref64 = _reference(q, k, v, do if backward else None, causal=causal, bias=bias,
                               keep=keep, p=p, dtype=torch.float64)
            ref_lp = _reference(q, k, v, do if backward else None, causal=causal, bias=bias,
                                keep=keep, p=p, dtype=dtype)
            for name in checked:
                good, text = _allowed(name, ours[name], ref64[name], ref_lp[name])
                ok &= good
                texts.append(("causal " if causal else "") + text)
        return ok, f"S={sc}: " + ", ".join(texts), None

    def shape(s):
        b, h, sq, sk = dims(s)
        seqlens = f"S={sq}" if sq == sk else f"Sq={sq} Sk={sk}"
        return f"B={b} H={h} {seqlens} D={d}" + (" bias" if has_bias else "") + \
            (f" dropout={p}" if p else "") + ", causal and not"

    return Workload(prepare, run, (False, True), check, shape,
                    decode_rows=DECODE_BUCKET if kernel == "attn_bwd_dkdv" else None)


def _kvcache(functional: Dict[str, Any], device) -> Workload:
    """A decode step: one query row per sequence against a full cache (the
    KV-cache kernels are chosen by the query length; decode is what they
    serve). Timed at every length of KVCACHE_SEQLENS, whatever the bucket."""
    dtype = DTYPES[functional["dtype"]]
    d = int(functional["head_dim"])
    hq, hk = KVCACHE_HEADS

    def make(b, sk):
        g = torch.Generator(device=device).manual_seed(99 + sk)
        q = torch.randn((b, 1, hq, d), generator=g, device=device, dtype=dtype)
        kc, vc = (torch.randn((b, sk, hk, d), generator=g, device=device, dtype=dtype)
                  for _ in range(2))
        return q, kc, vc, torch.full((b,), sk, dtype=torch.int32, device=device)

    def prepare(s):
        return [make(KVCACHE_BATCH, sk) for sk in KVCACHE_SEQLENS]

    def run(inputs, causal):
        for q, kc, vc, k_end in inputs:
            # the runtime's own split count, at least 2 (so that the combine runs)
            if kvcache.forward(q, kc, vc, k_end, num_splits=0)[2] < 2:
                kvcache.forward(q, kc, vc, k_end, num_splits=2)

    def check(s):
        q, kc, vc, k_end = make(2, 1000)
        texts, ok = [], True
        for n in (1, 3):
            out, _, _ = kvcache.forward(q, kc, vc, k_end, num_splits=n)
            args = [t.transpose(1, 2) for t in (q, kc, vc)]
            ref64 = _reference(*args, None, causal=False, bias=None, keep=None, p=0.0,
                               dtype=torch.float64)["out"]
            ref_lp = _reference(*args, None, causal=False, bias=None, keep=None, p=0.0,
                                dtype=dtype)["out"]
            good, text = _allowed("out", out.transpose(1, 2), ref64, ref_lp)
            ok &= good
            texts.append(f"{n} split{'s' if n > 1 else ''}: {text}")
        return ok, "Sk=1000: " + ", ".join(texts), None

    def shape(s):
        return (f"decode B={KVCACHE_BATCH} Hq={hq} Hkv={hk} D={d} Sk="
                + "+".join(str(x) for x in KVCACHE_SEQLENS))

    return Workload(prepare, run, (False,), check, shape, per_seqlen=False)


def _draws(device, open_seqlen) -> Workload:
    """The dropout draws: element-wise Philox, whose values do not depend
    on the tile (the check: the winner's draws equal the variants.toml
    config's bit for bit, and about 1 - p of them are kept)."""
    def dims(s):
        s = min(4096, open_seqlen if s is None else s)
        return 1, DRAWS_HEADS, s, s

    def prepare(s):
        return torch.empty(dims(s), dtype=torch.float32, device=device)

    def run(out, causal):
        fill_dropout_uniform(out, 1234, 5678, dropout_p=DROPOUT_P)

    def check(s):
        out = torch.empty((2, 3, 253, 509), dtype=torch.float32, device=device)
        fill_dropout_uniform(out, 1234, 5678)
        kept = (out > DROPOUT_P).double().mean().item()
        ok = bool((out > 0).all() and (out <= 1).all()) and abs(kept - (1 - DROPOUT_P)) < 0.01
        return ok, f"u in (0, 1], kept {kept:.4f} (expected {1 - DROPOUT_P})", out

    def shape(s):
        return "x".join(str(x) for x in dims(s))

    return Workload(prepare, run, (False,), check, shape, same_bits=True)
