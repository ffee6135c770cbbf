"""Content-addressed cache of compiled code objects. Build-time only.

Key: sha256 over the kernel sources the function's module reads (the module
and the kernels/ modules it imports, transitively: module_sources_hash), the
function, its signature, constexprs, attrs, target, compile options, the
triton version and the compile environment. An entry is
``<key[:2]>/<key>.bin`` (code object) plus ``<key[:2]>/<key>.json`` (compile
metadata, incl. the code object's sha256); both are written atomically (temp
file + ``os.replace``), the JSON last, so a present JSON means a complete
entry. Entries that fail their sha256 check are
treated as misses and overwritten.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

from ...common.files import atomic_write_bytes
from ..common.inputs_hash import kernel_sources_hash

__all__ = ["CACHE_SCHEMA", "CompileCache", "cache_key", "kernel_sources_hash"]

# Bump when what a cache entry holds changes (e.g. new stats parsed from the
# code object), so stale entries are recompiled.
CACHE_SCHEMA = 4  # 3: stats["wmma"], meta["compile_seconds"]; 4: stats["loop"]


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def cache_key(*, sources_hash: str, module: str, function: str, signature: Iterable[Tuple[str, str]],
              constexprs: Dict[str, Any], div_indices: Iterable[int], target: Tuple[Any, ...],
              options: Dict[str, Any], triton_version: str, env: Dict[str, str]) -> str:
    doc = {
        "schema": CACHE_SCHEMA,
        "sources": sources_hash,
        "function": f"{module}:{function}",
        "signature": [list(x) for x in signature],
        "constexprs": [[k, constexprs[k]] for k in sorted(constexprs)],
        "attrs": [[i, "tt.divisibility", 16] for i in sorted(div_indices)],
        "target": list(target),
        "options": options,
        "triton": triton_version,
        "env": env,
    }
    return hashlib.sha256(_canon(doc).encode()).hexdigest()


class CompileCache:
    def __init__(self, root):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _paths(self, key: str) -> Tuple[Path, Path]:
        d = self.root / key[:2]
        return d / f"{key}.bin", d / f"{key}.json"

    def get(self, key: str) -> Optional[Tuple[Dict[str, Any], bytes]]:
        bin_p, meta_p = self._paths(key)
        try:
            meta = json.loads(meta_p.read_text(encoding="utf-8"))
            code = bin_p.read_bytes()
        except (OSError, ValueError):
            return None
        if (not isinstance(meta, dict) or meta.get("cache_schema") != CACHE_SCHEMA
                or meta.get("sha256") != hashlib.sha256(code).hexdigest()):
            return None
        return meta, code

    def put(self, key: str, meta: Dict[str, Any], code: bytes) -> None:
        bin_p, meta_p = self._paths(key)
        meta = dict(meta)
        meta["cache_schema"] = CACHE_SCHEMA
        meta["sha256"] = hashlib.sha256(code).hexdigest()
        meta["size"] = len(code)
        atomic_write_bytes(bin_p, bytes(code))
        atomic_write_bytes(meta_p, json.dumps(meta, indent=1, sort_keys=True).encode())
