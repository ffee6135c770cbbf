"""The Philox (seed, offset) of a dropout call, taken from torch's generator
and advanced as torch's own attention kernels advance it.

A call that draws ``batch * heads * rows * cols`` counters (torch's rule:
flash ops ``rows, cols = 1, 32``, the efficient op ``seqlen_q, seqlen_k``)
gets the generator's seed and current offset and moves the offset on by
that count rounded up to a multiple of 4, as ``philox_cuda_state`` does.

* GPU, eager: ``torch.cuda.default_generators[i]``: ``initial_seed()``,
  ``get_offset()``, ``set_offset()``.
* GPU, CUDA-graph capture: the generator's seed and offset live in device
  tensors that torch refills before each replay, and Python cannot reach
  them; torch's own ``_efficient_attention_forward`` can: during capture it
  writes the replay's seed and offset (graph base plus its intra-graph
  offset) to the device tensors it returns. One call of it on fp16 head-dim-8
  tensors shaped (batch, rows, heads) and (batch, cols, heads) draws exactly
  our count, so its outputs are our state and every replay draws anew.
* CPU (the interpreter backend; its generator is no Philox): seed
  ``torch.initial_seed()``; offset 0 while the CPU generator still has the
  state ``torch.manual_seed`` left it in, then advanced by each call as
  above; if anything else drew from (or set) the generator since our last
  call, the offset restarts at a value hashed from its state (a multiple of
  4 below 2**62). Each call then draws one number from the CPU generator,
  so that a later ``torch.manual_seed`` is told apart from our own state.
"""

from __future__ import annotations

import hashlib
import threading
import warnings

import torch

FLASH_COLS = 32  # torch's flash kernels: 32 counters per (batch, head)

_lock = threading.Lock()
_cpu = {"state": None, "offset": 0}
_fresh_cpu: dict[int, torch.Tensor] = {}


def round4(count: int) -> int:
    """torch's generator rounds every increment up to a multiple of 4."""
    return (int(count) + 3) // 4 * 4


def flash_dims(batch: int, heads: int) -> tuple[int, int, int, int]:
    """(batch, heads, rows, cols) of torch's flash ops: 32 * batch * heads."""
    return int(batch), int(heads), 1, FLASH_COLS


def efficient_dims(batch: int, heads: int, seqlen_q: int, seqlen_k: int):
    """(batch, heads, rows, cols) of torch's efficient op: one counter per score."""
    return int(batch), int(heads), int(seqlen_q), int(seqlen_k)


def _int64(value: int) -> int:
    value = int(value) & (2**64 - 1)
    return value - 2**64 if value >= 2**63 else value


def next_state(device: torch.device, dims: tuple[int, int, int, int]) -> torch.Tensor:
    """(2,) int64 [seed, offset] on ``device`` for a call drawing
    ``prod(dims)`` counters; advances the device's generator."""
    return next_state_and_values(device, dims)[0]


def next_state_and_values(device: torch.device, dims: tuple[int, int, int, int]):
    """:func:`next_state` and, where known on the host without a device
    synchronisation (not under graph capture), the (seed, offset) ints."""
    device = torch.device(device)
    count = dims[0] * dims[1] * dims[2] * dims[3]
    if device.type == "cpu":
        state = _cpu_state(count)
        return state, (int(state[0]), int(state[1]))
    if device.type != "cuda":
        raise ValueError(f"no Philox generator for device {device}")
    if torch.cuda.is_current_stream_capturing():
        return _captured_state(device, dims), None
    index = device.index if device.index is not None else torch.cuda.current_device()
    gen = torch.cuda.default_generators[index]
    with _lock:
        seed, offset = gen.initial_seed(), gen.get_offset()
        gen.set_offset(offset + round4(count))
    values = (_int64(seed), _int64(offset))
    host = torch.tensor(values, dtype=torch.int64).pin_memory()
    return host.to(device, non_blocking=True), values


def _captured_state(device: torch.device, dims) -> torch.Tensor:
    b, h, rows, cols = dims
    q = torch.empty((b, rows, h, 8), dtype=torch.float16, device=device)
    kv = torch.empty((b, cols, h, 8), dtype=torch.float16, device=device)
    try:
        outs = torch.ops.aten._efficient_attention_forward(
            q, kv, kv, None, None, None, None, None, 0.5, 0, False)
    except (RuntimeError, NotImplementedError) as exc:
        warnings.warn("aotriton-rocm: under CUDA-graph capture the dropout state comes from "
                      f"torch's efficient attention kernel, which failed here ({exc}); drawing "
                      "a random seed from torch's generator instead (replays still differ)",
                      stacklevel=3)
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)
        return torch.cat((seed, torch.zeros_like(seed)))
    return torch.stack((outs[2].to(device).view(()), outs[3].to(device).view(())))


def _fresh_cpu_state(seed: int) -> torch.Tensor:
    state = _fresh_cpu.get(seed)
    if state is None:
        state = _fresh_cpu[seed] = torch.Generator().manual_seed(seed).get_state()
    return state


def _cpu_state(count: int) -> torch.Tensor:
    gen = torch.default_generator
    with _lock:
        seed = gen.initial_seed()
        state = gen.get_state()
        if _cpu["state"] is not None and torch.equal(state, _cpu["state"]):
            offset = _cpu["offset"]
        elif torch.equal(state, _fresh_cpu_state(seed)):
            offset = 0
        else:
            digest = hashlib.sha256(state.numpy().tobytes()).digest()
            offset = int.from_bytes(digest[:8], "little") % 2**62 // 4 * 4
        torch.randint(2, (1,), generator=gen)  # leave the freshly seeded state
        _cpu["state"], _cpu["offset"] = gen.get_state(), offset + round4(count)
    return torch.tensor([_int64(seed), offset], dtype=torch.int64)
