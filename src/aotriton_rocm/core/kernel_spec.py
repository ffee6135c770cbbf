"""Load ``kernels/variants.toml`` and enumerate the variants of each kernel per arch.

The one reader of the spec: the build tooling uses it to know what to compile,
the CPU interpreter backend to know how to call the sources. Standard library
only; triton is imported only by :mod:`.kernel_sources`. (The GPU runtime never
needs it: every archive records the argument lists and constexprs it holds.)
"""
from __future__ import annotations

import ast
import importlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Tuple

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]


class ArchSpec(Protocol):
    """What the spec needs of an arch (tooling.common.targets.ArchSpec has it; so
    does INTERPRETER_ARCH)."""
    name: str
    family: str

__all__ = [
    "INTERPRETER_ARCH",
    "VariantSpecError",
    "ConfigSpec",
    "Exclusion",
    "KernelSpec",
    "Variant",
    "VariantSpec",
    "kernels_dir",
    "load_variants",
    "variant_key",
    "parse_config",
    "OPTION_KEYS",
    "SCRATCH_ARGS",
    "WAIVER_KINDS",
    "RESOURCE_KINDS",
]

# Config keys passed to triton.compile as options (everything else in a config
# must be a constexpr of the kernel).
OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "waves_per_eu", "matrix_instr_nonkdim",
               "kpack", "maxnreg")
REQUIRED_OPTIONS = ("num_warps", "num_stages")
CONFIG_META_KEYS = ("archs", "head_dims", "when", "allow", "seqlen_max")
# A config may compile another function than its kernel's ("module:function",
# same parameters; e.g. an arch-specific Gluon implementation). It is part of
# the config's values, so the variant key and the tuning file name it.
CONFIG_FUNCTION_KEY = "function"
# What a config's ``allow = {KIND = true, reason = "..."}`` may waive in the
# code-object validator (tooling.builder.codeobject.validate_kernel): register spills
# (and the scratch memory they take), other scratch use (stack, dynamic stack),
# LDS over the arch's limit. The validator reports its resource findings by
# these kinds.
RESOURCE_KINDS = ("spills", "scratch", "lds")
WAIVER_KINDS = RESOURCE_KINDS
# functional name -> constexpr name (besides same-name-uppercased).
# head_dim is the padded tile width along the head dim (the real head dim is a
# runtime argument of the kernels).
FUNCTIONAL_CONSTEXPRS = {"head_dim": "BLOCK_D", "causal": "IS_CAUSAL"}
# constexprs with a fixed value in compiled (not interpreted) code.
FIXED_CONSTEXPRS = {"UPCAST_DOT": False}
# Triton 3.9 appends these to every compiled kernel's argument list.
SCRATCH_ARGS = (("global_scratch", "*i8"), ("profile_scratch", "*i8"))
DTYPES = ("fp16", "bf16", "fp32", "fp8e4nv", "fp8e5", "fp8e4b8", "fp8e5b16")


@dataclass(frozen=True)
class _Arch:
    name: str
    family: str


# The CPU interpreter runs the configs of the NVIDIA test target.
INTERPRETER_ARCH = _Arch(name="interpreter", family="cuda")


class VariantSpecError(ValueError):
    """variants.toml is malformed or disagrees with the kernel sources."""


def arch_in(arch: ArchSpec, archs: Tuple[str, ...]) -> bool:
    """Whether ``archs`` names ``arch``: by name, family or a named arch set it
    belongs to (ci/targets.toml [arch_sets], e.g. "rdna3"; ArchSpec.sets)."""
    names = (arch.name, arch.family) + tuple(getattr(arch, "sets", ()) or ())
    return any(n in archs for n in names)


