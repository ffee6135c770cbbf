"""Attention over a KV cache through ``attn_fwd_kvcache`` (kernels/flash_decode.py).

The Python route behind :func:`aotriton_rocm.flash_attn_with_kvcache`,
``block_table`` in :func:`aotriton_rocm.flash_attn_varlen_func` and torch's
``_flash_attention_forward`` with ``seqused_k`` / ``block_table`` /
``num_splits``. Queries are flash-attn's (B, Sq, H, D) or packed (total_q,
H, D) with ``cu_seqlens_q``; the caches are dense (B_cache, S_cache, Hk, D)
or paged (num_blocks, page_size, Hk, D) with a ``block_table``; batch b
attends to the cache positions ``[k_start[b], k_end[b])``.

Split-KV: with ``num_splits > 1`` the keys of each query tile are shared by
that many programs, whose fp32 partial outputs and logsumexps the combine
kernel merges. ``num_splits = 0``: libaotriton_rocm chooses
(``aotr_attn_fwd_kvcache_splits``), on every backend.
"""

from __future__ import annotations

import torch

from .attention import default_scale, fresh_like, meets_assumptions, prepared
from .backends import backend_for
from .native import UNSUPPORTED, NativeError


def _backend(q: torch.Tensor):
    backend = backend_for(q)
    if backend is None:
        raise NativeError(UNSUPPORTED, "AOTR_UNSUPPORTED", f"no backend for device {q.device}")
    return backend


def _batch(q: torch.Tensor, cu_seqlens_q) -> int:
    return cu_seqlens_q.numel() - 1 if cu_seqlens_q is not None else q.shape[0]


def _lse_like(q: torch.Tensor, cu_seqlens_q, max_seqlen_q: int, device=None) -> torch.Tensor:
    """The fp32 logsumexp of a call: (B, H, Sq), or (H, total_q) packed. Of any
    q (the C core judges q's rank, so a wrong one gets an empty tensor)."""
    if q.dim() != (3 if cu_seqlens_q is not None else 4):
        shape = (0,)
    elif cu_seqlens_q is not None:
        shape = (q.shape[1], q.shape[0])
    else:
        shape = (q.shape[0], q.shape[2], q.shape[1])
    return torch.empty(shape, dtype=torch.float32, device=q.device if device is None else device)


_TENSOR_ARGS = ("k_start", "cache_batch_idx", "block_table", "alibi_slopes", "cu_seqlens_q")
# libaotriton_rocm's verdicts on requests, by all they depend on (the
# tensors' dtypes, shapes and strides, the scalars, the backend): a decode
# loop asks the library once.
_verdicts: dict = {}
_VERDICTS_KEPT = 256


def check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_end: torch.Tensor,
          **kw) -> None:
    """Raises NativeError where libaotriton_rocm refuses :func:`forward`'s call
    with these arguments (its rules; nothing is read or launched), so that a
    caller can refuse before it changes anything (the append of new keys)."""
    backend = _backend(q)
    tensors = (q, k_cache, v_cache, k_end, *(kw.get(name) for name in _TENSOR_ARGS))
    key = (backend, tuple(None if t is None else (t.dtype, t.shape, t.stride()) for t in tensors),
           tuple(sorted((name, value) for name, value in kw.items() if name not in _TENSOR_ARGS)))
    try:
        verdict = _verdicts[key]
    except KeyError:
        verdict = _verdicts[key] = _ask(backend, q, k_cache, v_cache, k_end, kw)
        if len(_verdicts) > _VERDICTS_KEPT:
            _verdicts.pop(next(iter(_verdicts)))
    except TypeError:  # a scalar that is not hashable (a list for a pair)
        verdict = _ask(backend, q, k_cache, v_cache, k_end, kw)
    if verdict is not None:
        raise NativeError(*verdict)


