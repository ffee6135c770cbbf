"""The consumer on the stub driver with an image of every kernel variant,
found the way a conda install lays it out: libaotriton_v2 in
$PREFIX/lib/python3.X/site-packages/torch/lib, the image in
$PREFIX/share/aotriton-rocm/ (six directories up). check_gpu vouches for the
arch; head dims that are not multiples of 8 are staged once (by the core),
multiples of 8 but not of 16 by the layer.

usage: full_image_scenario.py CONSUMER STUB_DRIVER LIBAOTRITON_V2 ROOT
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402

from aotriton_rocm.tooling.builder.archive_writer import write_archive  # noqa: E402
from consumer_abi import HIP_SUCCESS, Consumer, make_case  # noqa: E402
from stub_archive import MANIFEST, decode, launches, record  # noqa: E402
from aotriton_rocm.core import kernel_spec  # noqa: E402

consumer_path, stub_path, v2_path, root = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
os.environ.update(AOTRITON_ROCM_DRIVER_LIBRARY=stub_path, AOTRITON_ROCM_BACKEND="cuda",
                  AOTR_STUB_CUDA_ARCH="9.0")
os.environ.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)

spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
RECS = [record(v, f"{v.kernel}#{i}") for i, v in
        enumerate(spec.variants_for(kernel_spec.INTERPRETER_ARCH))]
code = {r.symbol: b"AOTRSTUB" + (16 + len(r.symbol)).to_bytes(8, "little") + r.symbol.encode()
        for r in RECS}
share = root / "share" / "aotriton-rocm"
share.mkdir(parents=True)
write_archive(share / "sm_90.aotr", MANIFEST, [(r, code[r.symbol]) for r in RECS])
torch_lib = root / "lib" / "python3.12" / "site-packages" / "torch" / "lib"
torch_lib.mkdir(parents=True)
shutil.copy2(v2_path, torch_lib / v2_path.name)
ctypes.CDLL(str(torch_lib / v2_path.name), mode=os.RTLD_NOW | os.RTLD_GLOBAL)  # the consumer binds to it

stub = ctypes.CDLL(stub_path)
api = Consumer(consumer_path)
ARGS = {r.symbol: r.args for r in RECS}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


check(api.check_gpu() == HIP_SUCCESS, "check_gpu with a full image")

B, S, H = 2, 64, 2
for d, staged_by_core in ((100, True), (72, False)):
    q, k, v = (torch.randn(B, S, H, d).half() for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(B * H, S)
    stub.aotr_stub_reset()
    rc = api.forward(make_case(q=q, k=k, v=v, out=out, lse=lse))
    check(rc == HIP_SUCCESS, f"forward at head dim {d}: {rc}")
    ls = [decode(ARGS[sym], raw) for sym, _, _, _, raw in launches(stub)]
    check(len(ls) == 1 and ls[0]["Q"] != q.data_ptr(), f"head dim {d}: one launch on a copy")
    copies = stub.aotr_stub_calls(b"cuMemcpy2DAsync_v2")
    if staged_by_core:  # q, k, v in and out back, one 2D copy each: nothing staged twice
        check(ls[0]["head_dim"] == 104 and copies == 4, f"head dim {d}: {copies} copies")
    else:
        check(ls[0]["head_dim"] == 72 and copies >= 4, f"head dim {d}: {copies} copies")
    check(stub.aotr_stub_scratch(None, None) == 0, f"head dim {d}: workspace freed")
print("ok")