@dataclass(frozen=True)
class Exclusion:
    """A partial functional point left out of the cartesian product, on every
    arch but those ``except_archs`` names."""

    point: Tuple[Tuple[str, Any], ...]
    except_archs: Tuple[str, ...] = ()

    def drops(self, functional: Dict[str, Any], arch: Optional[ArchSpec]) -> bool:
        if arch is not None and arch_in(arch, self.except_archs):
            return False
        return all(functional.get(k) == v for k, v in self.point)


@dataclass(frozen=True)
class ConfigSpec:
    archs: Tuple[str, ...]
    head_dims: Optional[Tuple[int, ...]]
    values: Tuple[Tuple[str, Any], ...]  # in TOML order, without archs/head_dims/allow
    # Waived validator findings: ((kind, reason), ...), kinds from WAIVER_KINDS.
    allow: Tuple[Tuple[str, str], ...] = ()
    # allow.only: the partial functional points the waiver is limited to (any
    # of them; empty: every point of the config).
    allow_only: Tuple[Tuple[Tuple[str, Any], ...], ...] = ()
    # Other functional values the config is limited to: ((name, (values...)), ...).
    when: Tuple[Tuple[str, Tuple[Any, ...]], ...] = ()
    # The longest bucket the static cost model may ship it for (None: every one).
    seqlen_max: Optional[int] = None

    @property
    def function(self) -> Optional[str]:
        """The "module:function" this config compiles instead of its kernel's, if any."""
        return dict(self.values).get(CONFIG_FUNCTION_KEY)

    def matches(self, arch: ArchSpec, functional: Dict[str, Any]) -> bool:
        if not arch_in(arch, self.archs):
            return False
        if any(name in functional and functional[name] not in values for name, values in self.when):
            return False
        if self.head_dims is not None and "head_dim" in functional:
            return functional["head_dim"] in self.head_dims
        return True


@dataclass(frozen=True)
class KernelSpec:
    name: str
    module: str  # relative to kernels/, dotted
    function: str
    args: Tuple[Tuple[str, str], ...]  # type templates, may contain "{dtype}"
    constexprs: Tuple[str, ...]
    divisible_16: Tuple[str, ...]
    grid: Tuple[str, ...]
    functional: Tuple[Tuple[str, Tuple[Any, ...]], ...]
    configs: Tuple[ConfigSpec, ...]
    exclude: Tuple[Exclusion, ...] = ()
    # Values of constexprs that a config may set and most leave alone.
    constexpr_defaults: Tuple[Tuple[str, Any], ...] = ()

    def functional_combinations(self, arch: Optional[ArchSpec] = None) -> List[Dict[str, Any]]:
        """The functional points compiled for ``arch``; without one, those of
        every arch (an exclusion with ``except_archs`` applies)."""
        names = [n for n, _ in self.functional]
        combos = [dict(zip(names, vals)) for vals in itertools.product(*(v for _, v in self.functional))]
        return [c for c in combos if not any(ex.drops(c, arch) for ex in self.exclude)]


@dataclass(frozen=True)
class Variant:
    """One compile job: a kernel at a functional point with one config, for one arch."""

    key: str
    kernel: str
    module: str
    function: str
    arch: str
    functional: Dict[str, Any]
    config: Dict[str, Any]
    constexprs: Dict[str, Any]
    options: Dict[str, Any]
    args: Tuple[Tuple[str, str], ...]  # resolved types, without the scratch args
    divisible_16: Tuple[str, ...]
    grid: Tuple[str, ...]
    # The config's waivers (kind -> reason); not part of the key or the code.
    allow: Dict[str, str] = field(default_factory=dict)
    # The config's seqlen_max (the cost model's bucket limit); not part of the key.
    seqlen_max: Optional[int] = None

    def __hash__(self) -> int:
        return hash((self.arch, self.key))


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def variant_key(kernel: str, functional: Dict[str, Any], config: Dict[str, Any]) -> str:
    """Stable key: ``attn_fwd|dtype=fp16|head_dim=128|causal=1|BLOCK_M=128,BLOCK_N=64,...``."""
    parts = [kernel]
    parts.extend(f"{k}={_fmt(v)}" for k, v in functional.items())
    parts.append(",".join(f"{k}={_fmt(v)}" for k, v in config.items()))
    return "|".join(parts)


