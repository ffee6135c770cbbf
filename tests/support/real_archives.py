"""Small but real kernel archives, written by the real writer
(archive_writer.write_archive + write_manifest_sidecar): what packaging, the loader,
smoke, info and validate check. The code objects are stand-in bytes."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Optional

from aotriton_rocm._version import __version__
from aotriton_rocm.common.archive import KernelRecord
from aotriton_rocm.tooling.builder.archive_writer import write_archive, write_manifest_sidecar

ROOT = Path(__file__).resolve().parents[2]
COMPILER = "3.9.0"


@functools.lru_cache(maxsize=None)
def tree_hash() -> str:
    """The build-inputs hash of this checkout with triton ``COMPILER``."""
    from aotriton_rocm.tooling.common.inputs_hash import source_tree_inputs_hash

    return source_tree_inputs_hash(ROOT, COMPILER)


ARGS = (("Q", "*fp16"), ("n", "i32"), ("global_scratch", "*i8"), ("profile_scratch", "*i8"))


def record(i: int) -> KernelRecord:
    return KernelRecord(
        key=f"attn_fwd|dtype=fp16|head_dim=64|BLOCK_M={64 * (i + 1)}", kernel="attn_fwd",
        functional={"dtype": "fp16", "head_dim": 64}, config={"BLOCK_M": 64 * (i + 1)},
        constexprs={"HEAD_DIM": 64}, symbol="attn_fwd", num_warps=4, num_stages=1, warp_size=64,
        shared=0, global_scratch_size=0, profile_scratch_size=0, args=ARGS, divisible_16=(),
        grid=("1", "1", "1"))


def write(d: os.PathLike, arch: str, *, version: str = __version__, rocm: str = "6.4",
          inputs_hash: Optional[str] = None, kernels: int = 2, size: int = 2048,
          name: Optional[str] = None, subset: Optional[str] = None) -> Path:
    """``d/<arch>.aotr`` + ``d/<arch>.manifest.json`` (``name``: another file
    stem, sidecar included, as if the build had written it under that name).
    ``inputs_hash``: default this checkout's build-inputs hash (what ``build``
    records here with triton ``COMPILER``): ``package`` accepts it.
    ``subset``: the ``--only`` text of a subset build."""
    if inputs_hash is None:
        inputs_hash = tree_hash()
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    man = {"package_version": version, "abi_version": ".".join(version.split(".")[:2]),
           "rocm_profile": rocm, "arch": arch,
           "backend": "cuda" if arch.startswith("sm_") else "hip",
           "warp_size": 32 if arch.startswith("sm_") else 64, "compiler": "triton",
           "compiler_version": COMPILER, "build_inputs_hash": inputs_hash}
    if subset:
        man["subset"] = subset
    path = d / f"{name or arch}.aotr"
    # deterministic: the same call writes the same bytes (reproducibility tests)
    codes = [b"\x7fELF" + bytes([i]) * size
             + hashlib.sha256(f"{arch} {version} {inputs_hash} {i}".encode()).digest()
             for i in range(kernels)]
    write_archive(path, man, [(record(i), c) for i, c in enumerate(codes)])
    write_manifest_sidecar(path)
    return path


def copy_as(src: Path, dst_dir: os.PathLike, arch: str) -> Path:
    """Copy an archive and its sidecar to ``<arch>.aotr`` / ``<arch>.manifest.json``
    (byte for byte: what a user's ``cp`` does)."""
    import shutil

    from aotriton_rocm.common.archive import manifest_path_for

    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / f"{arch}.aotr"
    shutil.copyfile(src, dst)
    shutil.copyfile(manifest_path_for(src), manifest_path_for(dst))
    return dst


def flip_payload_byte(path: Path) -> None:
    """Damage one byte of the last kernel's compressed blob (the file's end)."""
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF
    path.write_bytes(bytes(data))
