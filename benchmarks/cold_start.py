"""Cold start: from `import aotriton_rocm` (torch and the GPU already up, as
in a program that uses torch) to the first SDPA result on our kernels, in a
fresh process each time. Prints the runs and the median in milliseconds.

    python benchmarks/cold_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, time, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.cuda.init()
q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t0 = time.perf_counter()
import aotriton_rocm
aotriton_rocm.enable()
aotriton_rocm.reset_launch_counts()
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # torch's selector may prefer cuDNN
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
torch.cuda.synchronize()
t1 = time.perf_counter()
ran = sum(n for (name, _), n in aotriton_rocm.launch_counts().items() if name.startswith("aot:"))
print(json.dumps({"ms": (t1 - t0) * 1e3, "our_launches": ran}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", CHILD], check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    if not all(r["our_launches"] for r in runs):
        raise SystemExit(f"our kernels did not run: {runs}")
    ms = [r["ms"] for r in runs]
    print(json.dumps({"runs_ms": [round(m, 1) for m in ms], "median_ms": round(statistics.median(ms), 1)}))


if __name__ == "__main__":
    main()