@dataclass
class VariantSpec:
    path: Path
    kernels_dir: Path
    kernels: Dict[str, KernelSpec]
    raw_bytes: bytes = field(repr=False, default=b"")

    def variants_for(self, arch: ArchSpec,
                     extra_configs: Optional[Dict[str, Tuple[ConfigSpec, ...]]] = None
                     ) -> List[Variant]:
        """Every (kernel, functional point, config) of ``arch``: the configs
        of variants.toml, then ``extra_configs`` (per kernel, e.g. measured
        tuning winners or a search space), each config once per point."""
        out: List[Variant] = []
        seen = set()
        extra = extra_configs or {}
        for ks in self.kernels.values():
            declared = len(ks.configs)
            for func in ks.functional_combinations(arch):
                for i, cfg in enumerate(ks.configs + tuple(extra.get(ks.name, ()))):
                    if not cfg.matches(arch, func):
                        continue
                    v = _make_variant(ks, arch, func, cfg, self.path)
                    if v.key in seen:
                        if i >= declared:
                            continue  # an extra config that variants.toml already has
                        raise VariantSpecError(
                            f"{self.path}: kernel {ks.name}: two configs give the same variant "
                            f"{v.key!r} for {arch.name}")
                    seen.add(v.key)
                    out.append(v)
        return out

    def kernels_without_variants(self, arch: ArchSpec) -> List[str]:
        return [ks.name for ks in self.kernels.values()
                if not any(c.matches(arch, f) for f in ks.functional_combinations(arch) for c in ks.configs)]

    def check_sources(self) -> Dict[str, List[str]]:
        """Check each kernel's args/constexprs against its function's parameters.

        Parses the sources (no import): the function must exist, take exactly
        the spec's args and constexprs, and take the args in the spec's order.
        Returns kernel name -> the function's parameter names in order.
        """
        params_of: Dict[str, List[str]] = {}
        for ks in self.kernels.values():
            params_of[ks.name] = self._check_function(ks, ks.module, ks.function)
            for module, function in sorted({_split_function(c.function, "") for c in ks.configs if c.function}):
                params = self._check_function(ks, module, function)
                if params != params_of[ks.name]:
                    raise VariantSpecError(
                        f"{self.path}: kernel {ks.name}: {module}:{function} takes {params}, "
                        f"{ks.module}:{ks.function} takes {params_of[ks.name]}; a config's function "
                        f"must take the kernel's parameters in the same order")
        return params_of

    def _check_function(self, ks: KernelSpec, module: str, function: str) -> List[str]:
        parts = module.split(".")
        src = self.kernels_dir.joinpath(*parts[:-1], parts[-1] + ".py")
        where = f"{self.path}: kernel {ks.name} ({module}:{function})"
        try:
            tree = ast.parse(src.read_bytes(), filename=str(src))
        except OSError as e:
            raise VariantSpecError(f"{where}: cannot read {src}: {e.strerror or e}") from None
        except SyntaxError as e:
            raise VariantSpecError(f"{where}: {src} does not parse: {e}") from None
        fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and n.name == function), None)
        if fn is None:
            raise VariantSpecError(f"{where}: no top-level function {function!r} in {src}")
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        spec_args = [n for n, _ in ks.args]
        missing = [n for n in spec_args + list(ks.constexprs) if n not in params]
        extra = [n for n in params if n not in spec_args and n not in ks.constexprs]
        if missing or extra:
            raise VariantSpecError(
                f"{where}: spec and function disagree; in spec only: {missing or 'none'}; "
                f"in function only: {extra or 'none'}")
        order = [n for n in params if n not in ks.constexprs]
        if order != spec_args:
            raise VariantSpecError(
                f"{where}: the function takes its non-constexpr args in the order {order}, "
                f"the spec lists {spec_args}; the compiled ABI follows the function")
        return params


