"""How ``aotriton-rocm tune`` runs one candidate config: a backend whose
calls libaotriton_rocm plans from the chosen variants (its host backend,
:mod:`aotriton_rocm.core.host_kernels`: the same checks, binding, grids and
splits as a shipped image gets), which runs each planned launch and times
the tuned kernel's in isolation.

On a GPU a variant runs as the build compiles it (same signature,
constexprs and divisibility hints, through ``compile.compile_task``); on the
CPU (``--device cpu``, to exercise the flow) through Triton's interpreter.
Build-time only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

import torch

from ...core.backends import HostBackend
from ...core.host_kernels import HOST_COMPUTE_UNITS, host_runtime, interpreter_constexprs
from ...core.kernel_sources import interpreted_function
from ...core.kernel_spec import Variant

__all__ = ["FunctionalKey", "functional_key", "Launcher", "compiled_launcher",
           "interpreted_launcher", "Launch", "TuneBackend", "time_launch_us"]


class FunctionalKey(NamedTuple):
    """A functional point of a kernel (what a tuning choice is for). The
    preprocess, KV-cache and dropout-draw kernels have neither a masked head
    dim axis nor bias or dropout: None on those axes."""
    kernel: str
    dtype: str
    head_dim: int          # the padded tile width (BLOCK_D)
    pad_head: bool | None  # masked head dim (the general variant)
    has_bias: bool | None
    enable_dropout: bool | None


def functional_key(kernel: str, functional: dict) -> FunctionalKey:
    """The key of a variant's functional values."""
    def flag(name):
        return None if name not in functional else bool(functional[name])
    return FunctionalKey(kernel, functional["dtype"], int(functional["head_dim"]),
                         flag("pad_head"), flag("has_bias"), flag("enable_dropout"))


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
    constexprs = interpreter_constexprs(v)

    def run(grid, args):
        fn[grid](**args, **constexprs)
    return Launcher(v, run)


@dataclass
class Launch:
    kernel: str
    key: FunctionalKey
    grid: Tuple[int, int, int]
    args: Dict[str, Any]


class TuneBackend(HostBackend):
    """Serves ``variants`` (one per functional key, replaced by :meth:`force`)
    to the runtime's op code, their launchers loaded by ``get(variant key)``
    on first use; the launches of ``timed`` are timed (:func:`time_launch_us`
    with ``budget_ms``) where they run, into ``times``."""

    name = "tune"

    def __init__(self, variants: Dict[FunctionalKey, Variant], get: Callable[[str], Launcher],
                 device: torch.device, *, timed: FunctionalKey | None = None,
                 budget_ms: float = 2.0):
        self._variants = dict(variants)
        self._get = get
        self.device = device
        self.timed, self.budget_ms = timed, budget_ms
        self.times: List[float] = []
        self._reasons: dict = {}
        self._planner = None

    def force(self, key: FunctionalKey, variant: Variant) -> None:
        """Serve ``variant`` for ``key`` from now on."""
        self._variants[key] = variant
        self._planner = None
        self._reasons.clear()

    @property
    def runtime(self):
        if self._planner is None:
            cuda = self.device.type == "cuda"
            units = (torch.cuda.get_device_properties(self.device).multi_processor_count if cuda
                     else HOST_COMPUTE_UNITS)
            self._planner = host_runtime(list(self._variants.values()), self._run, "tune",
                                         device_memory=cuda, compute_units=units)
        return self._planner[0]

    @property
    def _launcher(self):
        return self._planner[1]

    def _run(self, v: Variant, grid, args) -> None:
        launcher = self._get(v.key)
        key = functional_key(v.kernel, v.functional)
        if key == self.timed:
            self.times.append(time_launch_us(launcher, Launch(v.kernel, key, grid, args),
                                             device=self.device, budget_ms=self.budget_ms))
        else:
            launcher.launch(grid, args)


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