def _ask(backend, q, k_cache, v_cache, k_end, kw) -> tuple | None:
    """The library's verdict, on stand-ins laid out as :func:`forward` would
    pass the tensors (copies where theirs do not meet the kernels'
    assumptions)."""
    q, k_cache, v_cache = (t if meets_assumptions(t) else fresh_like(t, "meta")
                           for t in (q, k_cache, v_cache))
    lse = _lse_like(q, kw.get("cu_seqlens_q"), kw.get("max_seqlen_q", 0), "meta")
    try:
        _call(backend.kvcache_splits, q, k_cache, v_cache, q, lse, k_end, shapes_only=True, **kw)
    except NativeError as exc:
        return exc.status, exc.name, exc.message
    return None


def _call(run, q, k_cache, v_cache, out, lse, k_end, *, k_start=None, cache_batch_idx=None,
          block_table=None, alibi_slopes=None, scale=None, causal=False, window_size=(-1, -1),
          softcap=0.0, num_splits=0, cu_seqlens_q=None, max_seqlen_q=0, **extra):
    sq = int(max_seqlen_q) if cu_seqlens_q is not None else (q.shape[1] if q.dim() == 4 else 0)
    return run(q, k_cache, v_cache, out, lse, k_end=k_end, k_start=k_start,
               cache_batch_idx=cache_batch_idx, block_table=block_table,
               alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=sq,
               scale=float(scale) if scale is not None else default_scale(q.shape[-1]) if q.dim() else 1.0,
               window=window_size, causal=causal, softcap=float(softcap),
               num_splits=int(num_splits), **extra)


def forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_end: torch.Tensor,
            *, k_start: torch.Tensor | None = None, cache_batch_idx: torch.Tensor | None = None,
            block_table: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
            scale: float | None = None, causal: bool = False,
            window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, num_splits: int = 0,
            cu_seqlens_q: torch.Tensor | None = None, max_seqlen_q: int = 0,
            out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(out like q, fp32 logsumexp, the number of splits used).

    The logsumexp is (B, H, Sq), or (H, total_q) with ``cu_seqlens_q``.
    NativeError where libaotriton_rocm refuses the call (its rules: shapes,
    dtypes, head dims, pages, vectors; nothing has run then); the caller
    checks the tensors' devices (torch's). ``window_size`` is
    flash-attn's (-1: unbounded; ``causal`` sets the right side to 0),
    aligned bottom-right with each batch's key range.
    """
    if out is None:
        out = torch.empty_like(q)
    lse = _lse_like(q, cu_seqlens_q, max_seqlen_q)
    args = dict(k_start=k_start, cache_batch_idx=cache_batch_idx, block_table=block_table,
                alibi_slopes=alibi_slopes, scale=scale, causal=causal, window_size=window_size,
                softcap=softcap, num_splits=num_splits, cu_seqlens_q=cu_seqlens_q,
                max_seqlen_q=max_seqlen_q)
    if q.numel() == 0 or lse.numel() == 0 or _batch(q, cu_seqlens_q) == 0 or (
            cu_seqlens_q is not None and not max_seqlen_q):
        # nothing to compute (and empty tensors have no address): the rules
        # are checked on stand-ins
        check(q, k_cache, v_cache, k_end, **args)
        return out, lse.fill_(float("inf")), 1
    # Tensors the kernels read in place (copies where the layout does not
    # meet their assumptions; the caches only then: a large cache should be
    # laid out so that it does), unit-stride index vectors.
    q_k, kc, vc = (prepared(t) for t in (q, k_cache, v_cache))
    o = out if meets_assumptions(out) else fresh_like(out)
    k_end, *vectors = (None if t is None else t.contiguous()
                       for t in (k_end, k_start, cache_batch_idx, block_table, alibi_slopes))
    args.update(zip(("k_start", "cache_batch_idx", "block_table", "alibi_slopes"), vectors))
    splits = _call(_backend(q).forward_kvcache, q_k, kc, vc, o, lse, k_end, **args)
    if o is not out:
        out.copy_(o)
    return out, lse, splits
