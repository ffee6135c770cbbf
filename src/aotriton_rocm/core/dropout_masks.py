"""Dropout masks as other code reads them: flash-attn's ``S_dmask`` and the
draws behind torch's ``aten::_fill_mem_eff_dropout_mask_``.

**flash-attn's S_dmask** (``flash_attn_func`` / ``flash_attn_varlen_func``
with ``return_attn_probs=True`` and dropout): a (batch, nheads,
round_up(max_seqlen_q, 128), round_up(max_seqlen_k, 128)) tensor of q's
dtype. Sequence b's rows and columns sit at the top left of ``[b]``; the
rest (padding rows/columns, keys a row does not see under causal or a
window) are 0. Within that, entry (i, j) of key block J = j // N holds the
unnormalised probability ``exp(s_ij - m_iJ)``, where ``s`` are the scaled
scores and ``m_iJ`` the maximum of row i's visible scores over key columns
>= J * N (flash-attn walks key blocks from last to first, so its running
maximum is a suffix maximum), negated where dropout dropped the element
(-0.0 where a dropped probability underflows). flash-attn's test helpers
renormalise it with ``exp(m_iJ - lse_i)`` per block of N columns, N from
``_get_block_size_n(device, head_dim, is_dropout=True, ...)``: with dropout
that is the same on every CUDA arch (and on ROCm, whose devices report a
compute capability too), and :func:`s_dmask_block_n` gives it, also on the
CPU, where flash-attn's helper cannot run; head dims above 256 (which
flash-attn does not have) use N = 64.

The keep/drop decision is the kernel's own: the forward writes it as the
sign of its debug mask, and the magnitudes are composed here on the host
from q, k and the scale with torch ops (a debug path whose output is
O(S^2) anyway). ``score_mod`` is the hook for score modifiers applied before
the masks (softcap, ALiBi): it gets and returns the (B, H, Sq, Sk) fp32
scaled scores.

**The dropout draws** (:func:`fill_dropout_uniform`): element e of a
(B, H, Sq, Sk) problem gets u in (0, 1], the uniform draw of Philox counter
(e, offset) that the attention kernels compare with ``u > dropout_p``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .attention import Varlen
from .backends import backend_for

__all__ = ["S_DMASK_ALIGN", "s_dmask_block_n", "flash_attn_s_dmask", "fill_dropout_uniform",
           "ScoreMod"]

# flash-attn pads S_dmask's rows and columns to multiples of this.
S_DMASK_ALIGN = 128

# (scores (B, H, Sq, Sk) fp32, rows (Sq,), cols (Sk,), seqlen_q (B,), seqlen_k (B,)) -> scores
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                    torch.Tensor]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def s_dmask_block_n(head_dim: int) -> int:
    """The key-block width N of flash-attn's S_dmask with dropout (its
    ``_get_block_size_n(device, head_dim, is_dropout=True, is_causal)``,
    which with dropout depends on the head dim only); 64 above 256."""
    if head_dim <= 32:
        return 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        return 32
    return 64


def _packed_to_padded(t: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
    """Packed (total, H, D) rows as (B, H, max_len, D), zeros past each sequence."""
    starts = cu[:-1].to(torch.int64)
    lens = cu.diff().to(torch.int64)
    pos = torch.arange(max_len, device=t.device)
    valid = pos[None, :] < lens[:, None]
    rows = (starts[:, None] + pos[None, :]).clamp(max=max(t.shape[0] - 1, 0))
    if t.shape[0] == 0:
        return t.new_zeros((lens.numel(), t.shape[1], max_len, t.shape[2]))
    padded = t[rows] * valid[:, :, None, None]
    return padded.transpose(1, 2)


def _visible(seqlen_q: torch.Tensor, seqlen_k: torch.Tensor, max_q: int, max_k: int,
             mask: tuple[int, int, int]) -> torch.Tensor:
    """(B, 1, max_q, max_k): key j visible from query i of sequence b (the
    kernels' rule, :func:`attention.mask_args`), and inside the sequence."""
    bottom_right, left, right = mask
    i = torch.arange(max_q, device=seqlen_q.device)[None, :, None]
    j = torch.arange(max_k, device=seqlen_q.device)[None, None, :]
    sq, sk = seqlen_q[:, None, None], seqlen_k[:, None, None]
    vis = (i < sq) & (j < sk)
    shift = (sk - sq) * bottom_right
    if right >= 0:
        vis = vis & (j <= i + shift + right)
    if left >= 0:
        vis = vis & (j >= i + shift - left)
    return vis[:, None]


def _suffix_block_max(scores: torch.Tensor, block_n: int) -> torch.Tensor:
    """Per column j, the row maximum over columns >= (j // block_n) * block_n."""
    sk = scores.shape[-1]
    nb = -(-sk // block_n)
    padded = torch.nn.functional.pad(scores, (0, nb * block_n - sk), value=float("-inf"))
    block_max = padded.unflatten(-1, (nb, block_n)).amax(-1)
    suffix = block_max.flip(-1).cummax(-1).values.flip(-1)
    return suffix.repeat_interleave(block_n, dim=-1)[..., :sk]


def flash_attn_s_dmask(kernel_mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor, *,
                       scale: float, mask: tuple[int, int, int],
                       varlen: Optional[Varlen] = None,
                       score_mod: Optional[ScoreMod] = None) -> torch.Tensor:
    """flash-attn's S_dmask (see the module docstring) from the kernel's
    debug mask ``kernel_mask`` ((B, H, max_seqlen_q, max_seqlen_k), negative
    (sign bit set) where dropped), q and k as the kernels took them ((B, H,
    S, D), or packed (total, H, D) with ``varlen``; k may have fewer heads),
    the softmax ``scale`` and ``mask``, the kernels' ``(bottom_right,
    window_left, window_right)`` (:func:`attention.mask_args`)."""
    b, h, max_q, max_k = kernel_mask.shape
    if varlen is None:
        qf, kf = q.float(), k.float()
        seqlen_q = torch.full((b,), max_q, device=q.device)
        seqlen_k = torch.full((b,), max_k, device=q.device)
    else:
        cu_q, cu_k = varlen.cu_seqlens_q, varlen.cu_seqlens_k
        qf = _packed_to_padded(q.float(), cu_q, max_q)
        kf = _packed_to_padded(k.float(), cu_k, max_k)
        seqlen_q, seqlen_k = cu_q.diff().to(torch.int64), cu_k.diff().to(torch.int64)
    if kf.shape[1] != h:
        kf = kf.repeat_interleave(h // kf.shape[1], dim=1)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if score_mod is not None:
        scores = score_mod(scores, torch.arange(max_q, device=q.device),
                           torch.arange(max_k, device=q.device), seqlen_q, seqlen_k)
    vis = _visible(seqlen_q, seqlen_k, max_q, max_k, mask)
    scores = scores.masked_fill(~vis, float("-inf"))
    m = _suffix_block_max(scores, s_dmask_block_n(q.shape[-1]))
    magnitude = torch.where(vis, torch.exp(scores - m), 0.0).to(kernel_mask.dtype)
    dropped = torch.signbit(kernel_mask) & vis
    out = kernel_mask.new_zeros((b, h, _round_up(max_q, S_DMASK_ALIGN),
                                 _round_up(max_k, S_DMASK_ALIGN)))
    out[:, :, :max_q, :max_k] = torch.where(dropped, -magnitude, magnitude)
    return out


def fill_dropout_uniform(out: torch.Tensor, seed, offset, *, dropout_p: float = 0.0,
                         encode_keep: bool = False) -> torch.Tensor:
    """Write the attention kernels' dropout draws into ``out``, a contiguous
    fp32 (B, H, Sq, Sk) tensor: element e gets u in (0, 1] of Philox
    (``seed``, counter (e, ``offset``)), the score kept iff ``u >
    dropout_p``; with ``encode_keep`` 0.5 where kept and -0.5 where dropped
    instead. ``seed`` and ``offset`` are ints or int64 scalar tensors (the
    forward's). Runs on ``out``'s device, through libaotriton_rocm (the
    precompiled kernel on a GPU, the interpreter on the CPU); raises
    ValueError for a tensor it cannot fill, RuntimeError when the kernel is
    not available."""
    if out.dtype != torch.float32 or out.dim() != 4 or not out.is_contiguous():
        raise ValueError("the dropout draws need a contiguous float32 (batch, heads, seqlen_q, "
                         f"seqlen_k) tensor, got {out.dtype} of shape {tuple(out.shape)}")
    backend = backend_for(out)
    if backend is None:
        raise ValueError(f"no backend for device {out.device}")
    if out.numel() == 0:
        return out
    seed_t, offset_t = (_int64_scalar(x, out.device) for x in (seed, offset))
    backend.dropout_uniform(out, seed_t, offset_t, dropout_p=dropout_p, encode_keep=encode_keep)
    return out


def _int64_scalar(x, device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.reshape(()).view(torch.int64).to(device) if x.dtype.itemsize == 8 \
            else x.reshape(()).to(device, torch.int64)
    x = int(x)
    return torch.tensor(x - 2**64 if x >= 2**63 else x, dtype=torch.int64, device=device)
