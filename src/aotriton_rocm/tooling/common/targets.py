"""ROCm profiles x archs: load ``ci/targets.toml`` and resolve build targets.

Build-time only.
"""
from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ...common.errors import UsageError

__all__ = [
    "TargetError",
    "ArchSpec",
    "Profile",
    "Targets",
    "load_targets",
]

# Archs accepted with any ROCm profile (NVIDIA test target).
ANY_PROFILE_BACKENDS = ("cuda",)


class TargetError(UsageError, ValueError):
    """A bad profile/arch request or a malformed targets file."""


@dataclass(frozen=True)
class ArchSpec:
    name: str
    backend: str  # "hip" | "cuda"
    warp_size: int
    family: str  # "cdna" | "rdna" | "cuda"
    lds_bytes: Optional[int] = None  # hip: LDS per workgroup
    capability: Optional[int] = None  # cuda: compute capability, e.g. 90
    # hip: ELF e_flags EF_AMDGPU_MACH value and the register budget of the
    # static occupancy estimate (see ci/targets.toml and tooling/builder/codeobject.py).
    mach: Optional[int] = None
    vgpr_file: Optional[int] = None
    vgpr_mode: Optional[str] = None  # "unified" | "split" | "vgpr"
    vgpr_granule: Optional[int] = None
    max_waves: Optional[int] = None
    simds_per_cu: Optional[int] = None
    # The named arch sets ([arch_sets]) this arch is in, e.g. ("rdna3", "rdna",
    # "all"): a variants.toml config may name a set in its archs.
    sets: Tuple[str, ...] = ()

    def gpu_target_args(self) -> Tuple[str, Any, int]:
        """Arguments for ``triton.backends.compiler.GPUTarget``."""
        if self.backend == "cuda":
            return ("cuda", int(self.capability), self.warp_size)
        return ("hip", self.name, self.warp_size)

    @property
    def max_shared_bytes(self) -> Optional[int]:
        if self.lds_bytes is not None:
            return self.lds_bytes
        if self.backend == "cuda" and self.capability is not None:
            # Opt-in dynamic shared memory per block.
            return {90: 232448, 80: 166912, 89: 101376, 86: 101376}.get(self.capability)
        return None


@dataclass(frozen=True)
class Profile:
    name: str
    archs: Tuple[str, ...]
    hip_soname: str = ""
    code_object_version: Optional[int] = None


@dataclass
class Targets:
    path: Path
    archs: Dict[str, ArchSpec]
    profiles: Dict[str, Profile]
    default_profile: str
    default_archs: Tuple[str, ...]
    raw_bytes: bytes = field(repr=False, default=b"")
    # Named arch sets ([arch_sets] in the targets file), in file order.
    arch_sets: Dict[str, Tuple[str, ...]] = field(default_factory=dict)

    # -- resolution ------------------------------------------------------
    def profile(self, name: Optional[str]) -> Profile:
        if name is None or str(name).strip() == "":
            name = self.default_profile
        key = str(name).strip()
        low = key.lower()
        if low.startswith("rocm"):
            key = key[4:].lstrip("-_ ")
        if key not in self.profiles:
            raise TargetError(
                f"unknown ROCm profile {name!r}; valid profiles: {', '.join(self.profiles)} "
                f"(defined in {self.path})")
        return self.profiles[key]

    def families(self) -> Dict[str, List[str]]:
        fams: Dict[str, List[str]] = {}
        for a in self.archs.values():
            fams.setdefault(a.family, []).append(a.name)
        return fams

    def named_sets(self) -> Dict[str, List[str]]:
        """Every set name --arch accepts: the [arch_sets] of the targets file,
        then each family not already a set ("cdna", "rdna", "cuda")."""
        sets = {k.lower(): list(v) for k, v in self.arch_sets.items()}
        for fam, names in self.families().items():
            sets.setdefault(fam.lower(), names)
        return sets

    def valid_archs(self, profile: Profile) -> List[str]:
        extra = [a.name for a in self.archs.values()
                 if a.backend in ANY_PROFILE_BACKENDS and a.name not in profile.archs]
        return list(profile.archs) + extra

    def resolve(self, profile: Optional[str], archs: Optional[Iterable[str]]) -> Tuple[Profile, List[ArchSpec]]:
        """Validate a profile and an arch request; returns (profile, [ArchSpec]).

        ``archs`` items may be comma-separated strings; each token is an arch
        name, a named set from ``[arch_sets]`` or a family ("cdna3", "rdna4",
        "cdna", ...: the profile's archs of that set), "default" (targets.toml
        default_archs) or "all" (every arch of the profile, unless the file
        defines its own "all" set). None or an empty list means "default";
        items that name nothing (``[""]``) are an error. Unknown
        archs, and archs the profile does not support, fail at once.
        """
        prof = self.profile(profile)
        tokens: List[str] = []
        for item in (archs or ()):
            tokens.extend(t.strip() for t in str(item).split(",") if t.strip())
        if not tokens and archs:  # e.g. --arch '' (an unset shell variable)
            raise TargetError(
                f"--arch {' '.join(repr(str(a)) for a in archs)} names no arch; pass archs "
                f"(gfx942,sm_90), a set ({', '.join(sorted(self.named_sets())) or 'cdna'}), "
                f"'default' or 'all', or leave --arch out for the default set")
        if not tokens:
            tokens = ["default"]
        valid = self.valid_archs(prof)
        fams = self.named_sets()
        out: List[str] = []
        unknown: List[str] = []
        unsupported: List[str] = []
        for t in tokens:
            low = t.lower()
            if low == "sm90":
                low = "sm_90"
            if low == "default":
                names = list(self.default_archs)
            elif low == "all" and "all" not in fams:
                names = list(prof.archs)
            elif low in fams and low not in self.archs:
                names = [a for a in fams[low] if a in valid]
                if not names:
                    unsupported.append(f"{t} (none of {', '.join(fams[low])} is in profile {prof.name})")
                    continue
            elif low in self.archs:
                names = [low]
            else:
                unknown.append(t)
                continue
            for n in names:
                if n not in valid:
                    unsupported.append(n)
                elif n not in out:
                    out.append(n)
        if unknown:
            raise TargetError(
                f"unknown arch {', '.join(unknown)}; valid archs for ROCm {prof.name}: "
                f"{', '.join(valid)} (or a set: {', '.join(n for n in fams if n != 'all')}; "
                f"'default'; 'all')")
        if unsupported:
            def supports(p: Profile, u: str) -> bool:
                name = u.split(" ")[0].lower()
                members = fams.get(name, [name]) if name not in self.archs else [name]
                return any(m in self.valid_archs(p) for m in members)
            others = [p.name for p in self.profiles.values()
                      if all(supports(p, u) for u in unsupported)]
            hint = f"; profiles that support it: {', '.join(others)}" if others else ""
            raise TargetError(
                f"arch {', '.join(unsupported)} not supported by ROCm profile {prof.name}; "
                f"valid archs for ROCm {prof.name}: {', '.join(valid)}{hint}")
        return prof, [self.archs[n] for n in out]


