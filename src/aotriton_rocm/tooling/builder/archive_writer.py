"""Write kernel archives (the format: :mod:`aotriton_rocm.common.archive`,
which reads them) and their sidecar manifests. Build tooling: the runtime
only reads."""
from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ...common.archive import (FORMAT_VERSION, HEADER_SIZE, MAGIC, _HEADER, Archive, KernelRecord,
                               PathLike, manifest_path_for)
from ...common.archive_index import MANIFEST_KEYS
from ...common.files import atomic_write, file_sha256
from ...common.kernel_abi import kernel_abi_section

__all__ = ["write_archive", "write_manifest_sidecar"]


def _json_bytes(obj: Any) -> bytes:
    """Compact JSON (the archive index)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("utf-8")


def _sidecar_bytes(doc: Dict[str, Any]) -> bytes:
    """Readable JSON: top-level keys indented, one kernel record per line."""
    lines = ["{"]
    items = list(doc.items())
    for i, (k, v) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if k == "kernels":
            lines.append(f' "{k}": [')
            for j, rec in enumerate(v):
                sep = "," if j < len(v) - 1 else ""
                lines.append("  " + json.dumps(rec, ensure_ascii=True) + sep)
            lines.append(" ]" + comma)
        else:
            body = json.dumps(v, indent=1, ensure_ascii=True).replace("\n", "\n ")
            lines.append(f' "{k}": {body}{comma}')
    lines.append("}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_archive(path: PathLike, manifest: Mapping[str, Any],
                  kernels: Sequence[Tuple[KernelRecord, bytes]], *,
                  preset: int = 6) -> Tuple[Dict[str, Any], List[KernelRecord]]:
    """Write ``<arch>.aotr`` atomically (temp file + rename).

    ``kernels`` pairs a record (offset/sizes/sha256 are filled here) with its
    uncompressed code object. ``manifest`` must hold every key of
    MANIFEST_KEYS except ``blob_sha256`` and ``format_version`` (filled here).
    Returns the final manifest and records. Output is deterministic: the same
    inputs give byte-identical files.
    """
    p = Path(path)
    if not kernels:
        raise ValueError(f"{p}: no kernels to write (the readers refuse an empty image)")
    seen = set()
    records: List[KernelRecord] = []
    blobs: List[bytes] = []
    offset = 0
    for rec, code in kernels:
        if rec.key in seen:
            raise ValueError(f"duplicate kernel key {rec.key!r}")
        seen.add(rec.key)
        blob = lzma.compress(bytes(code), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                             preset=preset)
        records.append(rec.replace(offset=offset, compressed_size=len(blob), size=len(code),
                                   sha256=hashlib.sha256(code).hexdigest()))
        blobs.append(blob)
        offset += len(blob)
    blob_hash = hashlib.sha256()
    for b in blobs:
        blob_hash.update(b)
    man = dict(manifest)
    man["format_version"] = FORMAT_VERSION
    man["blob_sha256"] = blob_hash.hexdigest()
    # ABI record (docs/ABI.md): format version, ABI line, per-kernel arg-list hashes.
    man["abi"] = kernel_abi_section(records, FORMAT_VERSION, str(man.get("abi_version", "")))
    missing = [k for k in MANIFEST_KEYS if k not in man]
    if missing:
        raise ValueError(f"manifest lacks {', '.join(missing)}")
    index_bytes = _json_bytes({"manifest": man, "kernels": [r.to_dict() for r in records]})
    blob_offset = HEADER_SIZE + len(index_bytes)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, len(index_bytes), blob_offset,
                          offset, hashlib.sha256(index_bytes).digest())

    def write(f):
        f.write(header)
        f.write(index_bytes)
        for b in blobs:
            f.write(b)

    atomic_write(p, write)
    return man, records


def write_manifest_sidecar(archive_path: PathLike, manifest_path: Optional[PathLike] = None) -> Path:
    """Write ``<arch>.manifest.json`` for an existing archive (atomically)."""
    ap = Path(archive_path)
    mp = Path(manifest_path) if manifest_path is not None else manifest_path_for(ap)
    a = Archive.open(ap)
    doc = {
        "manifest": a.manifest,
        "archive": {"file": ap.name, "sha256": file_sha256(ap), "size": ap.stat().st_size},
        "kernels": [r.to_dict(with_location=False) for r in a.kernels],
    }
    atomic_write(mp, lambda f: f.write(_sidecar_bytes(doc)))
    return mp
