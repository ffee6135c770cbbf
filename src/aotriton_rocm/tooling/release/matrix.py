"""What ``aotriton-rocm release`` covers: its options, the ROCm profiles of
the matrix (``--rocm``, ``--default-rocm``, ``--no-default``), the targets
they give: ``default`` (no local label) and one ``rocmA.B`` per profile, and
the archs each profile builds: every arch it supports unless ``--arch`` says
otherwise, so that each extra of the runtime has its image on the index of
every ROCm release that supports the arch. ``--plan`` prints that plan and the
build commands, in ``--shards N`` shards per profile where one machine would
take too long (``build --shard K/N`` on N machines, then ``merge``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ...common.errors import UsageError
from ..package.naming import local_label

__all__ = ["DEFAULT_TARGET", "RELEASE_ARCHS", "Target", "ReleaseOptions", "matrix_profiles",
           "release_archs", "profile_archs", "plan_lines", "release_targets"]

DEFAULT_TARGET = "default"
# What a release builds per profile without --arch: every arch it supports.
RELEASE_ARCHS = ("all",)


@dataclass
class Target:
    name: str                 # "default" or "rocmA.B"
    profile: str              # "A.B": the archives it is packaged from
    local: bool               # X.Y.Z+rocmA.B wheels
    conda: bool               # also the conda packages
    dist: Path                # OUT/<name>
    index_url: Optional[str]  # where its wheels are uploaded


@dataclass(frozen=True)
class ReleaseOptions:
    publish: bool = False
    rocm: Tuple[str, ...] = ()            # () = ci/targets.toml's default profile
    arch: Tuple[str, ...] = ()            # () = the build's defaults
    default_rocm: Optional[str] = None
    no_default: bool = False
    out: Path = Path("dist")
    reuse_dist: bool = False
    build_dir: Optional[Path] = None
    conda: bool = True
    python: Tuple[str, ...] = ()
    previous: Optional[Path] = None
    index_url: Optional[str] = None
    rocm_index_url: Optional[str] = None
    channel: Optional[Path] = None
    skip: Tuple[str, ...] = ()
    source_root: Optional[Path] = None
    plan: bool = False
    shards: int = 1

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "ReleaseOptions":
        def path(v: Optional[str]) -> Optional[Path]:
            return Path(v) if v else None
        return cls(publish=a.publish, rocm=tuple(a.rocm or ()), arch=tuple(a.arch or ()),
                   default_rocm=a.default_rocm, no_default=a.no_default, out=Path(a.out),
                   reuse_dist=a.reuse_dist, build_dir=path(a.build_dir), conda=not a.no_conda,
                   python=tuple(a.python or ()), previous=path(a.previous), index_url=a.index_url,
                   rocm_index_url=a.rocm_index_url, channel=path(a.channel),
                   skip=tuple(a.skip or ()), source_root=path(a.source_root),
                   plan=getattr(a, "plan", False), shards=getattr(a, "shards", 1))


def matrix_profiles(args: ReleaseOptions, root: Path) -> Tuple[List[str], Optional[str]]:
    """(profiles of the matrix, the default build's profile or None)."""
    from ..common.targets import TargetError, load_targets

    try:
        targets = load_targets(root / "ci" / "targets.toml")
    except (TargetError, OSError) as e:
        raise UsageError(f"cannot read the ROCm profiles: {e}") from e
    wanted: List[str] = []
    for item in args.rocm or [targets.default_profile]:
        for tok in str(item).split(","):
            tok = tok.strip()
            if not tok:
                continue
            if tok == "all":
                names = list(targets.profiles)
            else:
                try:
                    names = [targets.profile(tok).name]
                except TargetError as e:
                    raise UsageError(str(e)) from e
            wanted += [n for n in names if n not in wanted]
    wanted.sort(key=lambda v: tuple(int(x) for x in v.split(".")))
    if args.no_default:
        return wanted, None
    if args.default_rocm:
        try:
            d = targets.profile(args.default_rocm).name
        except TargetError as e:
            raise UsageError(str(e)) from e
        if d not in wanted:
            raise UsageError(f"--default-rocm {d} is not in the release matrix ({', '.join(wanted)}): "
                                 f"add --rocm {d}")
        return wanted, d
    return wanted, (targets.default_profile if targets.default_profile in wanted else None)


def release_archs(args: ReleaseOptions) -> List[str]:
    """The --arch request of every profile's build."""
    return list(args.arch) or list(RELEASE_ARCHS)


def profile_archs(args: ReleaseOptions, root: Path, profiles: List[str]) -> Dict[str, List[str]]:
    """profile -> the archs its build compiles (UsageError when --arch names
    one a profile does not support)."""
    from ..common.targets import TargetError, load_targets

    try:
        targets = load_targets(root / "ci" / "targets.toml")
        return {p: [a.name for a in targets.resolve(p, release_archs(args))[1]] for p in profiles}
    except (TargetError, OSError) as e:
        raise UsageError(f"release plan: {e}") from e


def plan_lines(args: ReleaseOptions, archs: Dict[str, List[str]], build_dir: Path) -> List[str]:
    """``--plan``: per profile its archs and the commands that build them into
    the ``--build-dir`` layout the release reuses (BUILD/rocmA.B/archives)."""
    if args.shards < 1:
        raise UsageError(f"--shards {args.shards}: give 1 or more")
    arch = ",".join(release_archs(args))
    lines = []
    for p, names in archs.items():
        out = build_dir / local_label(p)
        lines.append(f"ROCm {p} ({local_label(p)}): {len(names)} archs: {', '.join(names)}")
        if args.shards == 1:
            lines.append(f"  aotriton-rocm build --rocm {p} --arch {arch} --out {out}")
            continue
        shards = [f"{out}-shard{k}" for k in range(1, args.shards + 1)]
        lines += [f"  aotriton-rocm build --rocm {p} --arch {arch} --shard {k}/{args.shards} --out {d}"
                  for k, d in enumerate(shards, 1)]
        lines.append(f"  aotriton-rocm merge {' '.join(shards)} --out {out}")
    lines.append(f"then: aotriton-rocm release --rocm {','.join(archs)} --build-dir {build_dir}"
                 + (f" --arch {arch}" if args.arch else ""))
    return lines


def _rocm_index(args: ReleaseOptions, profile: str) -> Optional[str]:
    base = args.rocm_index_url or args.index_url
    return f"{base.rstrip('/')}/{local_label(profile)}/" if base else None


def release_targets(args: ReleaseOptions, out: Path, profiles: List[str],
             default: Optional[str]) -> List[Target]:
    ts = []
    if default is not None:
        ts.append(Target(DEFAULT_TARGET, default, False, False, out / DEFAULT_TARGET, args.index_url))
    for p in profiles:
        name = local_label(p)
        ts.append(Target(name, p, True, args.conda, out / name, _rocm_index(args, p)))
    return ts