def _req(table: Dict[str, Any], key: str, where: str, path: Path):
    if key not in table:
        raise TargetError(f"{path}: {where} lacks {key!r}")
    return table[key]


def load_targets(path) -> Targets:
    """Load and check ``ci/targets.toml``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise TargetError(f"cannot read targets file {p}: {e}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TargetError(f"{p}: invalid TOML: {e}") from None
    archs: Dict[str, ArchSpec] = {}
    for name, t in (doc.get("archs") or {}).items():
        backend = _req(t, "backend", f"[archs.{name}]", p)
        if backend not in ("hip", "cuda"):
            raise TargetError(f"{p}: [archs.{name}] backend must be 'hip' or 'cuda', not {backend!r}")
        if backend == "cuda" and "capability" not in t:
            raise TargetError(f"{p}: [archs.{name}] (cuda) lacks 'capability'")
        vmode = t.get("vgpr_mode")
        if vmode is not None and vmode not in ("unified", "split", "vgpr"):
            raise TargetError(f"{p}: [archs.{name}] vgpr_mode must be 'unified', 'split' or 'vgpr', "
                              f"not {vmode!r}")

        def opt_int(key: str) -> Optional[int]:
            return int(t[key]) if key in t else None
        archs[name] = ArchSpec(
            name=name, backend=backend, warp_size=int(_req(t, "warp_size", f"[archs.{name}]", p)),
            family=str(_req(t, "family", f"[archs.{name}]", p)),
            lds_bytes=opt_int("lds_bytes"), capability=opt_int("capability"), mach=opt_int("mach"),
            vgpr_file=opt_int("vgpr_file"), vgpr_mode=vmode, vgpr_granule=opt_int("vgpr_granule"),
            max_waves=opt_int("max_waves"), simds_per_cu=opt_int("simds_per_cu"))
    if not archs:
        raise TargetError(f"{p}: no [archs] defined")
    profiles: Dict[str, Profile] = {}
    for name, t in (doc.get("profiles") or {}).items():
        plist = [str(a) for a in _req(t, "archs", f"[profiles.{name!r}]", p)]
        bad = [a for a in plist if a not in archs]
        if bad:
            raise TargetError(f"{p}: profile {name} lists archs not in [archs]: {', '.join(bad)}")
        profiles[name] = Profile(name=name, archs=tuple(plist), hip_soname=str(t.get("hip_soname", "")),
                                 code_object_version=t.get("code_object_version"))
    if not profiles:
        raise TargetError(f"{p}: no [profiles] defined")
    default_profile = str(doc.get("default_profile") or next(iter(profiles)))
    if default_profile not in profiles:
        raise TargetError(f"{p}: default_profile {default_profile!r} is not a profile")
    default_archs = tuple(str(a) for a in doc.get("default_archs") or profiles[default_profile].archs)
    bad = [a for a in default_archs if a not in archs]
    if bad:
        raise TargetError(f"{p}: default_archs lists unknown archs: {', '.join(bad)}")
    arch_sets: Dict[str, Tuple[str, ...]] = {}
    for name, members in (doc.get("arch_sets") or {}).items():
        if not isinstance(members, list) or not members:
            raise TargetError(f"{p}: [arch_sets] {name} must be a non-empty list of archs")
        bad = [str(a) for a in members if str(a) not in archs]
        if bad:
            raise TargetError(f"{p}: arch set {name} lists archs not in [archs]: {', '.join(bad)}; "
                              f"valid archs: {', '.join(archs)}")
        if name.lower() in archs or name.lower() == "default":
            raise TargetError(f"{p}: arch set name {name!r} clashes with an arch or 'default'")
        arch_sets[name] = tuple(str(a) for a in members)
    for name, spec in list(archs.items()):
        archs[name] = replace(spec, sets=tuple(s for s, m in arch_sets.items() if name in m))
    return Targets(path=p, archs=archs, profiles=profiles, default_profile=default_profile,
                   default_archs=default_archs, raw_bytes=raw, arch_sets=arch_sets)
