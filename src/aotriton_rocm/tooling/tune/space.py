"""The search space of ``aotriton-rocm tune``: ``kernels/tuning/space.toml``.

Each ``[[KERNEL]]`` table gives configs to time on a GPU besides the configs
variants.toml declares for a point (those are timed too: they are the
static fallback the build keeps)::

    [[attn_fwd]]
    archs = ["cuda"]                 # names, families or arch sets, as in variants.toml
    head_dims = [64, 128]            # optional
    when = { dtype = ["fp16", "bf16"], has_bias = false }   # optional
    configs = [
      { BLOCK_M = 128, BLOCK_N = 64, num_warps = 8, num_stages = 3 },
    ]

The file is not a build input: only the winners ``tune`` writes to
``kernels/tuning/<arch>.json`` are compiled by the build. Build-time only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

from ...core.kernel_spec import ConfigSpec, VariantSpec, VariantSpecError, parse_config

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["SPACE_FILE", "load_space"]

SPACE_FILE = "space.toml"
_GROUP_KEYS = ("archs", "head_dims", "when")


def load_space(spec: VariantSpec, path: Path = None) -> Dict[str, Tuple[ConfigSpec, ...]]:
    """Per kernel the search-space configs (kernels/tuning/space.toml, or
    ``path``); an empty mapping where the file does not exist."""
    p = Path(path) if path is not None else spec.kernels_dir / "tuning" / SPACE_FILE
    if not p.is_file():
        return {}
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise VariantSpecError(f"{p}: unreadable search space: {e}") from None
    out: Dict[str, List[ConfigSpec]] = {}
    for kernel, groups in doc.items():
        ks = spec.kernels.get(kernel)
        if ks is None:
            raise VariantSpecError(f"{p}: [[{kernel}]]: no such kernel in {spec.path}")
        if not isinstance(groups, list):
            raise VariantSpecError(f"{p}: {kernel} must be an array of tables ([[{kernel}]])")
        for g, group in enumerate(groups):
            where = f"{p}: [[{kernel}]] #{g + 1}"
            unknown = sorted(set(group) - set(_GROUP_KEYS) - {"configs"})
            if unknown or not isinstance(group.get("configs"), list) or not group["configs"]:
                raise VariantSpecError(f"{where}: want {', '.join(_GROUP_KEYS)} and a non-empty "
                                       f"configs = [{{...}}, ...]" +
                                       (f"; unknown keys {unknown}" if unknown else ""))
            shared: Dict[str, Any] = {k: group[k] for k in _GROUP_KEYS if k in group}
            for i, cfg in enumerate(group["configs"]):
                if not isinstance(cfg, dict):
                    raise VariantSpecError(f"{where} configs[{i}]: a config is an inline table")
                out.setdefault(kernel, []).append(
                    parse_config({**shared, **cfg}, ks.constexprs, dict(ks.functional),
                                 f"{where} configs[{i}]"))
    return {k: tuple(v) for k, v in out.items()}
