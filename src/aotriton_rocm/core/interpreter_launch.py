"""The CPU interpreter's launches, bound in Python: each kernel's arguments
by name, its grid, and the stand-ins for pointers a launch never reads. On
a GPU the C core binds every launch (libaotriton_rocm); this is the one
Python copy, kept for the interpreter, which runs the kernel sources.
"""

from __future__ import annotations

import functools

import torch

# The y grid dimension is limited to 65535 on CUDA and HIP; batch * heads
# beyond it continues along z.
MAX_GRID_Y = 65535


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch_grid(blocks: int, programs: int) -> tuple[int, int, int]:
    y = max(1, min(programs, MAX_GRID_Y))
    return blocks, y, _cdiv(programs, y)


def alibi_args(alibi_slopes: torch.Tensor | None, spare: torch.Tensor
               ) -> tuple[torch.Tensor, int, int, int]:
    """The kernels' ``(ALIBI, stride_az, stride_ah, has_alibi)`` for (H,) or
    (B, H) slopes (``stride_az = 0`` for (H,)); ``spare`` (fp32) stands in
    when there are none (never read)."""
    if alibi_slopes is None:
        return spare, 0, 0, 0
    if alibi_slopes.dim() == 1:
        return alibi_slopes, 0, alibi_slopes.stride(0), 1
    return alibi_slopes, alibi_slopes.stride(0), alibi_slopes.stride(1), 1


def strides(t: torch.Tensor, varlen=None) -> tuple[int, int, int]:
    """(z, h, row) strides of a (B, H, S, D) view; a packed batch has no z stride."""
    s = t.stride()
    return (0 if varlen is not None else s[0]), s[1], s[2]


