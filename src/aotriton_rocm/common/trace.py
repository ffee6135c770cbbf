"""Cold-start timing points: with ``AOTRITON_ROCM_TRACE=1`` the one-time steps
of ``enable()`` print ``aotriton-rocm: trace: <phase> <ms> ms <detail>`` on
stderr, the format libaotriton_rocm uses for its own (archive open, device
setup, module loads, first launches). benchmarks/cold_start.py reads them.
Never on a per-call path."""

from __future__ import annotations

import contextlib
import os
import sys
import time

ENV_VAR = "AOTRITON_ROCM_TRACE"


def trace_on() -> bool:
    return os.environ.get(ENV_VAR, "") == "1"


@contextlib.contextmanager
def span(phase: str, detail: str = ""):
    """Time the block as ``phase`` when tracing (else nothing)."""
    if not trace_on():
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        ms = (time.perf_counter() - start) * 1e3
        print(f"aotriton-rocm: trace: {phase} {ms:.3f} ms {detail}", file=sys.stderr, flush=True)