def _make_variant(ks: KernelSpec, arch: ArchSpec, func: Dict[str, Any], cfg: ConfigSpec,
                  path: Path) -> Variant:
    config = dict(cfg.values)
    where = f"{path}: kernel {ks.name}"
    constexprs: Dict[str, Any] = {}
    unset = {**FIXED_CONSTEXPRS, **dict(ks.constexpr_defaults)}  # values when a config has none
    for c in ks.constexprs:
        if c in config:
            constexprs[c] = config[c]
        elif c in unset:
            constexprs[c] = unset[c]
        else:
            src = next((f for f, cname in FUNCTIONAL_CONSTEXPRS.items() if cname == c and f in func), None)
            if src is None and c.lower() in func:
                src = c.lower()
            if src is None:
                raise VariantSpecError(f"{where}: no value for constexpr {c} "
                                       f"(config {variant_key(ks.name, func, config)})")
            constexprs[c] = func[src]
    options = {k: config[k] for k in OPTION_KEYS if k in config}
    dtype = func.get("dtype")
    args = []
    for n, t in ks.args:
        if "{dtype}" in t:
            if dtype is None:
                raise VariantSpecError(f"{where}: arg {n} uses {{dtype}} but functional has no dtype")
            t = t.replace("{dtype}", str(dtype))
        args.append((n, t))
    module, function = ks.module, ks.function
    if CONFIG_FUNCTION_KEY in config:
        module, function = _split_function(str(config[CONFIG_FUNCTION_KEY]), where)
    return Variant(key=variant_key(ks.name, func, config), kernel=ks.name, module=module,
                   function=function, arch=arch.name, functional=dict(func), config=config,
                   constexprs=constexprs, options=options, args=tuple(args),
                   divisible_16=ks.divisible_16, grid=ks.grid,
                   allow=dict(cfg.allow) if not cfg.allow_only or any(
                       all(func.get(k) == val for k, val in pt) for pt in cfg.allow_only) else {},
                   seqlen_max=cfg.seqlen_max)


def _parse_allow(allow: Any, functional: Dict[str, Tuple[Any, ...]], where: str):
    """``allow = {spills = true, reason = "...", only = [{has_bias = true}]}``
    -> ((("spills", reason),), ((("has_bias", True),),))."""
    if allow is None:
        return (), ()
    example = 'allow = {spills = true, reason = "why this is acceptable"}'
    if not isinstance(allow, dict):
        raise VariantSpecError(f"{where}: allow must be a table, e.g. {example}")
    reason = allow.get("reason")
    only = []
    for pt in allow.get("only") or ():
        if not isinstance(pt, dict) or not pt or any(
                k not in functional or v not in functional[k] for k, v in pt.items()):
            raise VariantSpecError(f"{where}: allow.only must list partial functional points of the "
                                   f"kernel ({', '.join(functional)}), e.g. only = [{{has_bias = true}}]")
        only.append(tuple(pt.items()))
    kinds = [k for k in allow if k not in ("reason", "only")]
    bad = [k for k in kinds if k not in WAIVER_KINDS]
    if bad:
        raise VariantSpecError(f"{where}: allow names {bad}; it may waive {', '.join(WAIVER_KINDS)} "
                               f"(e.g. {example})")
    if not kinds or any(allow[k] is not True for k in kinds):
        raise VariantSpecError(f"{where}: allow needs at least one of {', '.join(WAIVER_KINDS)} "
                               f"set to true, e.g. {example}")
    if not isinstance(reason, str) or not reason.strip():
        raise VariantSpecError(f"{where}: allow needs a reason (a non-empty string): {example}")
    return tuple((k, reason.strip()) for k in kinds), tuple(only)