@functools.lru_cache(maxsize=None)
def placeholders(device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Arguments for pointers a launch never dereferences (a feature it does
    not use), with the element type the kernel declares."""
    return {"values": torch.zeros(16, dtype=dtype, device=device),
            "cu": torch.zeros(16, dtype=torch.int32, device=device),
            "rng": torch.zeros(16, dtype=torch.int64, device=device),
            "f32": torch.zeros(16, dtype=torch.float32, device=device)}


def _rng_args(rng, spare: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return (spare["rng"], spare["rng"]) if rng is None else rng


def _lse_args(lse: torch.Tensor, varlen) -> tuple[int, int]:
    """(z, h) strides of the logsumexp: (B, H, >= Sq) dense, (H, total) packed."""
    if varlen is not None:
        return 0, lse.stride(0)
    return lse.stride(0), lse.stride(1)


def _has_score_mods(score_mod) -> bool:
    """(softcap, alibi_slopes): does the call modify the scores?"""
    return bool(score_mod[0]) or score_mod[1] is not None


def named_strides(prefix: str, t: torch.Tensor, varlen=None,
                   row: str = "m") -> dict[str, int]:
    """``stride_<prefix>z/h/<row>`` of a (B, H, S, D) view (see :func:`strides`)."""
    return dict(zip((f"stride_{prefix}z", f"stride_{prefix}h", f"stride_{prefix}{row}"),
                    strides(t, varlen)))


def _score_mod_args(score_mod, spare: dict[str, torch.Tensor]) -> dict:
    softcap, alibi_slopes = score_mod
    slopes, stride_az, stride_ah, has_alibi = alibi_args(alibi_slopes, spare["f32"])
    return dict(ALIBI=slopes, stride_az=stride_az, stride_ah=stride_ah, has_alibi=has_alibi,
                softcap=float(softcap))


def interpreter_forward(backend, dtype, q4, k4, v4, o, lse, bias4, debug_mask, rng, varlen,
                        dims, mask, sm_scale, dropout_p, score_mod=(0.0, None)) -> None:
    """The forward's launch on a backend that runs the kernel sources (the CPU
    interpreter), its arguments bound by name."""
    b, h, hk, sq, sk, d = dims
    bottom_right, left, right = mask
    spare = placeholders(q4.device, q4.dtype)
    dropout = bool(dropout_p) or debug_mask is not None
    seed, offset = _rng_args(rng, spare)
    cu_q, cu_k = ((spare["cu"], spare["cu"]) if varlen is None
                  else (varlen.cu_seqlens_q, varlen.cu_seqlens_k))
    lse_z, lse_h = _lse_args(lse, varlen)
    kernel = backend.kernel("attn_fwd", dtype=dtype, head_dim=d,
                            bias=bias4 is not None, dropout=dropout, seqlen_q=sq, seqlen_k=sk,
                            score_mods=_has_score_mods(score_mod))
    args = dict(
        Q=q4, K=k4, V=v4, BIAS=spare["values"] if bias4 is None else bias4, O=o, LSE=lse,
        DMASK=spare["values"] if debug_mask is None else debug_mask, CU_Q=cu_q, CU_K=cu_k,
        RNG_SEED=seed, RNG_OFFSET=offset,
        **named_strides("q", q4, varlen), **named_strides("k", k4, varlen, "n"),
        **named_strides("v", v4, varlen, "n"),
        **(dict(stride_bz=0, stride_bh=0, stride_bm=0) if bias4 is None
           else named_strides("b", bias4)),
        **named_strides("o", o, varlen), stride_lz=lse_z, stride_lh=lse_h,
        batch=b, num_heads=h, gqa_group=h // hk, max_seqlen_q=sq, max_seqlen_k=sk,
        varlen=0 if varlen is None else varlen.word, head_dim=d, bottom_right=bottom_right,
        window_left=left, window_right=right, sm_scale=sm_scale, dropout_p=float(dropout_p),
        store_dmask=int(debug_mask is not None), **_score_mod_args(score_mod, spare))
    kernel.launch(launch_grid(_cdiv(sq, kernel.config["BLOCK_M"]), b * h), q4.device, args)


def interpreter_backward(backend, dtype, do4, q4, k4, v4, o4, lse, delta, grads, bias4, bias_grad,
                         rng, varlen, dims, mask, sm_scale, dropout_p,
                         score_mod=(0.0, None)) -> None:
    """The backward's three launches on a backend that runs the kernel
    sources (the CPU interpreter), their arguments bound by name."""
    b, h, hk, sq, sk, d = dims
    bottom_right, left, right = mask
    dq, dk, dv = grads
    has_bias = bias4 is not None
    spare = placeholders(q4.device, q4.dtype)
    seed, offset = _rng_args(rng, spare)
    cu_q, cu_k = ((spare["cu"], spare["cu"]) if varlen is None
                  else (varlen.cu_seqlens_q, varlen.cu_seqlens_k))
    lse_z, lse_h = _lse_args(lse, varlen)
    features = dict(dtype=dtype, head_dim=d, bias=has_bias, dropout=bool(dropout_p),
                    seqlen_q=sq, seqlen_k=sk, score_mods=_has_score_mods(score_mod))
    sizes = dict(batch=b, num_heads=h, max_seqlen_q=sq, varlen=0 if varlen is None else varlen.word,
                 head_dim=d, stride_lz=lse_z, stride_lh=lse_h)

    pre = backend.kernel("attn_bwd_preprocess", dtype=dtype, head_dim=d, seqlen_q=sq, seqlen_k=sk)
    pre.launch(launch_grid(_cdiv(sq, pre.config["BLOCK_M"]), b * h), q4.device, dict(
        O=o4, DO=do4, Delta=delta, CU_Q=cu_q, **named_strides("o", o4, varlen),
        **named_strides("do", do4, varlen), **sizes))

    common = dict(
        Q=q4, K=k4, V=v4, BIAS=bias4 if has_bias else spare["values"], DO=do4, LSE=lse,
        Delta=delta, CU_Q=cu_q, CU_K=cu_k, RNG_SEED=seed, RNG_OFFSET=offset,
        **named_strides("q", q4, varlen), **named_strides("k", k4, varlen, "n"),
        **named_strides("v", v4, varlen, "n"),
        **(named_strides("b", bias4) if has_bias
           else dict(stride_bz=0, stride_bh=0, stride_bm=0)),
        **named_strides("do", do4, varlen), **sizes, gqa_group=h // hk, max_seqlen_k=sk,
        bottom_right=bottom_right, window_left=left, window_right=right, sm_scale=sm_scale,
        dropout_p=float(dropout_p), **_score_mod_args(score_mod, spare))
    dkdv = backend.kernel("attn_bwd_dkdv", **features)
    dkdv.launch(launch_grid(_cdiv(sk, dkdv.config["BLOCK_N"]), b * hk), q4.device, dict(
        common, DK=dk, DV=dv, **named_strides("dk", dk, varlen, "n"),
        **named_strides("dv", dv, varlen, "n")))
    dqk = backend.kernel("attn_bwd_dq", **features)
    dqk.launch(launch_grid(_cdiv(sq, dqk.config["BLOCK_M"]), b * h), q4.device, dict(
        common, DQ=dq, DBIAS=spare["values"] if bias_grad is None else bias_grad,
        **named_strides("dq", dq, varlen),
        **(dict(stride_dbz=0, stride_dbh=0, stride_dbm=0) if bias_grad is None
           else named_strides("db", bias_grad)),
        store_dbias=int(bias_grad is not None)))
