"""``aotriton-rocm tune``: time each functional point's candidate configs on
the GPU of an arch, per sequence-length bucket, check each winner against a
float64 reference, and write ``kernels/tuning/<arch>.json``.

Candidates: the point's configs in ``kernels/variants.toml`` (the static
fallback the build keeps) and those of ``kernels/tuning/space.toml``. They
are compiled as the build compiles them (content-addressed cache under
``--work``), launched through the runtime's own op code (workloads.py)
and timed in CUDA graphs (launch.py). The build then compiles the
winners plus the variants.toml configs and ships, per bucket, the measured
winner (tuning.py). ``--device cpu`` runs the same flow through Triton's
interpreter at toy sizes (timings meaningless; for testing the flow).
Build-time only.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ...errors import CommandError, UsageError
from ...files import atomic_write_text
from ...kernel_spec import Variant, load_variants
from ..build.tuning import SEQLEN_BUCKETS, dump_measured, load_measured_text

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


@dataclass
class PointResult:
    kernel: str
    functional: Dict[str, Any]
    runs: List[Dict[str, Any]] = field(default_factory=list)  # the file's choices
    error: Optional[str] = None


def _bucket_of(seqlen: int) -> Optional[int]:
    """The dispatcher bucket (its bound) a timed seqlen stands for; None: the open one."""
    if seqlen > SEQLEN_BUCKETS[-1]:
        return None
    if seqlen not in SEQLEN_BUCKETS:
        raise UsageError(f"--seqlens: {seqlen} is not a bucket bound ({', '.join(map(str, SEQLEN_BUCKETS))}) "
                         f"nor above {SEQLEN_BUCKETS[-1]} (the open bucket)")
    return seqlen


def _config_text(config: Dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def _device_record(torch, device) -> Dict[str, Any]:
    rec: Dict[str, Any] = {"torch": torch.__version__}
    try:
        rec["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    if device.type == "cuda":
        rec["name"] = torch.cuda.get_device_name(device)
        rec["runtime"] = f"HIP {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    else:
        rec["name"] = "CPU (Triton interpreter: timings are not meaningful)"
    rec["date"] = datetime.date.today().isoformat()
    return rec


class _Launchers:
    """Launchers by variant key: compiled ahead (in parallel, as the build
    compiles) on a GPU, loaded on first use; the interpreter on the CPU."""

    def __init__(self, variants: Sequence[Variant], arch, spec, sources, params_of, options,
                 device, stream: TextIO):
        self.spec, self.params_of, self.device = spec, params_of, device
        self.variants = {v.key: v for v in variants}
        self.rejected: Dict[str, str] = {}
        self._made: Dict[str, Any] = {}
        self._tasks: Dict[str, Any] = {}
        if device.type == "cuda":
            self._compile(variants, arch, sources, options, stream)

    def _compile(self, variants, arch, sources, options, stream) -> None:
        from ..build.compile import Executor, compile_plan
        from ..build.plan import plan_variants
        from ..build.cache import CompileCache
        from ..build.validate import validate_plan
        from ..build.triton_compile import worker_init

        plan = plan_variants(variants, arch, self.spec, sources, self.params_of)
        self._tasks = {v.key: task for v, task in plan.items[arch.name]}
        work = options.work.resolve()
        triton_cache = work / "triton-cache"
        compiled = compile_plan(plan, CompileCache(work / "cache"), work,
                                Executor(jobs=options.jobs), stream=stream,
                                triton_cache=triton_cache)
        validation = validate_plan(plan, compiled)
        for v in variants:
            if (arch.name, v.key) not in validation.checked:
                self.rejected[v.key] = "did not compile"
                continue
            _, findings = validation.checked[(arch.name, v.key)]
            # what the build would not ship: broken code, or findings no waiver accepts
            refused = [p.split(": ", 1)[1] for p in validation.errors
                       if p.startswith(f"{arch.name} {v.key}: ")]
            refused += [m for kind, m in findings if kind not in v.allow]
            if refused:
                self.rejected[v.key] = "; ".join(refused)
        # Launch what the workers compiled: same environment, same Triton cache.
        worker_init(str(triton_cache))

    def get(self, key: str):
        if key not in self._made:
            from .launch import compiled_launcher, interpreted_launcher
            v = self.variants[key]
            if self.device.type == "cuda":
                from ..build.triton_compile import compile_task
                self._made[key] = compiled_launcher(v, compile_task(self._tasks[key]),
                                                    self.params_of[v.kernel])
            else:
                self._made[key] = interpreted_launcher(v, self.spec.kernels[v.kernel])
        return self._made[key]


def _scalars(args: Dict[str, Any], torch) -> Dict[str, Any]:
    return {k: v for k, v in args.items() if not isinstance(v, torch.Tensor)}


def _tune_point(key, cands: List[Variant], fallback: Variant, base: Dict, launchers: _Launchers,
                workload, sizes: Sequence[Optional[int]], options: TuneOptions, torch,
                device, say) -> PointResult:
    from ...backends import using
    from .launch import Launch, TuneBackend, time_launch_us

    result = PointResult(cands[0].kernel, dict(cands[0].functional))
    failed = {v.key: launchers.rejected[v.key] for v in cands if v.key in launchers.rejected}
    live = [v for v in cands if v.key not in failed]
    if fallback.key in failed:
        result.error = f"the variants.toml config {fallback.key} cannot run: {failed[fallback.key]}"
        return result
    per_size: List[Tuple[Optional[int], Dict[str, float]]] = []
    for size in sizes:
        inputs = workload.prepare(size)
        total = {v.key: 0.0 for v in live}
        for causal in workload.variants:
            tb = TuneBackend(base)
            tb.force(key, launchers.get(fallback.key))
            with using(tb):
                workload.run(inputs, causal)
            real = tb.last(key)
            real_scalars = _scalars(real.args, torch)
            tb.dry = True
            for v in live:
                if v.key in failed:
                    continue
                tb.launches.clear()
                tb.force(key, launchers.get(v.key))
                with using(tb):
                    workload.run(inputs, causal)
                dry = tb.last(key)
                if _scalars(dry.args, torch) != real_scalars:
                    raise CommandError(f"tune: {v.key}: the op passes other scalar arguments with "
                                       "this config; the workload cannot replay it")
                try:
                    total[v.key] += time_launch_us(launchers.get(v.key),
                                                   Launch(real.kernel, key, dry.grid, real.args),
                                                   device=device, budget_ms=options.budget_ms)
                except Exception as exc:  # e.g. out of shared memory when the module loads
                    failed[v.key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        del inputs
        per_size.append((size, {k: t for k, t in total.items() if k not in failed}))
    if device.type == "cuda":
        torch.cuda.empty_cache()

    checked: Dict[str, Tuple[bool, str]] = {}

    def check(v: Variant, size) -> Tuple[bool, str]:
        if v.key not in checked:
            tb = TuneBackend(base)
            tb.force(key, launchers.get(v.key))
            with using(tb):
                ok, text, out = workload.check(size)
            if workload.same_bits and v.key != fallback.key:
                tb.force(key, launchers.get(fallback.key))
                with using(tb):
                    _, _, ref = workload.check(size)
                same = bool(torch.equal(out, ref))
                ok, text = ok and same, text + ("; same bits as the variants.toml config" if same
                                                else "; differs from the variants.toml config")
            checked[v.key] = (ok, text)
        return checked[v.key]

    by_key = {v.key: v for v in cands}
    winners: List[Tuple[Optional[int], Variant, Dict[str, float], str]] = []
    for size, times in per_size:
        ranked = sorted((k for k in times if k not in failed), key=times.get)
        for k in ranked:
            ok, text = check(by_key[k], size)
            if ok:
                winners.append((size, by_key[k], times, text))
                break
            failed[k] = f"check failed: {text}"
        else:
            result.error = f"no candidate passed the check at seqlen {size}: " + \
                "; ".join(f"{k.rsplit('|', 1)[-1]}: {why}" for k, why in failed.items())
            return result
    # A decoding winner is a choice of its own (tuning.py, "Decoding"); the
    # others make one choice per run of buckets with the same winner, the
    # last covering the rest.
    def decoding(size) -> bool:
        return size is not None and size == workload.decode_rows

    buckets = [wn for wn in winners if not decoding(wn[0])]
    for size, w, times, text in sorted(winners, key=lambda wn: not decoding(wn[0])):
        runner = next((k for k in sorted(times, key=times.get) if k != w.key), None)
        row = {"seqlen": size if size is not None else "open", "at": workload.shape(size),
               "us": round(times[w.key], 2), "fallback_us": round(times[fallback.key], 2)}
        if runner:
            row.update(runner_up=_config_text(by_key[runner].config),
                       runner_up_us=round(times[runner], 2))
        decode = decoding(size)
        say(f"  {'decoding ' if decode else ''}{size if size is not None else 'any'}: "
            f"{_config_text(w.config)} {times[w.key]:.1f} us (variants.toml config "
            f"{times[fallback.key]:.1f} us)")
        entry = {"kernel": w.kernel, "functional": {k: [v] for k, v in w.functional.items()},
                 "seqlen_max": None, **({"seqlen_q_max": size} if decode else {}),
                 "config": dict(w.config), "measured": [row], "check": text, "candidates": len(cands)}
        if decode:
            result.runs.append(entry)
            continue
        bound = None if size == buckets[-1][0] else _bucket_of(size)
        last = result.runs[-1] if result.runs else None
        if last and "seqlen_q_max" not in last and last["config"] == w.config:
            last["seqlen_max"] = bound
            last["measured"].append(row)
        else:
            result.runs.append(dict(entry, seqlen_max=bound))
    rejected = {k.rsplit("|", 1)[-1]: why for k, why in failed.items()}
    if rejected:
        result.runs[-1]["rejected"] = rejected
    return result


def _point_of(choice: Dict[str, Any]) -> Optional[Tuple[str, Tuple]]:
    """The one functional point an entry names, or None if it names several."""
    func = choice.get("functional") or {}
    if not all(len(v) == 1 for v in func.values()):
        return None
    return choice["kernel"], tuple(sorted((k, v[0]) for k, v in func.items()))


@dataclass(frozen=True)
class _Previous:
    """The tuning file that was at ``--out`` when the run started, read once."""
    raw: Dict[str, Any]
    entries: Tuple[Tuple[Any, Dict[str, Any]], ...]  # (MeasuredEntry, its JSON object)

    @classmethod
    def read(cls, out: Path, arch: str) -> Optional["_Previous"]:
        if not out.is_file():
            return None
        text = out.read_text(encoding="utf-8")
        raw = json.loads(text)
        return cls(raw, tuple(zip(load_measured_text(text, arch, out).entries, raw.get("choices") or ())))


def _merged(results: List[PointResult], points: Sequence[Tuple[str, Dict[str, Any]]],
            header: Dict[str, Any], previous: Optional[_Previous]) -> Dict[str, Any]:
    """The new file: this run's choices first, then the entries of the
    previous file that still decide a bucket of some point of ``points``
    ((kernel, functional) pairs): one this run did not time and the entries
    before it do not cover. A point timed up to bucket ``b`` only (no length
    in the open bucket) keeps its earlier entries above ``b``; where it has
    none, its last winner covers the rest. A point's decoding entry
    (``seqlen_q_max``) is kept unless this run timed its decoding. Each
    choice names the GPU that measured it (``device``; earlier entries
    without one: the previous file's)."""
    doc = dict(header)
    gpu = header["device"]["name"]
    choices: List[Dict[str, Any]] = []
    # per point tuned now: the largest bucket bound timed (OPEN: every bucket is decided)
    reach: Dict[Any, Any] = {}
    decoded = set()  # the points whose decoding this run timed
    for r in results:
        if r.error:
            continue
        runs = [dict(c, device=gpu) for c in r.runs]
        choices += runs
        point = _point_of(runs[0])
        if any("seqlen_q_max" in c for c in runs):
            decoded.add(point)
        runs = [c for c in runs if "seqlen_q_max" not in c]
        if not runs:
            continue
        timed = [row["seqlen"] for c in runs for row in c["measured"]]
        top = _OPEN if "open" in timed else max(timed)
        if top is not _OPEN and previous is not None and not any(
                entry.applies(point[0], dict(point[1]), b)
                for entry, _ in previous.entries for b in _buckets_above(top)):
            top = _OPEN
        if top is not _OPEN:
            runs[-1]["seqlen_max"] = top
        reach[point] = top
    if previous is None:
        doc["choices"] = choices
        return doc
    kept_how = ""
    earlier_gpu = (previous.raw.get("device") or {}).get("name")
    for entry, old in previous.entries:
        decides = False
        for kernel, func in points:
            if kernel != entry.kernel:
                continue
            point = (kernel, tuple(sorted(func.items())))
            if entry.seqlen_q_max is not None:
                if point not in decoded and entry.decodes(kernel, func):
                    decides = True
                    decoded.add(point)
                continue
            top = reach.get(point)
            if top is _OPEN:
                continue
            undecided = list(SEQLEN_BUCKETS) + [None] if top is None else _buckets_above(top)
            if any(entry.applies(kernel, func, b) for b in undecided):
                decides = True
                if old.get("seqlen_max") is None:
                    reach[point] = _OPEN
        if decides:
            choices.append(old if "device" in old or not earlier_gpu else dict(old, device=earlier_gpu))
            if "measured" not in old:
                kept_how = previous.raw.get("how", "")
    raw = previous.raw
    earlier = raw.get("commands") or ([raw["command"]] if "command" in raw else [])
    doc["commands"] = [c for c in earlier if c not in header["commands"]] + header["commands"]
    if kept_how and kept_how != header["how"]:
        doc["how"] = f"{header['how']} Entries without \"measured\": {kept_how}"
    doc["choices"] = choices
    return doc


_OPEN = object()  # _merged: every bucket of a point is decided


def _buckets_above(bound: int) -> List[Optional[int]]:
    return [b for b in SEQLEN_BUCKETS if b > bound] + [None]


def _runs_beside(k, point) -> bool:
    """Can the workload of ``point`` launch kernel ``k`` (same dtype and head
    dim; the workloads of kernels without flags run no bias, no dropout)?"""
    if (k.dtype, k.head_dim) != (point.dtype, point.head_dim):
        return False
    return all(kf is None or kf == bool(pf)
               for kf, pf in ((k.has_bias, point.has_bias), (k.enable_dropout, point.enable_dropout)))


def _header(options: TuneOptions, torch, device, arch: str) -> Dict[str, Any]:
    rec = _device_record(torch, device)
    timed = ("compiled as the build compiles them and timed in CUDA graphs" if device.type == "cuda"
             else "run by Triton's interpreter (timings not meaningful)")
    return {
        "schema": 1, "arch": arch,
        "how": ("Measured by `aotriton-rocm tune` on the GPU each choice names (\"device\"; "
                "the file's \"device\" is the latest run's): per functional point and "
                "sequence-length bucket, the fastest of the candidates (variants.toml + "
                f"tuning/space.toml), {timed} (the shape in each choice's \"measured\"; "
                "causal and non-causal times added); each winner checked against float64 math "
                "(\"check\")."),
        "device": rec,
        "commands": [options.command],
    }


def run_tune(options: TuneOptions, stream: Optional[TextIO] = None) -> int:
    """Tune, write the file; 0 if every point got a checked winner, else 1
    (the points that did are still written)."""
    import torch

    from ...backends import functional_key
    from ...device import arch_of
    from ..build.plan import Sources, Subset
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
        b = _bucket_of(s)
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
    launchers = _Launchers(list(launchable.values()), arch, spec, sources, params_of, options,
                           device, stream)
    base = {k: (lambda key=v.key: launchers.get(key)) for k, v in support.items()
            if v.key not in launchers.rejected}

    out = options.out or sources.kernels_dir / "tuning" / f"{arch.name}.json"
    header = _header(options, torch, device, arch.name)
    previous = _Previous.read(out, arch.name)
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
            res = _tune_point(key, cands, fallback, base, launchers, workload,
                              sizes if workload.per_seqlen else [None], options, torch, device, say)
        except torch.cuda.OutOfMemoryError as exc:
            res = PointResult(key.kernel, dict(func), error=f"out of GPU memory: {exc}")
        if res.error:
            say(f"  error: {res.error}")
        say(f"  ({time.monotonic() - started:.0f} s)")
        results.append(res)
        # written after every point: an interrupted run keeps what it measured
        atomic_write_text(out, dump_measured(_merged(results, every_point, header, previous)))
    bad = [r for r in results if r.error]
    say(f"wrote {out}: {len(results) - len(bad)} of {len(results)} points tuned"
        + (f"; failed: {', '.join(r.kernel + ' ' + str(r.functional) for r in bad)}" if bad else ""))
    return 1 if bad else 0