def _parse_when(when: Any, functional: Dict[str, Tuple[Any, ...]], where: str):
    """``when = {enable_dropout = true, dtype = ["fp16", "bf16"]}`` -> (("enable_dropout", (True,)), ...)."""
    if when is None:
        return ()
    if not isinstance(when, dict) or not when:
        raise VariantSpecError(f"{where}: when must be a table of functional values, "
                               'e.g. when = {enable_dropout = true}')
    out = []
    for k, v in when.items():
        values = tuple(v) if isinstance(v, list) else (v,)
        if k not in functional or any(x not in functional[k] for x in values):
            raise VariantSpecError(f"{where}: when {k} = {v!r} is not a functional value of the "
                                   f"kernel ({', '.join(functional)})")
        out.append((str(k), values))
    return tuple(out)


def _split_function(fn: str, where: str) -> Tuple[str, str]:
    """``"flash_attention:attn_fwd"`` (or ``"dir/mod.py:fn"``) -> (dotted module, function)."""
    if ":" not in fn:
        raise VariantSpecError(f"{where}: function must be 'module:function', got {fn!r}")
    module, function = fn.split(":", 1)
    module = module.strip().replace("/", ".")
    if module.endswith(".py"):
        module = module[:-3]
    return module, function.strip()


def parse_config(c: Any, constexprs: Tuple[str, ...], functional: Dict[str, Tuple[Any, ...]],
                 where: str) -> ConfigSpec:
    """One ``[[kernels.NAME.configs]]`` table (or a table of the same form
    elsewhere, e.g. the tuning search space): archs, optional head_dims,
    when and allow, and constexpr / compile-option values."""
    if not isinstance(c, dict):
        raise VariantSpecError(f"{where}: a config is a table")
    archs = c.get("archs")
    if not archs:
        raise VariantSpecError(f"{where} lacks 'archs'")
    hd = c.get("head_dims")
    values = tuple((k, v) for k, v in c.items() if k not in CONFIG_META_KEYS)
    for k, v in values:
        if k == CONFIG_FUNCTION_KEY:
            _split_function(str(v), where)
            continue
        if k not in OPTION_KEYS and k not in constexprs:
            raise VariantSpecError(
                f"{where}: {k!r} is neither a constexpr of the kernel ({', '.join(constexprs)}) "
                f"nor a compile option ({', '.join(OPTION_KEYS)}) nor {CONFIG_FUNCTION_KEY!r}")
    for k in REQUIRED_OPTIONS:
        if k not in c:
            raise VariantSpecError(f"{where} lacks {k!r}")
    allow, allow_only = _parse_allow(c.get("allow"), functional, where)
    seqlen_max = c.get("seqlen_max")
    if seqlen_max is not None and (isinstance(seqlen_max, bool) or not isinstance(seqlen_max, int)
                                   or seqlen_max < 1):
        raise VariantSpecError(f"{where}: seqlen_max must be a positive integer (the longest "
                               f"seqlen bucket the cost model may ship the config for), not "
                               f"{seqlen_max!r}")
    return ConfigSpec(archs=tuple(str(a) for a in archs),
                      head_dims=tuple(int(h) for h in hd) if hd is not None else None,
                      values=values, allow=allow, allow_only=allow_only,
                      when=_parse_when(c.get("when"), functional, where), seqlen_max=seqlen_max)


