"""A toy kernel project (one tiny kernel, its variants.toml, the real
targets.toml) for build, ABI-check and scale tests that need a real compile
without the FlashAttention kernels' cost."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TOY_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def scale_add(X, Y, Out, n, alpha, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m)
    y = tl.load(Y + offs, mask=m)
    tl.store(Out + offs, (x * alpha + y).to(Out.dtype.element_ty), mask=m)
'''

# The kernel's table; its functional dtypes are the template's {dtypes}.
SCALE_ADD_KERNEL = '''
[kernels.scale_add]
function = "toy:scale_add"
args = [["X", "*{{dtype}}"], ["Y", "*{{dtype}}"], ["Out", "*{{dtype}}"], ["n", "i32"], ["alpha", "fp32"]]
constexprs = ["BLOCK", "HEAD_DIM"]
divisible_16 = ["X", "Y", "Out", "n"]
grid = ["cdiv(n, BLOCK)", "1", "1"]
functional = {{ dtype = {dtypes}, head_dim = [64] }}
'''


def config_table(kernel: str, arch: str, **values) -> str:
    """One ``[[kernels.KERNEL.configs]]`` table for ``arch`` (values in the
    order given; num_stages = 1 unless given)."""
    values.setdefault("num_stages", 1)
    lines = [f"[[kernels.{kernel}.configs]]", f'archs = ["{arch}"]']
    lines += [f"{k} = {v}" for k, v in values.items()]
    return "\n" + "\n".join(lines) + "\n"


TOY_VARIANTS = SCALE_ADD_KERNEL.format(dtypes='["fp16", "bf16"]') + "".join(
    config_table("scale_add", arch, BLOCK=block, num_warps=4) for arch, block in (("cuda", 256),
                                                                                 ("cdna", 512)))


def make_root(base: Path, variants: str = TOY_VARIANTS, kernels: str = TOY_KERNEL) -> Path:
    (base / "kernels").mkdir(parents=True)
    (base / "ci").mkdir()
    (base / "kernels" / "toy.py").write_text(kernels)
    (base / "kernels" / "variants.toml").write_text(variants)
    shutil.copy(ROOT / "ci" / "targets.toml", base / "ci" / "targets.toml")
    (base / "pyproject.toml").write_text('[project]\nname = "aotriton-rocm"\n')
    return base


