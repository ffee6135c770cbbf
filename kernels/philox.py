"""The dropout draws of the attention kernels: Philox-4x32-10 (Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC 2011) keyed by the 64-bit
seed, at the 128-bit counter (element index e: low words, offset: high
words); the top 24 bits of the first output word, plus one, times 2**-24
are a uniform draw u in (0, 1]. An element is kept iff u > dropout_p
(torch's rule; p = 0 keeps everything). The offset is torch's generator
offset: calls at different offsets draw disjoint streams whatever their
sizes (torch's flash ops advance it by only 32 per batch and head).

A ``@triton.jit`` device function: the compiled kernels inline it, and the
CPU interpreter calls it as a nested function (see
``aotriton_rocm.kernel_spec.interpreted_function``).
"""

import triton
import triton.language as tl

PHILOX_M0 = tl.constexpr(0xD2511F53)
PHILOX_M1 = tl.constexpr(0xCD9E8D57)
PHILOX_W0 = tl.constexpr(0x9E3779B9)
PHILOX_W1 = tl.constexpr(0xBB67AE85)
PHILOX_ROUNDS = tl.constexpr(10)
INV_2_24 = tl.constexpr(1.0 / 16777216.0)


@triton.jit
def philox_uniform(seed, offset, elem):
    """u in (0, 1] per element of the int64 ``elem`` tile (element indices),
    ``seed`` and ``offset`` int64 scalars."""
    c0 = elem.to(tl.uint32)
    c1 = (elem >> 32).to(tl.uint32)
    c2 = c0 * 0 + offset.to(tl.uint32)
    c3 = c0 * 0 + (offset >> 32).to(tl.uint32)
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    for _ in tl.static_range(PHILOX_ROUNDS):
        a0 = c0
        a2 = c2
        c0 = tl.math.umulhi(tl.cast(PHILOX_M1, tl.uint32), a2) ^ c1 ^ k0
        c2 = tl.math.umulhi(tl.cast(PHILOX_M0, tl.uint32), a0) ^ c3 ^ k1
        c1 = a2 * tl.cast(PHILOX_M1, tl.uint32)
        c3 = a0 * tl.cast(PHILOX_M0, tl.uint32)
        k0 = k0 + tl.cast(PHILOX_W0, tl.uint32)
        k1 = k1 + tl.cast(PHILOX_W1, tl.uint32)
    return ((c0 >> 8) + 1).to(tl.int32).to(tl.float32) * INV_2_24