def _parse_kernel(name: str, t: Dict[str, Any], path: Path) -> KernelSpec:
    where = f"{path}: [kernels.{name}]"

    def req(key):
        if key not in t:
            raise VariantSpecError(f"{where} lacks {key!r}")
        return t[key]

    module, function = _split_function(str(req("function")), where)
    args = []
    for a in req("args"):
        if not (isinstance(a, list) and len(a) == 2):
            raise VariantSpecError(f"{where}: each arg must be [name, type], got {a!r}")
        args.append((str(a[0]), str(a[1])))
    names = [n for n, _ in args]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise VariantSpecError(f"{where}: duplicate args {dup}")
    constexprs = tuple(str(c) for c in t.get("constexprs", ()))
    clash = [c for c in constexprs if c in names]
    if clash:
        raise VariantSpecError(f"{where}: {clash} listed both as args and constexprs")
    defaults = t.get("constexpr_defaults") or {}
    unknown = sorted(set(defaults) - set(constexprs)) if isinstance(defaults, dict) else defaults
    if unknown:
        raise VariantSpecError(f"{where}: constexpr_defaults must be a table of the kernel's "
                               f"constexprs (not {unknown!r})")
    div = tuple(str(x) for x in t.get("divisible_16", ()))
    bad = [x for x in div if x not in names]
    if bad:
        raise VariantSpecError(f"{where}: divisible_16 names unknown args {bad}")
    grid = tuple(str(g) for g in req("grid"))
    if len(grid) != 3:
        raise VariantSpecError(f"{where}: grid must have 3 expressions, got {len(grid)}")
    functional = []
    for k, vals in (t.get("functional") or {}).items():
        if not isinstance(vals, list) or not vals:
            raise VariantSpecError(f"{where}: functional.{k} must be a non-empty list")
        if k == "dtype":
            badd = [d for d in vals if d not in DTYPES]
            if badd:
                raise VariantSpecError(f"{where}: unknown dtype {badd}; known: {', '.join(DTYPES)}")
        functional.append((str(k), tuple(vals)))
    exclude = []
    fnames = {k: vals for k, vals in functional}
    for ex in t.get("exclude") or ():
        if not isinstance(ex, dict):
            raise VariantSpecError(f"{where}: each exclude entry must be a table")
        point = {k: v for k, v in ex.items() if k != "except_archs"}
        except_archs = ex.get("except_archs", [])
        if not point:
            raise VariantSpecError(f"{where}: exclude {ex!r} names no functional value")
        if not isinstance(except_archs, list) or not all(isinstance(a, str) for a in except_archs):
            raise VariantSpecError(f"{where}: exclude {ex!r}: except_archs must be a list of arch names")
        for k, v in point.items():
            if k not in fnames or v not in fnames[k]:
                raise VariantSpecError(f"{where}: exclude {ex!r}: {k}={v!r} is not a functional value")
        exclude.append(Exclusion(point=tuple(point.items()), except_archs=tuple(except_archs)))
    configs = [parse_config(c, constexprs, fnames, f"{where} configs[{i}]")
               for i, c in enumerate(t.get("configs") or ())]
    if not configs:
        raise VariantSpecError(f"{where} has no [[kernels.{name}.configs]]")
    return KernelSpec(name=name, module=module, function=function.strip(), args=tuple(args),
                      constexprs=constexprs, divisible_16=div, grid=grid,
                      functional=tuple(functional), configs=tuple(configs), exclude=tuple(exclude),
                      constexpr_defaults=tuple(defaults.items()))


def load_variants(kernels_dir, path=None) -> VariantSpec:
    """Load ``<kernels_dir>/variants.toml`` (or ``path``)."""
    kd = Path(kernels_dir)
    p = Path(path) if path is not None else kd / "variants.toml"
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise VariantSpecError(f"cannot read variant spec {p}: {e.strerror or e}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise VariantSpecError(f"{p}: invalid TOML: {e}") from None
    kernels = {name: _parse_kernel(name, t, p) for name, t in (doc.get("kernels") or {}).items()}
    if not kernels:
        raise VariantSpecError(f"{p}: no [kernels.*] defined")
    return VariantSpec(path=p, kernels_dir=kd, kernels=kernels, raw_bytes=raw)


def kernels_dir() -> Path:
    """The installed kernel sources (package ``aotriton_rocm._kernels``)."""
    return Path(importlib.import_module("aotriton_rocm._kernels").__path__[0])
