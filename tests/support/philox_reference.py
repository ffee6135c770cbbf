"""An independent host model of the kernels' dropout mask (numpy, no triton).

The kernels keep score (z, h, i, j) of the (B, H, max_seqlen_q, max_seqlen_k)
matrix iff the uniform draw u > dropout_p, where u in (0, 1] is (the top 24
bits of the first word of Philox-4x32-10 (Salmon et al., SC 2011) keyed by the
64-bit seed, at the 128-bit counter whose 32-bit words are, low to high, e's
low and high words and the offset's low and high words, plus one) times
2**-24, and e = ((z * H + h) * max_seqlen_q + i) * max_seqlen_k + j.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK32 = np.uint64(0xFFFFFFFF)


def uniform(seed: int, offset: int, shape: tuple[int, int, int, int],
            first: int = 0) -> torch.Tensor:
    """The fp32 draws u in (0, 1] of shape (B, H, Sq, Sk) (max seqlens);
    ``first``: e of the first element (a slice of a larger problem)."""
    n = int(np.prod(shape))
    elem = np.arange(first, first + n, dtype=np.uint64)
    c0, c1 = elem & _MASK32, elem >> np.uint64(32)
    c2 = np.full_like(c0, offset % 2**32)
    c3 = np.full_like(c0, (offset % 2**64) >> 32)
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        a0, a2 = c0, c2
        c0 = ((m1 * a2) >> np.uint64(32)) ^ c1 ^ k0
        c2 = ((m0 * a0) >> np.uint64(32)) ^ c3 ^ k1
        c1 = (m1 * a2) & _MASK32
        c3 = (m0 * a0) & _MASK32
        k0 = (k0 + np.uint64(0x9E3779B9)) & _MASK32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _MASK32
    u = ((c0 >> np.uint64(8)) + np.uint64(1)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return torch.from_numpy(u).reshape(shape)


def keep_mask(seed: int, offset: int, shape: tuple[int, int, int, int],
              dropout_p: float, first: int = 0) -> torch.Tensor:
    """The boolean keep mask of shape (B, H, Sq, Sk) (max seqlens)."""
    return uniform(seed, offset, shape, first) > np.float32(dropout_p)


def keep_mask_for(rng: tuple[torch.Tensor, torch.Tensor], shape, dropout_p: float) -> torch.Tensor:
    seed, offset = (int(t.item()) for t in rng)
    return keep_mask(seed, offset, shape, dropout_p)
