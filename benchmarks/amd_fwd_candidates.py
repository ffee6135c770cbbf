"""Our attn_fwd compiled at candidate AMD-backend configs and read exactly
like the report's reference column (static: nothing runs). Compiles only
what the reference cache lacks.

    python benchmarks/amd_fwd_candidates.py --limits build-amd/archives/gfx942.aotr \\
        --cache ~/.cache/aotriton-rocm/reference --factor 0.735 \\
        'bf16:128:amd' 'bf16:128:amd nk16' 'bf16:64:amd'

Each argument is DTYPE:HEAD_DIM:CANDIDATE (CANDIDATES below; arch gfx942,
pad_head false, no bias, no dropout); ``--factor`` is the cycle model's
calibration factor the report printed. One JSON line per kernel: MFMA
shape, occupancy, VGPR/AGPR, spills (VGPR/SGPR), MFMA per iteration, other
instructions / global loads / LDS reads per 16 KFLOP of MFMA work, and the
calibrated loop TFLOP/s on MI300X.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from aotriton_rocm.common.archive import Archive
from aotriton_rocm.tooling.builder.codeobject import ArchLimits
from aotriton_rocm.tooling.builder.reference_compile import RefShape, compile_reference
from aotriton_rocm.tooling.builder.reference_report import RefRow, _estimate, _fallback_tasks, _figures

_BASE = dict(BLOCK_M=128, BLOCK_N=64, PRELOAD_V=False, waves_per_eu=2, num_warps=4, num_stages=1)
CANDIDATES = {
    "amd": _BASE,  # MI300X-MHA-DEFAULT.json, fwd default
    "amd+preV": dict(_BASE, PRELOAD_V=True),
    "amd nk16": dict(_BASE, matrix_instr_nonkdim=16),
    "amd nk32": dict(_BASE, matrix_instr_nonkdim=32),
    "128x128 wpe2": dict(_BASE, BLOCK_N=128),
    "128x32 wpe2": dict(_BASE, BLOCK_N=32),
    "64x64 wpe2": dict(_BASE, BLOCK_M=64),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limits", type=Path, required=True, help="a gfx942 archive (.aotr) of a build: its arch limits")
    ap.add_argument("--cache", type=Path, required=True, help="the reference cache (compiled/ is reused)")
    ap.add_argument("--factor", type=float, required=True, help="the report's calibration factor")
    ap.add_argument("--source-root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("wanted", nargs="+", help="DTYPE:HEAD_DIM:CANDIDATE")
    args = ap.parse_args()
    limits = ArchLimits.from_dict(Archive.open(args.limits).manifest["arch_limits"])
    tasks, meta = [], []
    for w in args.wanted:
        dtype, head_dim, name = w.split(":", 2)
        shape = RefShape("gfx942", "fwd", dtype, int(head_dim), False)
        ((_, task),) = _fallback_tasks(shape, CANDIDATES[name], args.source_root)
        tasks.append(task)
        meta.append((shape, name))
    for (shape, name), res in zip(meta, compile_reference(tasks, args.cache, args.jobs)):
        if res.error:
            print(json.dumps({"shape": shape.text, "candidate": name, "error": res.error}))
            continue
        fig, lines = _figures(res.code, res.meta["symbol"], shape.arch, res.meta["num_warps"],
                              res.meta["shared"], limits)
        est = _estimate(shape, fig, lines, args.factor)
        row = RefRow(shape, "candidate", "attn_fwd", name, fig, est)
        print(json.dumps({
            "shape": shape.text, "candidate": name, "mfma": row.mfma_shape, "occupancy": fig.occupancy,
            "vgpr": fig.vgpr, "agpr": fig.agpr, "spills": f"{fig.vgpr_spills}/{fig.sgpr_spills}",
            "mfma_per_iter": (fig.loop or {}).get("mfma"),
            "per_16kflop": {k: row.per_kflop(k) for k in ("instructions", "global_loads", "ds_reads")},
            "loop_tflops": est and round(est.tflops)}))


if __name__ == "__main__":
    main()
