"""``aotriton-rocm tune``: time each functional point's candidate configs on
the GPU of an arch, per sequence-length bucket, check each winner against a
float64 reference, and write ``kernels/tuning/<arch>.json``.

Candidates: the point's configs in ``kernels/variants.toml`` (the static
fallback the build keeps) and those of ``kernels/tuning/space.toml``. They
are compiled as the build compiles them (content-addressed cache under
``--work``), launched through the runtime's own op code (workloads.py)
and timed in CUDA graphs (launch.py); measure.py picks each point's
checked winners and tuning_file.py merges them into the file. The build then compiles the
winners plus the variants.toml configs and ships, per bucket, the measured
winner (tuning.py). ``--device cpu`` runs the same flow through Triton's
interpreter at toy sizes (timings meaningless; for testing the flow).
Build-time only.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO, Tuple

from ...common.errors import UsageError
from ...common.files import atomic_write_text
from ...core.kernel_spec import Variant, load_variants
from ..builder.tuning import SEQLEN_BUCKETS, dump_measured
from .measure import Launchers, tune_point
from .tuning_file import PointResult, PreviousFile, bucket_of, file_header, merged_file

__all__ = ["TuneOptions", "add_tune_arguments", "run_tune", "DEFAULT_SEQLENS"]

DEFAULT_SEQLENS = (128, 512, 1024, 2048, 4096, 8192, 16384)
# --device cpu tunes the configs of the NVIDIA test target, which the CPU
# interpreter backend serves too
CPU_FLOW_ARCH = "sm_90"
FP32_TOKEN_SHARE = 4  # fp32 (IEEE FMA dots, ~15x slower) is timed at a quarter of the tokens


@dataclass(frozen=True)
class TuneOptions:
    arch: Optional[str] = None
    device: str = "cuda"
    only: Tuple[str, ...] = ()
    seqlens: Tuple[int, ...] = DEFAULT_SEQLENS
    tokens: int = 16384
    hidden: int = 2048
    out: Optional[Path] = None
    work: Path = Path("build/tune")
    jobs: Optional[int] = None
    source_root: Optional[Path] = None
    budget_ms: float = 2.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "TuneOptions":
        try:
            seqlens = tuple(int(x) for x in args.seqlens.split(",") if x.strip())
        except ValueError:
            raise UsageError(f"--seqlens {args.seqlens!r}: want comma-separated integers") from None
        return cls(arch=args.arch, device=args.device, only=tuple(args.only or ()), seqlens=seqlens,
                   tokens=args.tokens, hidden=args.hidden,
                   out=Path(args.out) if args.out else None, work=Path(args.work), jobs=args.jobs,
                   source_root=Path(args.source_root) if args.source_root else None,
                   budget_ms=args.budget_ms)

    @property
    def command(self) -> str:
        """The command line that reproduces the measurement (paths aside)."""
        parts = ["aotriton-rocm tune"] + [f"--only {o}" for o in self.only]
        if self.seqlens != DEFAULT_SEQLENS:
            parts.append(f"--seqlens {','.join(map(str, self.seqlens))}")
        if (self.tokens, self.hidden) != (16384, 2048):
            parts.append(f"--tokens {self.tokens} --hidden {self.hidden}")
        if self.device != "cuda":
            parts.append(f"--device {self.device}")
        return " ".join(parts)


def add_tune_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--arch", default=None,
                        help="the arch to tune; must be the GPU's (default: the GPU's)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda: time on the GPU (the real thing); cpu: the same flow through "
                             "Triton's interpreter at toy sizes, to test it (timings meaningless)")
    parser.add_argument("--only", action="append", default=None, metavar="NAME=VALUE[|VALUE],...",
                        help="only these functional points (build --only syntax), e.g. "
                             "kernel=attn_fwd,dtype=bf16,head_dim=128")
    parser.add_argument("--seqlens", default=",".join(map(str, DEFAULT_SEQLENS)),
                        help="sequence lengths timed, each a bucket bound of the dispatcher "
                             f"({', '.join(map(str, SEQLEN_BUCKETS))}) or above the last (the "
                             "open bucket); default %(default)s")
    parser.add_argument("--tokens", type=int, default=16384,
                        help="batch * seqlen of the timed shapes (default %(default)s)")
    parser.add_argument("--hidden", type=int, default=2048,
                        help="heads * head dim of the timed shapes (default %(default)s)")
    parser.add_argument("--out", default=None,
                        help="the tuning file to write (default kernels/tuning/<arch>.json of the "
                             "source tree); entries of points not tuned now are kept")
    parser.add_argument("--work", default="build/tune",
                        help="compile caches (default %(default)s)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="compile processes")
    parser.add_argument("--source-root", default=None, help="the checkout (default: found from cwd)")
    parser.add_argument("--budget-ms", type=float, default=2.0,
                        help="GPU time per timed graph (default %(default)s)")
    return parser


def _runs_beside(k, point) -> bool:
    """Can the workload of ``point`` launch kernel ``k`` (same dtype and head
    dim; the workloads of kernels without flags run no bias, no dropout)?"""
    if (k.dtype, k.head_dim) != (point.dtype, point.head_dim):
        return False
    return all(kf is None or kf == bool(pf)
               for kf, pf in ((k.has_bias, point.has_bias), (k.enable_dropout, point.enable_dropout)))


def run_tune(options: TuneOptions, stream: Optional[TextIO] = None) -> int:
    """Tune, write the file; 0 if every point got a checked winner, else 1
    (the points that did are still written)."""
    import torch

    from .launch import functional_key
    from ...core.device import arch_of
    from ..builder.plan import Sources, Subset
    from ..common.targets import load_targets
    from .space import load_space
    from .workloads import NOT_TUNED, workload_for

    stream = stream if stream is not None else sys.stderr

    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    device = torch.device(options.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("no GPU here: tune times the kernels on a GPU of the arch it tunes "
                             "(--device cpu runs the flow through the interpreter, for testing)")
        device = torch.device("cuda", torch.cuda.current_device())
        gpu_arch = arch_of(device.index)
        if options.arch and options.arch != gpu_arch:
            raise UsageError(f"--arch {options.arch}, but the GPU is {gpu_arch}: tune measures the "
                             "GPU it runs on")
        arch_name = gpu_arch
    else:
        arch_name = options.arch or CPU_FLOW_ARCH
    sizes: List[Optional[int]] = []
    for s in sorted(set(options.seqlens)):
        b = bucket_of(s)
        if b is None and None in sizes:
            raise UsageError(f"--seqlens: only one length above {SEQLEN_BUCKETS[-1]} (the open bucket)")
        sizes.append(b)
    if not sizes:
        raise UsageError("--seqlens: give at least one")
    open_seqlen = max([s for s in options.seqlens if s > SEQLEN_BUCKETS[-1]] or [SEQLEN_BUCKETS[-1] * 2])

    sources = Sources.find(options.source_root)
    spec = load_variants(sources.kernels_dir)
    params_of = spec.check_sources()
    _, (arch,) = load_targets(sources.targets_path).resolve(None, [arch_name])
    subset = Subset.parse(options.only)
    every = spec.variants_for(arch, load_space(spec))
    if subset:
        subset.check_names(every)
    declared = spec.variants_for(arch)
    declared_keys = {v.key for v in declared}
    points: Dict[Any, List[Variant]] = {}
    for v in every:
        if subset.accepts(v) and v.kernel not in NOT_TUNED:
            points.setdefault(functional_key(v.kernel, v.functional), []).append(v)
    if not points:
        raise UsageError(f"--only {subset.text()}: no functional point of {arch.name}")
    # what the other kernels of a workload run: the first variants.toml config of each point
    support: Dict[Any, Variant] = {}
    for v in declared:
        support.setdefault(functional_key(v.kernel, v.functional), v)
    support = {k: v for k, v in support.items()
               if k.kernel == "dropout_uniform" or any(_runs_beside(k, p) for p in points)}
    launchable = {v.key: v for vs in points.values() for v in vs}
    launchable.update({v.key: v for v in support.values()})
    say(f"tune {arch.name} on {device}: {len(points)} functional points, "
        f"{sum(len(v) for v in points.values())} candidates, seqlens "
        f"{', '.join(str(s) if s else str(open_seqlen) for s in sizes)}")
    launchers = Launchers(list(launchable.values()), arch, spec, sources, params_of, options,
                           device, stream)
    base = {k: v for k, v in support.items() if v.key not in launchers.rejected}

    out = options.out or sources.kernels_dir / "tuning" / f"{arch.name}.json"
    header = file_header(options.command, torch, device, arch.name)
    previous = PreviousFile.read(out, arch.name)
    every_point = list({(v.kernel, tuple(sorted(v.functional.items()))): (v.kernel, v.functional)
                        for v in declared}.values())
    unmasked: Dict[str, set] = {}  # per kernel, the head dims of its unmasked variants
    for v in declared:
        if v.functional.get("pad_head") is False:
            unmasked.setdefault(v.kernel, set()).add(v.functional["head_dim"])
    results: List[PointResult] = []
    for i, (key, cands) in enumerate(points.items(), 1):
        started = time.monotonic()
        fallback = next((v for v in cands if v.key in declared_keys), cands[0])
        cands = [fallback] + [v for v in cands if v is not fallback]
        func = cands[0].functional
        say(f"[{i}/{len(points)}] {key.kernel} {','.join(f'{k}={v}' for k, v in func.items())}: "
            f"{len(cands)} candidates")
        tokens = options.tokens // (FP32_TOKEN_SHARE if func.get("dtype") == "fp32" else 1)
        workload = workload_for(key.kernel, func, device, tokens=tokens, hidden=options.hidden,
                                open_seqlen=open_seqlen,
                                unmasked_head_dims=tuple(unmasked.get(key.kernel, ())))
        try:
            res = tune_point(key, cands, fallback, base, launchers, workload,
                             sizes if workload.per_seqlen else [None], options.budget_ms, torch,
                             device, say)
        except torch.cuda.OutOfMemoryError as exc:
            res = PointResult(key.kernel, dict(func), error=f"out of GPU memory: {exc}")
        if res.error:
            say(f"  error: {res.error}")
        say(f"  ({time.monotonic() - started:.0f} s)")
        results.append(res)
        # written after every point: an interrupted run keeps what it measured
        atomic_write_text(out, dump_measured(merged_file(results, every_point, header, previous)))
    bad = [r for r in results if r.error]
    say(f"wrote {out}: {len(results) - len(bad)} of {len(results)} points tuned"
        + (f"; failed: {', '.join(r.kernel + ' ' + str(r.functional) for r in bad)}" if bad else ""))
    return 1 if bad else 0
