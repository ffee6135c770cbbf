"""How ``aotriton-rocm tune`` measures one functional point: its candidate
configs compiled (and validated) as the build would ship them, each timed
at every sequence length through the op's real launch, the fastest one that
passes the float64 check chosen per bucket. Build-time only."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ...common.errors import CommandError
from ...core.kernel_spec import Variant
from .tuning_file import PointResult, bucket_of

__all__ = ["Launchers", "tune_point"]


def _config_text(config: Dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


class Launchers:
    """Launchers by variant key: compiled ahead (in parallel, as the build
    compiles) on a GPU, loaded on first use; the interpreter on the CPU.
    ``options``: the run's TuneOptions (its ``work`` and ``jobs``)."""

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
        from ..builder.compile import Executor, compile_plan
        from ..builder.plan import plan_variants
        from ..builder.cache import CompileCache
        from ..builder.validate import validate_plan
        from ..builder.triton_compile import worker_init

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
                from ..builder.triton_compile import compile_task
                self._made[key] = compiled_launcher(v, compile_task(self._tasks[key]),
                                                    self.params_of[v.kernel])
            else:
                self._made[key] = interpreted_launcher(v, self.spec.kernels[v.kernel])
        return self._made[key]


def tune_point(key, cands: List[Variant], fallback: Variant, base: Dict, launchers: Launchers,
               workload, sizes: Sequence[Optional[int]], budget_ms: float, torch,
               device, say) -> PointResult:
    """Time each candidate of ``key`` in the workload (``base``: the variant
    serving every other functional key), check the fastest, and return the
    choices."""
    from ...core.backends import using
    from .launch import TuneBackend

    result = PointResult(cands[0].kernel, dict(cands[0].functional))
    failed = {v.key: launchers.rejected[v.key] for v in cands if v.key in launchers.rejected}
    live = [v for v in cands if v.key not in failed]
    if fallback.key in failed:
        result.error = f"the variants.toml config {fallback.key} cannot run: {failed[fallback.key]}"
        return result

    def backend(v: Variant, **timing) -> TuneBackend:
        tb = TuneBackend(base, launchers.get, device, **timing)
        tb.force(key, v)
        return tb

    per_size: List[Tuple[Optional[int], Dict[str, float]]] = []
    for size in sizes:
        inputs = workload.prepare(size)
        total = {v.key: 0.0 for v in live}
        for causal in workload.variants:
            for v in live:
                if v.key in failed:
                    continue
                # the op runs as the runtime plans it with this config; its
                # last launch of the kernel is timed where it runs
                tb = backend(v, timed=key, budget_ms=budget_ms)
                try:
                    with using(tb):
                        workload.run(inputs, causal)
                except Exception as exc:  # e.g. out of shared memory when the module loads
                    failed[v.key] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                    continue
                if not tb.times:
                    raise CommandError(f"tune: the workload launched no {key.kernel} of {key}")
                total[v.key] += tb.times[-1]
        del inputs
        per_size.append((size, {k: t for k, t in total.items() if k not in failed}))
    if device.type == "cuda":
        torch.cuda.empty_cache()

    checked: Dict[str, Tuple[bool, str]] = {}

    def check(v: Variant, size) -> Tuple[bool, str]:
        if v.key not in checked:
            with using(backend(v)):
                ok, text, out = workload.check(size)
            if workload.same_bits and v.key != fallback.key:
                with using(backend(fallback)):
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
        bound = None if size == buckets[-1][0] else bucket_of(size)
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
