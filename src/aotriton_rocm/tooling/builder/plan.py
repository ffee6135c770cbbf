"""Build stage 1, plan: what a build compiles. Resolves the ROCm profile
and archs (ci/targets.toml), enumerates the variants (kernels/variants.toml),
keeps the functional points a subset asks for (``build --only``), and turns
each variant into a content-addressed compile task. Build-time only.
"""
from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

from ... import _version
from ...common.errors import CommandError, UsageError
from ...core.kernel_spec import Variant, VariantSpec, VariantSpecError, load_variants
from .cache import cache_key, kernel_sources_hash
from .triton_compile import COMPILE_ENV, CompileTask
from ..common.source_tree import find_source_root
from ..common.targets import ArchSpec, Profile, load_targets
from .tuning import TuningError, load_measured, measured_configs
from ..common.inputs_hash import build_inputs_hash, module_sources_hash

__all__ = ["BuildError", "Sources", "Subset", "BuildPlan", "plan_build", "build_inputs_hash",
           "compile_task_for", "plan_variants",
           "parse_shard", "shard_keys"]


class BuildError(CommandError):
    """Compilation or validation failed; ``errors`` lists one line per problem."""

    def __init__(self, message: str, errors: Sequence[str] = (), report_path: Optional[Path] = None):
        super().__init__(message)
        self.errors = list(errors)
        self.report_path = report_path


@dataclass(frozen=True)
class Sources:
    """The build's inputs in a checkout: the kernel sources and the targets file."""
    kernels_dir: Path
    targets_path: Path

    @classmethod
    def find(cls, source_root=None, kernels_dir=None, targets_path=None) -> "Sources":
        """``<source_root>/kernels`` and ``<source_root>/ci/targets.toml``,
        either overridden; the root is found from the cwd when not given."""
        if kernels_dir is None or targets_path is None:
            root = Path(source_root) if source_root is not None else find_source_root()
            kernels_dir = kernels_dir if kernels_dir is not None else root / "kernels"
            targets_path = targets_path if targets_path is not None else root / "ci" / "targets.toml"
        return cls(Path(kernels_dir).resolve(), Path(targets_path))


def _value_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Subset:
    """Whole functional points to build (``--only dtype=fp16,head_dim=128``):
    per functional name (or ``kernel``) the accepted values; several values of
    one name are alternatives (``dtype=fp16|bf16``, or the name given twice),
    different names must all match. A variant without that name (a kernel
    whose functional points do not have it) is not constrained by it. Empty:
    everything."""
    accepted: Tuple[Tuple[str, FrozenSet[str]], ...] = ()

    @classmethod
    def parse(cls, texts: Iterable[str]) -> "Subset":
        acc: Dict[str, Set[str]] = {}
        for text in texts:
            for item in str(text).split(","):
                item = item.strip()
                if not item:
                    continue
                name, eq, values = item.partition("=")
                if not eq or not name.strip() or not values.strip():
                    raise UsageError(f"--only {text!r}: want NAME=VALUE[|VALUE...] items separated "
                                     f"by commas, e.g. dtype=fp16,head_dim=128")
                acc.setdefault(name.strip(), set()).update(
                    v.strip().lower() for v in values.split("|") if v.strip())
        return cls(tuple(sorted((k, frozenset(v)) for k, v in acc.items())))

    def __bool__(self) -> bool:
        return bool(self.accepted)

    def accepts(self, v: Variant) -> bool:
        return self.accepts_point(v.kernel, v.functional)

    def accepts_point(self, kernel: str, functional: Dict[str, Any]) -> bool:
        point = dict(functional, kernel=kernel)
        return all(name not in point or _value_text(point[name]).lower() in values
                   for name, values in self.accepted)

    def check_names(self, variants: Sequence[Variant]) -> None:
        self.check_known({k for v in variants for k in v.functional})

    def check_known(self, functional_names: Iterable[str]) -> None:
        """Refuse a name no point has: it would constrain nothing."""
        known = {"kernel"} | set(functional_names)
        unknown = [name for name, _ in self.accepted if name not in known]
        if unknown:
            raise UsageError(f"--only: no functional point has {', '.join(unknown)}; "
                             f"names: {', '.join(sorted(known))}")

    def text(self) -> str:
        return ",".join(f"{k}={'|'.join(sorted(v))}" for k, v in self.accepted)


@dataclass
class BuildPlan:
    """Everything later stages need: the targets, the spec, the inputs hash
    and, per arch, the (variant, compile task) pairs to build."""
    profile: Profile
    archs: List[ArchSpec]
    spec: VariantSpec
    sources: Sources
    triton_version: str
    sources_hash: str
    inputs_hash: str
    items: Dict[str, List[Tuple[Variant, CompileTask]]]
    warnings: Dict[str, List[str]] = field(default_factory=dict)
    subset: str = ""    # ``--only`` as text: the archives hold only these points

    @property
    def keys(self) -> Set[str]:
        return {t.cache_key for items in self.items.values() for _, t in items}

    def unique_tasks(self) -> List[CompileTask]:
        seen: Set[str] = set()
        tasks = []
        for items in self.items.values():
            for _, t in items:
                if t.cache_key not in seen:
                    seen.add(t.cache_key)
                    tasks.append(t)
        return tasks

    def restricted_to(self, keys: Iterable[str]) -> "BuildPlan":
        """The plan of the tasks whose cache keys are in ``keys`` (a shard)."""
        mine = set(keys)
        return replace(self, items={a: [(v, t) for v, t in items if t.cache_key in mine]
                                    for a, items in self.items.items()})


