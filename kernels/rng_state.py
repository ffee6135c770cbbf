"""The Philox state of a dropout call, made on the device.

Under CUDA/HIP graph capture PyTorch hands AOTriton's API the seed and the
graph's base offset as device pointers that every replay refills, and the
call's offset inside the graph as a number: the kernels' offset is their
sum, which only exists on the device at replay time. This one-program kernel
writes it (and the seed) where the attention kernels and PyTorch read them.
"""

import triton
import triton.language as tl


@triton.jit
def philox_state(RNG_SEED, RNG_OFFSET, offset_add, SEED_OUT, OFFSET_OUT):
    """*SEED_OUT = *RNG_SEED; *OFFSET_OUT = *RNG_OFFSET + offset_add (int64)."""
    tl.store(SEED_OUT, tl.load(RNG_SEED))
    tl.store(OFFSET_OUT, tl.load(RNG_OFFSET) + offset_add)
