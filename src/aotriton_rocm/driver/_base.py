"""What the CUDA and HIP driver wrappers share: the error type, library
location, ctypes binding, and the per-(device, kernel) function cache.

Nothing here opens a driver library at import time.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple


class DriverError(RuntimeError):
    """A GPU driver call failed, or the driver library could not be used.

    ``backend`` is ``"cuda"`` or ``"hip"``; ``function`` the driver function
    that failed (``None`` when the library itself could not be loaded);
    ``code`` its numeric result; ``error_name``/``error_string`` what the
    driver says about that code.
    """

    def __init__(self, message: str, *, backend: Optional[str] = None,
                 function: Optional[str] = None, code: Optional[int] = None,
                 error_name: Optional[str] = None, error_string: Optional[str] = None):
        super().__init__(message)
        self.backend = backend
        self.function = function
        self.code = code
        self.error_name = error_name
        self.error_string = error_string


def mapped_library(prefix: str) -> Optional[str]:
    """Path of an already loaded shared library whose file name starts with
    ``prefix`` (e.g. ``libamdhip64.so``), from /proc/self/maps; else None.

    Opening the copy the process already has (torch's) matters: a second HIP
    runtime in one process would not know torch's streams or memory.
    """
    try:
        with open("/proc/self/maps", "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].strip()
                if path.endswith(" (deleted)"):
                    continue
                if os.path.basename(path).startswith(prefix) and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def open_library(candidates: Sequence[str], *, backend: str, what: str,
                 hint: str) -> Tuple[ctypes.CDLL, str]:
    """dlopen the first loadable of ``candidates``; DriverError listing every
    attempt otherwise."""
    failures: List[str] = []
    for name in candidates:
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            failures.append(str(e) if name in str(e) else f"{name}: {e}")
    raise DriverError(
        f"cannot load the {what} ({'; '.join(failures)}). {hint}", backend=backend)


def bind(lib: ctypes.CDLL, libname: str, backend: str, name: str, restype, argtypes):
    """The ctypes function ``name`` of ``lib`` with its C prototype set."""
    try:
        fn = getattr(lib, name)
    except AttributeError:
        raise DriverError(
            f"{libname} has no function {name}: the driver library is too old or not the "
            f"{backend.upper()} driver; update the GPU driver/runtime", backend=backend,
            function=name) from None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def function_address(fn) -> int:
    """The address of a ctypes foreign function, as an int."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


class Driver:
    """Base of the CUDA and HIP drivers.

    Subclasses set ``backend``, ``library`` (the path or name opened) and
    ``launch_fn`` (the address of cuLaunchKernel / hipModuleLaunchKernel),
    and implement ``_load_module_function``, ``error_name_and_string``.
    """

    backend = ""
    library = ""
    launch_fn = 0

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # (device_index, kernel key, symbol) -> function handle (int)
        self._functions: Dict[Tuple[int, str, str], int] = {}
        # Loaded modules are never unloaded (process lifetime); the image is
        # kept alive alongside in case the runtime refers to it later.
        self._modules: List[Tuple[int, bytes]] = []

    # -- errors --------------------------------------------------------------
    def error_name_and_string(self, code: int) -> Tuple[str, str]:
        raise NotImplementedError

    def hint_for(self, function: str, code: int) -> str:
        return ""

    def error(self, function: str, code: int, hint: str = "") -> DriverError:
        try:
            name, text = self.error_name_and_string(code)
        except Exception:  # noqa: BLE001 - never mask the original failure
            name, text = "unknown", "no description"
        hint = hint or self.hint_for(function, code)
        msg = f"{self.backend}: {function} failed with {name} ({code}): {text}"
        if hint:
            msg += f". {hint}"
        return DriverError(msg, backend=self.backend, function=function, code=code,
                           error_name=name, error_string=text)

    def check(self, code: int, function: str, hint: str = "") -> None:
        if code:
            raise self.error(function, code, hint)

    # -- loading -------------------------------------------------------------
    def load_function(self, device_index: int, image: bytes, symbol: str, shared: int,
                      key: str) -> int:
        """The function handle of ``symbol`` in code object ``image`` on device
        ``device_index``, loading the module on first use. ``key`` identifies
        the image (its sha256); ``shared`` is the dynamic shared memory the
        kernel launches with. Thread-safe; cached per (device, key, symbol)."""
        k = (device_index, key, symbol)
        fn = self._functions.get(k)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._functions.get(k)
            if fn is None:
                fn = self._load_module_function(device_index, bytes(image), symbol, shared)
                self._functions[k] = fn
        return fn

    def _load_module_function(self, device_index: int, image: bytes, symbol: str,
                              shared: int) -> int:
        raise NotImplementedError

    # -- launching -----------------------------------------------------------
    def recover_launch(self, code: int, device_index: int) -> bool:
        """After a failed launch: fix what can be fixed (e.g. no current
        context on this thread) and return True to have the launch retried."""
        return False

    def launch_error(self, code: int, *, device_index: int, what: str) -> DriverError:
        fn = "cuLaunchKernel" if self.backend == "cuda" else "hipModuleLaunchKernel"
        err = self.error(fn, code)
        err.args = (f"{err.args[0]} (launching {what} on device {device_index})",)
        return err
