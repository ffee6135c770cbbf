"""Archives that differ from this tree only in some tuning choices, to time
the choices as they ship (built by the pinned triton, run by the runtime).

    python benchmarks/tuning_alternatives.py --arch sm_90 --out build/alt \\
        --alt 'A=kernel=attn_fwd,dtype=bf16|fp16,head_dim=64,pad_head=false:BLOCK_M=64,BLOCK_N=128,num_warps=4,num_stages=3' \\
        --alt 'B=kernel=attn_bwd_dq,head_dim=128,pad_head=false:BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3'

Each ``--alt NAME=POINTS:CONFIG`` makes the functional points POINTS
(``--only`` syntax) of archive NAME ship CONFIG at every sequence length;
several ``--alt`` with one NAME change several kernels of that archive.
NAME gets a copy of kernels/ with that tuning file and is built with
``aotriton-rocm build --kernels-dir`` into OUT/NAME, sharing the compile
cache (``--cache``, default the tree's build/cache), so only the changed
configs compile. Then, on the GPU machine, with this tree's wheels
installed, time each against the installed archive:

    AOTRITON_ROCM_ARCHIVE_DIR=OUT/NAME/archives python benchmarks/bench_attention.py \\
        --peers aotriton-rocm,FLASH --label standard --head-dims 64
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from aotriton_rocm.common.errors import UsageError
from aotriton_rocm.tooling.builder.plan import Subset
from aotriton_rocm.tooling.common.source_tree import find_source_root
from aotriton_rocm.tooling.builder.tuning import dump_measured, with_choice


def parse_alt(text: str):
    """``NAME=POINTS:CONFIG`` -> (name, Subset, config dict). POINTS has no
    colon; CONFIG may (``function=flash_attention_sm90:attn_fwd,...``)."""
    name, eq, rest = text.partition("=")
    points, colon, config_text = rest.partition(":")
    if not eq or not colon or not name.strip() or not points.strip():
        raise SystemExit(f"--alt {text!r}: want NAME=POINTS:CONFIG, e.g. "
                         "A=kernel=attn_fwd,head_dim=64:BLOCK_M=64,BLOCK_N=128,num_warps=4,num_stages=3")
    config = {}
    for item in config_text.split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--alt {text!r}: config item {item!r} is not KEY=VALUE")
        try:
            config[key.strip()] = json.loads(value.strip())
        except ValueError:
            config[key.strip()] = value.strip()
    return name.strip(), Subset.parse([points]), config


def write_alternative(name: str, edits, kernels_dir: Path, arch: str, out: Path) -> Path:
    """OUT/NAME/kernels: the tree's kernels with NAME's tuning choices."""
    root = out / name
    shutil.rmtree(root / "kernels", ignore_errors=True)
    shutil.copytree(kernels_dir, root / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "kernels" / "tuning" / f"{arch}.json"
    doc = json.loads(path.read_text())
    axes = {axis for ch in doc.get("choices") or () for axis in ch.get("functional") or {}}
    for subset, config in edits:
        try:
            subset.check_known(axes)
        except UsageError as exc:
            raise SystemExit(f"--alt {name}: {exc}") from None
        note = f"tuning_alternatives.py {name}: {subset.text()} at every length"
        doc = with_choice(doc, subset.accepts_point, config, note)
    path.write_text(dump_measured(doc))
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", required=True, help="the arch whose tuning file is changed")
    parser.add_argument("--out", default="build/alt", help="one folder per NAME (default %(default)s)")
    parser.add_argument("--alt", action="append", required=True, metavar="NAME=POINTS:CONFIG")
    parser.add_argument("--cache", default="build/cache", help="the compile cache to share")
    args = parser.parse_args(argv)
    root_dir = find_source_root()
    out, cache = Path(args.out).resolve(), Path(args.cache).resolve()
    alts = defaultdict(list)
    for text in args.alt:
        name, subset, config = parse_alt(text)
        alts[name].append((subset, config))
    for name, edits in alts.items():
        root = write_alternative(name, edits, root_dir / "kernels", args.arch, out)
        link = root / "cache"
        if link.is_symlink():
            link.unlink()
        if not link.exists():  # (a folder of its own from an earlier build stays)
            cache.mkdir(parents=True, exist_ok=True)
            link.symlink_to(cache, target_is_directory=True)
        print(f"== {name}: building {root / 'archives'}", flush=True)
        subprocess.run([sys.executable, "-m", "aotriton_rocm", "build", "--arch", args.arch,
                        "--kernels-dir", str(root / "kernels"), "--source-root", str(root_dir),
                        "--out", str(root)], check=True)
    print("time each on the GPU machine (this tree's wheels installed):")
    for name in alts:
        print(f"  AOTRITON_ROCM_ARCHIVE_DIR={out / name / 'archives'} python "
              "benchmarks/bench_attention.py --peers aotriton-rocm,FLASH --label standard")
    return 0


if __name__ == "__main__":
    sys.exit(main())
