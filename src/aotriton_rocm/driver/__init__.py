"""GPU driver layer: load code objects and launch kernels without triton.

    from aotriton_rocm.driver import Kernel, get_driver, DriverError

`get_driver("hip")` / `get_driver("cuda")` opens the HIP runtime / CUDA driver
library on first use (ctypes) and caches the driver object; importing this
package opens nothing. `Kernel` (see launcher.py) loads its code object per
device on first launch and launches through the native launcher extension
(`_launch`, stable ABI, libc only) or its ctypes fallback.
"""

from __future__ import annotations

import threading
from typing import Dict

from ._base import Driver, DriverError
from .launcher import Kernel, native_available, signature_for

__all__ = ["Driver", "DriverError", "Kernel", "get_driver", "native_available",
           "signature_for"]

_drivers: Dict[str, Driver] = {}
_lock = threading.Lock()


def get_driver(backend: str) -> Driver:
    """The driver object of ``backend`` ("hip" or "cuda"; "rocm" means
    "hip"), created on first call and cached. Raises DriverError when the
    driver library is missing or unusable (the next call tries again)."""
    b = str(backend).lower()
    if b in ("rocm", "amd"):
        b = "hip"
    elif b == "nvidia":
        b = "cuda"
    driver = _drivers.get(b)
    if driver is not None:
        return driver
    with _lock:
        driver = _drivers.get(b)
        if driver is None:
            if b == "cuda":
                from .cuda import CudaDriver

                driver = CudaDriver()
            elif b == "hip":
                from .hip import HipDriver

                driver = HipDriver()
            else:
                raise ValueError(f"unknown backend {backend!r}: 'hip' (AMD ROCm) or "
                                 "'cuda' (NVIDIA)")
            _drivers[b] = driver
    return driver
