"""Toy releases for the publishing tests: real wheels and .conda packages made
by the real builders from this source tree stamped with another version, and
small real archives (tests/support/real_archives.py; package verifies what it ships).

Each (version, local label) is built once per test run and shared by the
modules that import this helper (tests/tooling/release/test_publish_index.py,
tests/tooling/package/test_conda_pins.py, tests/tooling/release/test_release.py,
tests/tooling/package/test_sbom.py), across the xdist workers too: they build into one directory (tests/conftest.py
makes it) under a file lock per build, so a build one worker made is reused
by the others.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from . import SHARED_ENV
from . import real_archives as RA
from aotriton_rocm.tooling.package import snapshot as S
from aotriton_rocm.tooling.common import source_tree as ST
from aotriton_rocm._version import abi_line
from aotriton_rocm.tooling.package import wheels as W

ROOT = Path(__file__).resolve().parents[2]
ROCM = "6.4"
ARCH = "gfx942"

@functools.lru_cache(maxsize=None)
def _base() -> Path:
    """The test run's directory (SHARED_ENV); without one, this process's own."""
    shared = os.environ.get(SHARED_ENV)
    if shared:  # removed when the run ends (tests/conftest.py)
        d = Path(shared) / "toy-releases"
        d.mkdir(parents=True, exist_ok=True)
        return d
    d = Path(tempfile.mkdtemp(prefix="aotriton-toy-releases-"))
    atexit.register(shutil.rmtree, d, True)
    return d


_LOCK = threading.Lock()
_KEY_LOCKS: Dict[Tuple, threading.Lock] = {}
_DONE: Dict[Tuple, object] = {}


def _once(key: Tuple, make):
    """``make()`` once per test run: a Path or a list of Paths, recorded
    beside the builds so that the other workers of the run read it back."""
    with _LOCK:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key in _DONE:
            return _DONE[key]
        name = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
        record = _base() / f".{name}.json"
        with open(_base() / f".{name}.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # another worker may be making it
            if record.is_file():
                made = json.loads(record.read_text())
                value = [Path(p) for p in made] if isinstance(made, list) else Path(made)
            else:
                value = make()
                record.write_text(json.dumps([str(p) for p in value] if isinstance(value, list)
                                             else str(value)))
        _DONE[key] = value
        return value


def source_tree(version: str) -> Path:
    """This source tree as release ``version`` (``_version.py`` and the image
    pins of pyproject's extras moved to that ABI line)."""
    if version == ST.read_version(ROOT):
        return ROOT

    def make() -> Path:
        tree = S.snapshot_source(ROOT, _base() / f"src-{version}")
        v = tree / "src" / "aotriton_rocm" / "_version.py"
        v.write_text(re.sub(r'__version__ = "[^"]*"', f'__version__ = "{version}"', v.read_text()))
        abi = abi_line(version)
        pp = tree / "pyproject.toml"
        pp.write_text(re.sub(r"~=\d+\.\d+\.0", f"~={abi}.0", pp.read_text()))
        # a new ABI line gets its torch_compat.json entry (packaging refuses a line without one)
        tc = tree / "src" / "aotriton_rocm" / "torch_compat.json"
        data = json.loads(tc.read_text())
        if all(e["line"] != abi for e in data["lines"]):
            data["lines"].append(dict(data["lines"][-1], line=abi))
            tc.write_text(json.dumps(data, indent=1))
        return tree

    return _once(("src", version), make)


def archives(version: str, archs: Sequence[str] = (ARCH,), rocm: str = ROCM) -> Path:
    def make() -> Path:
        d = _base() / f"archives-{version}-rocm{rocm}-{'-'.join(archs)}"
        d.mkdir(parents=True)
        for arch in archs:  # real archives: package verifies what it ships
            RA.write(d, arch, version=version, rocm=rocm, size=2048)
        return d

    return _once(("archives", version, tuple(archs), rocm), make)


def wheels(version: str, local: bool = False) -> List[Path]:
    """``[runtime wheel, image wheel, sdist]`` of a toy release (``local``: the
    per-ROCm build, ``X.Y.Z+rocm6.4``)."""
    def make() -> List[Path]:
        out = _base() / f"wheels-{version}{'-local' if local else ''}"
        return W.build_wheels(source_tree(version), archives(version), out, [ARCH], ROCM, local)

    return _once(("wheels", version, local), make)


def image_wheels(version: str, archs: Sequence[str], rocm: str) -> List[Path]:
    """The image wheels alone of a toy release for ``archs`` built under ROCm
    ``rocm`` (the runtime of :func:`wheels` of the same version installs them
    through its extras)."""
    def make() -> List[Path]:
        from aotriton_rocm.tooling.package.archive_intake import collect_archives

        out = _base() / f"images-{version}-rocm{rocm}-{'-'.join(archs)}"
        inputs = collect_archives(archives(version, archs, rocm), list(archs), version, rocm)
        return W.build_image_wheels(source_tree(version), inputs, out, version, rocm)

    return _once(("images", version, tuple(archs), rocm), make)


def build_wheels_in_parallel(releases: Sequence[Tuple[str, bool]]) -> Dict[Tuple[str, bool], List[Path]]:
    """The builds are mostly subprocesses: overlap them."""
    with ThreadPoolExecutor(max_workers=len(releases)) as ex:
        futs = {r: ex.submit(wheels, *r) for r in releases}
        return {r: f.result() for r, f in futs.items()}


def conda_packages(version: str) -> List[Path]:
    """The .conda packages (runtime for this Python + the image) of a toy
    release, in a channel of their own; the runtime repacks the toy wheel."""
    def make() -> List[Path]:
        from aotriton_rocm.tooling.package.conda import build_conda

        import sys

        out = _base() / f"conda-{version}"
        return build_conda(source_tree(version), archives(version), out, [ARCH], ROCM,
                           python_versions=["%d.%d" % sys.version_info[:2]],
                           runtime_wheel=wheels(version)[0], run_tests=False)

    return _once(("conda", version), make)
