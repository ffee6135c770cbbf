"""The consumer (built against an AOTriton prefix) on the stub driver, with
libaotriton_v2 loaded from LIBAOTRITON_V2 (a conda prefix's lib/, or a torch
copied into its site-packages): the library finds the installed kernel
image by itself, or, in a directory of no install ("none"), finds none.

usage: prefix_scenario.py CONSUMER STUB_DRIVER LIBAOTRITON_V2 found|none

The image is the conda package's: the fp16 head-dim-64 kernels of
test_consumers.write_real_archive, symbols k0, k1, ...
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402

from consumer_abi import ACQUIRED_D, HIP_NO_BINARY_FOR_GPU, HIP_SUCCESS, Consumer, make_case  # noqa: E402
from stub_archive import launches  # noqa: E402

consumer_path, stub_path, v2_path, expect = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
os.environ.update(AOTRITON_ROCM_DRIVER_LIBRARY=stub_path, AOTRITON_ROCM_BACKEND="cuda",
                  AOTR_STUB_CUDA_ARCH="9.0")
os.environ.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)
ctypes.CDLL(str(v2_path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)  # the consumer binds to this copy
stub = ctypes.CDLL(stub_path)
api = Consumer(consumer_path)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


B, S, H, D = 2, 128, 4, 64
q, k, v = (torch.randn(B, S, H, D).half() for _ in range(3))
t = dict(q=q, k=k, v=v, out=torch.empty_like(q), lse=torch.empty(B * H, S))
stub.aotr_stub_reset()
rc = api.forward(make_case(**t))
fwd = launches(stub)
if expect == "none":
    check(rc == HIP_NO_BINARY_FOR_GPU and not fwd, f"no image: forward returned {rc}, {len(fwd)} launches")
    print("ok")
    sys.exit(0)
check(rc == HIP_SUCCESS, f"forward returned {rc}")
check(len(fwd) == 1 and fwd[0][0].startswith("k"), f"forward launches {[x[0] for x in fwd]}")
t.update(dout=torch.randn_like(q), dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))
stub.aotr_stub_reset()
rc = api.backward(make_case(**t))
bwd = launches(stub)
check(rc & 0xFFFFF == HIP_SUCCESS and rc & ACQUIRED_D, f"backward returned {rc:#x}")  # D acquired
check(bwd and all(x[0].startswith("k") for x in bwd), f"backward launches {[x[0] for x in bwd]}")
print(f"{v2_path}: forward {fwd[0][0]}, backward {', '.join(x[0] for x in bwd)}")
print("ok")
