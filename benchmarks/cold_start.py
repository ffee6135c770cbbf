"""Cold start: from `import aotriton_rocm` (torch and the GPU already up, as
in a program that uses torch) to the first SDPA result on our kernels, in a
fresh process each time, and where that time goes.

    python benchmarks/cold_start.py [--runs 5] [--json]

Each child runs with AOTRITON_ROCM_TRACE=1: the one-time steps of enable()
(Python: runtime import, torch's kernels, archive search, extension load,
python-route ops, the C++ activation) and of the first call (libaotriton_rocm:
archive open and index read/parse, driver open, kernel tables, code object
read, module load, scratch and first launch) print their times on stderr.
Printed: the total (import, enable(), first call) per run and their medians,
then the median of every traced phase (summed within a run: module loads
happen once per kernel). Phases nest: overrides holds torch_kernels ..
native_activate, which holds the archive open of the archives handed over at
enable(); the first call's phases are the device setup, module loads and
first launches; its remainder is torch's own dispatch and the kernel itself.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
torch.cuda.init()
q = torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t0 = time.perf_counter()
import aotriton_rocm
t1 = time.perf_counter()
enable = aotriton_rocm.enable  # loads the runtime modules (lazy since the import)
t2 = time.perf_counter()
print("aotriton-rocm: trace: runtime_import %.3f ms (aotriton_rocm.integrations.torch_integration and "
      "what it imports)" % ((t2 - t1) * 1e3), file=sys.stderr, flush=True)
enable()
t3 = time.perf_counter()
aotriton_rocm.reset_launch_counts()
print("aotriton-rocm: trace: first_call_begin 0 ms", file=sys.stderr, flush=True)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # torch's selector may prefer cuDNN
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
torch.cuda.synchronize()
t4 = time.perf_counter()
ran = sum(n for (name, _), n in aotriton_rocm.launch_counts().items() if name.startswith("aot:"))
print(json.dumps({"ms": (t4 - t0) * 1e3, "import_ms": (t1 - t0) * 1e3,
                  "enable_ms": (t3 - t1) * 1e3, "first_call_ms": (t4 - t3) * 1e3,
                  "our_launches": ran}))
"""

_TRACE = re.compile(r"^aotriton-rocm: trace: (\S+) ([0-9.]+) ms ?(.*)$")
# where each phase belongs, for the breakdown (the rest is in the first call)
_ENABLE = ("runtime_import", "overrides", "torch_kernels", "archive_search",
           "extension_load", "python_route_ops", "native_activate")


def _phases(stderr: str) -> list[tuple[str, float, str, bool]]:
    """(phase, ms, detail, in_first_call) in the order printed."""
    out, first_call = [], False
    for line in stderr.splitlines():
        m = _TRACE.match(line)
        if not m:
            continue
        if m[1] == "first_call_begin":
            first_call = True
            continue
        out.append((m[1], float(m[2]), m[3], first_call))
    return out


def run_once() -> tuple[dict, list]:
    env = dict(os.environ, AOTRITON_ROCM_TRACE="1")
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        raise SystemExit(f"the child failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), _phases(proc.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON object, no table")
    args = parser.parse_args()
    runs, traces = [], []
    for _ in range(args.runs):
        result, phases = run_once()
        runs.append(result)
        traces.append(phases)
    if not all(r["our_launches"] for r in runs):
        raise SystemExit(f"our kernels did not run: {runs}")

    def med(key):
        return round(statistics.median(r[key] for r in runs), 2)

    # per phase: the median over runs of its summed time in a run (module
    # loads happen once per kernel, so a phase may appear several times)
    per_run = []
    details: dict[str, str] = {}
    for phases in traces:
        sums: dict[tuple[str, bool], float] = collections.defaultdict(float)
        for name, ms, detail, first in phases:
            sums[(name, first)] += ms
            details.setdefault(name, detail)
        per_run.append(sums)
    keys = sorted({k for sums in per_run for k in sums},
                  key=lambda k: (k[1], _ENABLE.index(k[0]) if k[0] in _ENABLE else 99, k[0]))
    breakdown = [{"phase": name, "where": "first call" if first else "enable",
                  "median_ms": round(statistics.median(s.get((name, first), 0.0)
                                                       for s in per_run), 3),
                  "detail": details.get(name, "")}
                 for name, first in keys]
    summary = {"runs_ms": [round(r["ms"], 1) for r in runs], "median_ms": med("ms"),
               "import_ms": med("import_ms"), "enable_ms": med("enable_ms"),
               "first_call_ms": med("first_call_ms"), "phases": breakdown}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"import -> first result, median of {len(runs)}: {summary['median_ms']} ms "
          f"(import {summary['import_ms']}, enable() {summary['enable_ms']}, first call "
          f"{summary['first_call_ms']}); runs: {summary['runs_ms']}")
    print(f"{'where':<11} {'phase':<20} {'ms':>9}  detail")
    for row in breakdown:
        print(f"{row['where']:<11} {row['phase']:<20} {row['median_ms']:>9.3f}  {row['detail']}")
    print("(nested: native_activate holds archive_* of the archives handed over at enable(); "
          "overrides holds torch_kernels .. native_activate)")


if __name__ == "__main__":
    main()
