"""Per-call host cost of the kernel launcher, without a GPU.

    python benchmarks/launch_overhead.py [--calls N] [--repeat R]

The launch function pointer is either
  * a C no-op with the cuLaunchKernel prototype that the native extension
    itself exports (`_launch.noop_launch_address()`): what is measured is the
    launcher's own cost (argument checks and packing, the call, GIL release),
    the part that adds to the driver's cuLaunchKernel/hipModuleLaunchKernel; or
  * a ctypes CFUNCTYPE callback: a Python function behind a C pointer. Its own
    cost (GIL re-entry, building Python objects for 11 arguments, running
    Python code) is about as large as the native launcher's; shown because it
    needs nothing but ctypes, not as a launcher figure.

Both the raw launch functions (native `_launch.launch` and `ctypes_launch`)
and the whole `Kernel.launch` hot path are measured, with the argument list
of a FlashAttention-forward-like kernel (pointers, int32 strides, int64,
fp32, plus the two NULL scratch pointers). A real driver adds its own launch
cost (a few microseconds for cuLaunchKernel) on top of these numbers.
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import statistics
import sys
import timeit
from ctypes import POINTER, c_int, c_uint, c_void_p
from pathlib import Path

try:
    from aotriton_rocm.driver import launcher
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from aotriton_rocm.driver import launcher

ARG_TYPES = (["*fp16"] * 6 + ["i32"] * 16 + ["i32"] * 4 + ["i64"] * 2 + ["fp32"]
             + ["*i8", "*i8"])

LAUNCH_PROTO = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint,
                                c_uint, c_uint, c_void_p, POINTER(c_void_p), POINTER(c_void_p))


def _args():
    values = []
    for t in ARG_TYPES[:-2]:
        if t.startswith("*"):
            values.append(0x7F00_0000_0000 + 256 * len(values))
        elif t == "fp32":
            values.append(0.08838834764831845)
        elif t == "i64":
            values.append(2**33 + len(values))
        else:
            values.append(128 * len(values))
    return tuple(values)


class _NoopDriver:
    backend = "cuda"

    def __init__(self, launch_fn):
        self.launch_fn = launch_fn

    def load_function(self, device_index, image, symbol, shared, key):
        return 0x1000 + device_index

    def recover_launch(self, code, device_index):
        return False


def _measure(fn, calls: int, repeat: int) -> float:
    """Median microseconds per call over `repeat` runs of `calls` calls."""
    fn()  # warm up
    times = timeit.repeat(fn, number=calls, repeat=repeat)
    return statistics.median(times) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    ns = ap.parse_args(argv)

    native = launcher._native
    if native is None:
        print(f"native launcher not importable ({launcher._NATIVE_IMPORT_ERROR}); build it: "
              "python -c 'from setuptools import setup; setup()' build_ext --inplace")
        return 1

    sig = launcher.signature_for(ARG_TYPES)
    args = _args()
    noop = native.noop_launch_address()
    callback = LAUNCH_PROTO(lambda *a: 0)
    callback_addr = ctypes.cast(callback, c_void_p).value
    targets = [("C no-op", noop), ("ctypes callback", callback_addr)]
    impls = [("native", native.launch), ("ctypes fallback", launcher.ctypes_launch)]

    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{len(ARG_TYPES)} kernel parameters ({len(args)} Python args + 2 scratch), "
          f"median of {ns.repeat} x {ns.calls} calls")
    print(f"{'launch function':18} {'implementation':16} {'raw launch()':>14} "
          f"{'Kernel.launch':>14}")
    results = {}
    for tname, addr in targets:
        for iname, impl in impls:
            def raw(impl=impl, addr=addr):
                impl(addr, 0x1000, 16, 8, 4, 128, 1, 1, 32768, 0x5000, sig, args)

            k = launcher.Kernel("cuda", b"\x7fELF", "attn_fwd", 4, 32, 32768, ARG_TYPES,
                                driver=_NoopDriver(addr), launch_impl=impl)
            k.load(0)

            def via_kernel(k=k):
                k.launch((16, 8, 4), 0x5000, 0, *args)

            r = _measure(raw, ns.calls, ns.repeat)
            v = _measure(via_kernel, ns.calls, ns.repeat)
            results[(tname, iname)] = (r, v)
            print(f"{tname:18} {iname:16} {r:11.2f} us {v:11.2f} us")
    (nr, nk), (cr, ck) = results[("C no-op", "native")], results[("C no-op", "ctypes fallback")]
    print(f"launcher cost (C no-op target): native {nk:.2f} us vs ctypes {ck:.2f} us per "
          f"Kernel.launch ({ck / nk:.0f}x)")
    cb = results[("ctypes callback", "native")][0] - nr
    print(f"a ctypes-callback target adds ~{cb:.2f} us per call by itself (native+callback "
          "minus native+no-op): the callback rows overstate the launcher's cost by that much")
    return 0


if __name__ == "__main__":
    sys.exit(main())
