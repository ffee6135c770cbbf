"""How ``aotriton-rocm tune`` runs one candidate config: a backend that
serves chosen variants to the runtime's own op code (attention.py,
kvcache.py, dropout_masks.py: the same argument binding the interpreter
uses), records the launches, and times one launch in isolation.

On a GPU a variant runs as the build compiles it (same signature,
constexprs and divisibility hints, through ``compile.compile_task``); on the
CPU (``--device cpu``, to exercise the flow) through Triton's interpreter.
Build-time only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

import torch

from ...core.backends import Backend, FunctionalKey, KernelHandle, functional_key, pick
from ...core.kernel_spec import Variant, interpreted_function

__all__ = ["Launcher", "compiled_launcher", "interpreted_launcher", "Launch", "TuneBackend",
           "time_launch_us"]


@dataclass
class Launcher:
    """One variant, ready to launch with its arguments by name."""
    variant: Variant
    run: Callable[[Tuple[int, int, int], Dict[str, Any]], None]

    def launch(self, grid: Tuple[int, int, int], args: Dict[str, Any]) -> None:
        names = {n for n, _ in self.variant.args}
        if args.keys() != names:
            raise TypeError(f"{self.variant.kernel}: arguments missing {sorted(names - args.keys())}, "
                            f"unknown {sorted(args.keys() - names)} (kernels/variants.toml lists the "
                            "kernel's arguments)")
        self.run(grid, args)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # torch's caching allocator: stream-ordered, 512-byte aligned, and inside
    # a CUDA-graph capture taken from the graph's pool
    return torch.empty(size, dtype=torch.int8, device="cuda")


def compiled_launcher(v: Variant, kernel, params: List[str]) -> Launcher:
    """``kernel``: triton's CompiledKernel of ``v`` (compile.compile_task);
    ``params``: the function's parameters in order (constexprs included, as
    the compiled launcher takes them). Kernels with global scratch (the sm_90
    forward's TMA descriptors) get it from torch, as the runtime gives it
    from the driver's stream-ordered pool."""
    import triton

    triton.set_allocator(_scratch)

    def run(grid, args):
        kernel[grid](*[args[p] if p in args else v.constexprs[p] for p in params])
    return Launcher(v, run)


def interpreted_launcher(v: Variant, kernel_spec_entry) -> Launcher:
    """``v`` through Triton's interpreter (bf16 needs UPCAST_DOT there)."""
    fn = interpreted_function(kernel_spec_entry)
    constexprs = dict(v.constexprs)
    if "UPCAST_DOT" in constexprs:
        constexprs["UPCAST_DOT"] = True

    def run(grid, args):
        fn[grid](**args, **constexprs)
    return Launcher(v, run)


@dataclass
class Launch:
    kernel: str
    key: FunctionalKey
    grid: Tuple[int, int, int]
    args: Dict[str, Any]


class TuneBackend(Backend):
    """Serves ``launchers`` (one per functional key, replaced by
    :meth:`force`) to the runtime's op code and records every launch. ``dry``: record
    only, run nothing (for the grid a candidate config gets)."""

    name = "tune"
    native = False

    def __init__(self, launchers: Dict[FunctionalKey, Callable[[], Launcher]]):
        self._table = dict(launchers)  # loaders: a launcher is loaded on first use
        self.launches: List[Launch] = []
        self.dry = False

    def force(self, key: FunctionalKey, launcher: Launcher) -> None:
        """Serve ``launcher`` for ``key`` from now on."""
        self._table[key] = lambda: launcher

    def unsupported_reason(self, kernel, *, dtype, head_dim, bias=False, dropout=False, work=0):
        return None

    def kernel(self, kernel, *, dtype, head_dim, bias=False, dropout=False, seqlen_q=0,
               seqlen_k=0, score_mods=False) -> KernelHandle:
        load = pick(self._table, kernel, dtype, head_dim, bias, dropout, score_mods)
        if load is None:
            raise RuntimeError(f"tune: nothing compiled for {kernel} dtype={dtype} "
                               f"head_dim={head_dim} bias={bias} dropout={dropout}")
        launcher = load()
        key = functional_key(launcher.variant.kernel, launcher.variant.functional)

        def launch(grid, device, args):
            self.launches.append(Launch(kernel, key, tuple(grid), dict(args)))
            if not self.dry:
                launcher.launch(tuple(grid), args)

        return KernelHandle(dict(launcher.variant.config), launch)

    def last(self, key: FunctionalKey) -> Launch:
        found = [x for x in self.launches if x.key == key]
        if not found:
            raise RuntimeError(f"tune: the workload launched no {key.kernel} of {key}")
        return found[-1]


def time_launch_us(launcher: Launcher, launch: Launch, *, device: torch.device,
                   budget_ms: float = 2.0) -> float:
    """Microseconds per launch of ``launcher`` on the recorded arguments.

    GPU: launches captured back to back in a CUDA graph (so the time is the
    kernel's, not the host's), sized to about ``budget_ms``, the best of
    three replays; a launch that alone takes ``budget_ms`` or more, the
    better of two. CPU (the interpreter): wall time of one launch."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        launcher.launch(launch.grid, launch.args)
        return (time.perf_counter() - t0) * 1e6
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        launcher.launch(launch.grid, launch.args)  # load the module, warm caches
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launcher.launch(launch.grid, launch.args)
        end.record()
    end.synchronize()
    once_ms = max(start.elapsed_time(end), 1e-3)
    if once_ms >= budget_ms:  # long enough that the host cannot be what is timed
        with torch.cuda.stream(stream):
            start.record()
            launcher.launch(launch.grid, launch.args)
            end.record()
        end.synchronize()
        torch.cuda.current_stream(device).wait_stream(stream)
        return min(once_ms, start.elapsed_time(end)) * 1e3
    reps = max(1, min(200, int(budget_ms / once_ms)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(reps):
            launcher.launch(launch.grid, launch.args)
    best = float("inf")
    for _ in range(3):
        with torch.cuda.stream(stream):
            start.record()
            graph.replay()
            end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    del graph
    torch.cuda.current_stream(device).wait_stream(stream)
    return best * 1e3
