"""AMD's own attention kernels as a build-time reference: the ``amd-aiter``
wheel from PyPI, read for what the report compares our kernels with, and
never shipped or imported at run time.

From the wheel only these members are extracted (into the reference cache,
default ``~/.cache/aotriton-rocm/reference``, or ``$AOTRITON_ROCM_REFERENCE_CACHE``):

* AMD's Triton FlashAttention (``aiter/ops/triton/_triton_kernels/mha.py``,
  the forward, and ``mha_onekernel_bwd.py``, the backward) with the helpers
  they import (``aiter/ops/triton/utils/``), and its MI300X / MI350X
  configurations (``aiter/ops/triton/configs/MI300X-MHA-DEFAULT.json``,
  ``MI350X-MHA-DEFAULT.json``);
* AMD's hand-written assembly FMHA v3 code objects for gfx942 and gfx950
  (``aiter_meta/hsa/<arch>/fmha_v3_{fwd,bwd}/``), the plain variants
  (no group-mode, sliding-window or bottom-right-causal ones).

The package directories above the kernels get empty ``__init__.py`` files:
aiter's own import the whole library (and its compiled extensions).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...common.errors import UsageError
from ...common.files import atomic_write_bytes

__all__ = ["PACKAGE", "ReferenceError", "default_cache_dir", "download_wheel", "ReferenceWheel",
           "CONFIG_FILES"]

PACKAGE = "amd-aiter"
CACHE_ENV = "AOTRITON_ROCM_REFERENCE_CACHE"
_TRITON = "aiter/ops/triton/"
KERNEL_FILES = (_TRITON + "_triton_kernels/mha.py", _TRITON + "_triton_kernels/mha_onekernel_bwd.py")
CONFIG_FILES = {"gfx942": _TRITON + "configs/MI300X-MHA-DEFAULT.json",
                "gfx950": _TRITON + "configs/MI350X-MHA-DEFAULT.json"}
ASM_DIRS = {("gfx942", "fwd"): "aiter_meta/hsa/gfx942/fmha_v3_fwd/MI300/",
            ("gfx942", "bwd"): "aiter_meta/hsa/gfx942/fmha_v3_bwd/",
            ("gfx950", "fwd"): "aiter_meta/hsa/gfx950/fmha_v3_fwd/",
            ("gfx950", "bwd"): "aiter_meta/hsa/gfx950/fmha_v3_bwd/"}
# fwd_hd128_bf16[_causal][_rtne].co; bwd_hd128_bf16[_causal]_a32[_rtne][_psskddv].co
_ASM_NAME = re.compile(r"^(fwd|bwd)_hd(\d+)_(bf16|fp16)(_causal)?(?:_a(16|32))?(_rtn[ea]|_rtz)?(?:_([a-z]+))?\.co$")
_EXTRACTED = ".extracted"


class ReferenceError(UsageError):
    """The reference wheel is missing, unreadable or cannot be downloaded."""


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "aotriton-rocm" / "reference"


def download_wheel(cache_dir: Path, timeout: float = 600) -> Path:
    """The amd-aiter wheel in ``cache_dir/wheels`` (the newest there), or
    downloaded there with ``pip download --no-deps``; ReferenceError when
    pip cannot reach the index."""
    dest = Path(cache_dir) / "wheels"
    have = sorted(dest.glob("amd_aiter-*.whl"))
    if have:
        return have[-1]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "-d", str(dest), PACKAGE]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ReferenceError(f"could not download {PACKAGE} ({e}); download it where the index is "
                             f"reachable (pip download --no-deps {PACKAGE}) and pass --reference-wheel "
                             f"PATH") from None
    have = sorted(dest.glob("amd_aiter-*.whl"))
    if r.returncode != 0 or not have:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise ReferenceError(f"could not download {PACKAGE} from the package index ({tail[0]}): "
                             f"offline? download it elsewhere with `pip download --no-deps {PACKAGE}` "
                             f"and pass --reference-wheel PATH")
    return have[-1]


def _wanted(name: str) -> bool:
    if name in KERNEL_FILES or name in CONFIG_FILES.values():
        return True
    if name.startswith(_TRITON + "utils/") and name.endswith(".py"):
        return True
    for d in ASM_DIRS.values():
        if name.startswith(d) and "/" not in name[len(d):]:
            m = _ASM_NAME.match(name[len(d):])
            return bool(m) and m.group(7) in (None, "pddv", "psskddv", "pssk")
    return False


@dataclass(frozen=True)
class AsmKernel:
    """One aiter assembly code object: its wheel member name and bytes."""

    member: str
    code: bytes


@dataclass
class ReferenceWheel:
    """An extracted amd-aiter wheel: ``root`` holds the members listed in the
    module doc, at their paths in the wheel."""

    wheel: Path
    version: str
    root: Path

    @classmethod
    def open(cls, wheel: Path, cache_dir: Optional[Path] = None) -> "ReferenceWheel":
        wheel = Path(wheel)
        m = re.match(r"^amd_aiter-([^-]+)-", wheel.name)
        if not wheel.is_file() or not m:
            raise ReferenceError(f"{wheel}: not an amd-aiter wheel file (amd_aiter-VERSION-*.whl)")
        root = Path(cache_dir or default_cache_dir()) / "extracted" / wheel.name[:-len(".whl")]
        if not (root / _EXTRACTED).is_file():
            cls._extract(wheel, root)
        return cls(wheel=wheel, version=m.group(1), root=root)

    @staticmethod
    def _extract(wheel: Path, root: Path) -> None:
        try:
            with zipfile.ZipFile(wheel) as z:
                names = [n for n in z.namelist() if _wanted(n)]
                missing = [f for f in KERNEL_FILES + tuple(CONFIG_FILES.values()) if f not in names]
                if missing:
                    raise ReferenceError(f"{wheel.name} lacks {', '.join(missing)}: not the amd-aiter "
                                         f"layout this report reads")
                for n in names:
                    atomic_write_bytes(root / n, z.read(n))
        except (zipfile.BadZipFile, OSError) as e:
            raise ReferenceError(f"{wheel}: unreadable wheel ({e})") from None
        pkg = root / "aiter" / "ops" / "triton"
        for d in (pkg, pkg / "_triton_kernels", pkg / "utils", pkg / "utils" / "_triton"):
            atomic_write_bytes(d / "__init__.py", b"")
        atomic_write_bytes(root / _EXTRACTED, b"ok\n")

    @property
    def kernels_dir(self) -> Path:
        """The directory whose modules are ``_triton_kernels.mha`` etc."""
        return self.root / "aiter" / "ops" / "triton"

    def config(self, arch: str) -> Dict[str, Any]:
        name = CONFIG_FILES.get(arch)
        if name is None:
            raise ReferenceError(f"{PACKAGE} has MHA configs for {', '.join(CONFIG_FILES)}, not {arch}")
        return json.loads((self.root / name).read_text(encoding="utf-8"))

    def config_source(self, arch: str) -> str:
        return f"{PACKAGE} {self.version} {CONFIG_FILES[arch]}"

    def asm(self, arch: str, direction: str, head_dim: int, dtype: str, causal: bool) -> Optional[AsmKernel]:
        """The assembly kernel AMD's FMHA v3 would run for this shape, or
        None: the plain variant first, then the backward's fp32 dQ
        accumulation (a32) before a16, round-to-nearest-even for bf16."""
        d = ASM_DIRS.get((arch, direction))
        if d is None or not (self.root / d).is_dir():
            return None
        found: List[Tuple[Tuple[int, int, int], str]] = []
        for p in (self.root / d).iterdir():
            m = _ASM_NAME.match(p.name)
            if (not m or m.group(1) != direction or int(m.group(2)) != head_dim or m.group(3) != dtype
                    or bool(m.group(4)) != causal):
                continue
            rank = (0 if m.group(5) in (None, "32") else 1,
                    0 if m.group(6) in (None, "_rtne") else 1,
                    0 if m.group(7) is None else 1)
            found.append((rank, p.name))
        if not found:
            return None
        name = min(found)[1]
        return AsmKernel(member=d + name, code=(self.root / d / name).read_bytes())
