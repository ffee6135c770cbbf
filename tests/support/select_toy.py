"""The toy project of the candidate-selection tests: two small kernels
(one that spills on gfx1100 at its larger tile), their variants.toml
tables, and a tuning file for sm_90."""

from __future__ import annotations

import json
from pathlib import Path

from .toy_build import SCALE_ADD_KERNEL, TOY_KERNEL, config_table, make_root as make_toy_root

KERNELS = TOY_KERNEL + '''

@triton.jit
def hog(X, Out, seqlen_q, alpha, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr):
    # BLOCK_M x WIDTH fp32 values live across a row reduction: with BLOCK_M = 32
    # and one wave32 that is 256 per lane, which spills on gfx1100.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, WIDTH)
    offs = rows[:, None] * WIDTH + cols[None, :]
    m = rows[:, None] < seqlen_q
    x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
    s = tl.sum(x * x, axis=1)
    tl.store(Out + offs, (x * alpha / (s[:, None] + 1.0)).to(Out.dtype.element_ty), mask=m)
'''

SCALE_ADD = SCALE_ADD_KERNEL.format(dtypes='["fp16"]') + "".join(
    config_table("scale_add", arch, BLOCK=block, num_warps=4)
    for arch, block in (("cuda", 128), ("cuda", 256), ("cdna3", 512), ("gfx942", 128)))

HOG = '''
[kernels.hog]
function = "toy:hog"
args = [["X", "*{dtype}"], ["Out", "*{dtype}"], ["seqlen_q", "i32"], ["alpha", "fp32"]]
constexprs = ["BLOCK_M", "WIDTH", "HEAD_DIM"]
grid = ["cdiv(seqlen_q, BLOCK_M)", "1", "1"]
functional = { dtype = ["fp16"], head_dim = [64] }

[[kernels.hog.configs]]
archs = ["rdna3"]
BLOCK_M = 32
WIDTH = 256
num_warps = 1
num_stages = 1
{allow}
'''

HOG_SMALL = config_table("hog", "rdna", BLOCK_M=8, WIDTH=256, num_warps=1)

MEASURED = {"schema": 1, "arch": "sm_90", "how": "toy: timed on an H100",
            "choices": [{"kernel": "scale_add", "functional": {"dtype": ["fp16"], "has_bias": [False]},
                         "config": {"BLOCK": 256}}]}


def make_root(base: Path, variants: str, measured=MEASURED) -> Path:
    """The toy project with both kernels and, unless ``measured`` is None,
    that sm_90 tuning file."""
    root = make_toy_root(base, variants, kernels=KERNELS)
    (root / "kernels" / "tuning").mkdir()
    if measured is not None:
        (root / "kernels" / "tuning" / "sm_90.json").write_text(json.dumps(measured))
    return root