def parse_shard(text: str) -> Tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N; ValueError with a clear message otherwise."""
    try:
        k_s, n_s = str(text).split("/")
        k, n = int(k_s), int(n_s)
    except ValueError:
        raise ValueError(f"--shard takes K/N (e.g. 2/3), not {text!r}") from None
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"--shard {text}: need 1 <= K <= N")
    return k, n


def shard_keys(keys, k: int, n: int) -> List[str]:
    """Shard ``k`` of ``n`` (1-based) of the unique cache ``keys``: sorted,
    every n-th starting at k-1 (see the module docstring for why)."""
    return sorted(set(keys))[k - 1::n]


def _triton_version() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"triton is not installed; the build needs the pinned compiler: "
                         f"pip install triton=={_version.TRITON_VERSION} "
                         f"(or pip install 'aotriton-rocm[build]')") from None


def compile_task_for(v: Variant, params: List[str], arch: ArchSpec, kernels_dir: Path, sources_hash: str,
              triton_version: str) -> CompileTask:
    arg_types = dict(v.args)
    signature = tuple((p, "constexpr" if p in v.constexprs else arg_types[p]) for p in params)
    div_indices = tuple(params.index(n) for n in v.divisible_16)
    target = arch.gpu_target_args()
    options = tuple(sorted(v.options.items()))
    key = cache_key(sources_hash=sources_hash, module=v.module, function=v.function,
                    signature=signature, constexprs=v.constexprs, div_indices=div_indices,
                    target=target, options=dict(options), triton_version=triton_version,
                    env=COMPILE_ENV)
    return CompileTask(cache_key=key, variant_key=v.key, arch=arch.name, kernels_dir=str(kernels_dir),
                       module=v.module, function=v.function, signature=signature,
                       constexprs=tuple(v.constexprs.items()), div_indices=div_indices,
                       target=target, options=options)


def plan_build(profile: Optional[str], archs: Optional[Sequence[str]], sources: Sources,
               only: Subset = Subset()) -> BuildPlan:
    """Resolve targets, read and check the spec, enumerate the variants of
    each arch (those ``only`` accepts), make their compile tasks. Raises
    TargetError / VariantSpecError / UsageError for bad requests or specs,
    BuildError for the wrong compiler: nothing is compiled yet."""
    targets = load_targets(sources.targets_path)
    prof, arch_specs = targets.resolve(profile, archs)
    spec = load_variants(sources.kernels_dir)
    params_of = spec.check_sources()
    triton_version = _triton_version()
    if triton_version != _version.TRITON_VERSION:
        raise BuildError(f"installed triton is {triton_version}, aotriton-rocm {_version.__version__} "
                         f"ships code compiled by triton {_version.TRITON_VERSION} exactly: "
                         f"pip install triton=={_version.TRITON_VERSION}")
    sources_hash = kernel_sources_hash(sources.kernels_dir)
    inputs_hash = build_inputs_hash(sources.kernels_dir, spec.raw_bytes, targets.raw_bytes,
                                    triton_version)
    items: Dict[str, List[Tuple[Variant, CompileTask]]] = {}
    warnings: Dict[str, List[str]] = {}
    for a in arch_specs:
        try:
            tuned = measured_configs(load_measured(sources.kernels_dir, a.name), spec)
        except TuningError as e:
            raise BuildError(str(e)) from None
        every = spec.variants_for(a, tuned)
        if only:
            only.check_names(every)
        vs = [v for v in every if only.accepts(v)]
        if not vs and every:
            raise UsageError(f"--only {only.text()} matches none of the {len(every)} variants "
                             f"for {a.name}")
        if not vs:
            raise VariantSpecError(
                f"{spec.path}: no config matches {a.name} (family {a.family}); add "
                f"[[kernels.*.configs]] with archs = [\"{a.family}\"] or [\"{a.name}\"], or drop {a.name}")
        warnings[a.name] = [f"kernel {k} has no config for {a.name}" for k in spec.kernels_without_variants(a)]
        items[a.name] = _items(vs, params_of, a, sources, triton_version)
    return BuildPlan(profile=prof, archs=list(arch_specs), spec=spec, sources=sources,
                     triton_version=triton_version, sources_hash=sources_hash,
                     inputs_hash=inputs_hash, items=items, warnings=warnings,
                     subset=only.text())


def _items(variants: Sequence[Variant], params_of: Dict[str, List[str]], arch: ArchSpec,
           sources: Sources, triton_version: str) -> List[Tuple[Variant, CompileTask]]:
    """The compile tasks of ``variants``; each cache key covers the sources
    its module reads (module_sources_hash), not the whole kernels/ tree."""
    hashes: Dict[str, str] = {}
    items = []
    for v in variants:
        if v.module not in hashes:
            hashes[v.module] = module_sources_hash(sources.kernels_dir, v.module)
        items.append((v, compile_task_for(v, params_of[v.kernel], arch, sources.kernels_dir,
                                          hashes[v.module], triton_version)))
    return items


def plan_variants(variants: Sequence[Variant], arch: ArchSpec, spec: VariantSpec,
                  sources: Sources, params_of: Dict[str, List[str]]) -> BuildPlan:
    """The plan that compiles exactly ``variants`` for ``arch`` with the
    installed triton, whatever its version (``tune`` measures what the GPU
    machine's compiler makes; only ``build`` is pinned). ``params_of``:
    ``spec.check_sources()``."""
    profile, _ = load_targets(sources.targets_path).resolve(None, [arch.name])
    version = _triton_version()
    sources_hash = kernel_sources_hash(sources.kernels_dir)
    return BuildPlan(profile=profile, archs=[arch], spec=spec, sources=sources,
                     triton_version=version, sources_hash=sources_hash, inputs_hash="",
                     items={arch.name: _items(variants, params_of, arch, sources, version)})
