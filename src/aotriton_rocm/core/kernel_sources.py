"""The kernel sources as Python imports them: the installed ``@triton.jit``
functions (what the compilers take) and a second copy of the sources
imported under Triton's interpreter (what the CPU backend runs)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from .kernel_spec import KernelSpec, kernels_dir

__all__ = ["jit_function", "kernels_package", "import_interpreted", "interpreted_function"]


def jit_function(kernel: KernelSpec):
    """The installed ``@triton.jit`` function of a kernel (imports triton)."""
    module = importlib.import_module(f"aotriton_rocm._kernels.{kernel.module}")
    return getattr(module, kernel.function)


# The kernel sources once more, as Triton's interpreter runs them (see
# interpreted_function); never the package the compilers import.
_INTERPRETED_PACKAGE = "_aotriton_rocm_interpreted_kernels"


def kernels_package(name: str, directory) -> str:
    """A synthetic package ``name`` whose modules are the kernel sources in
    ``directory`` (their relative imports work), created once; returns name."""
    if name not in sys.modules:
        kd = str(directory)
        pkg = types.ModuleType(name)
        pkg.__path__ = [kd]  # type: ignore[attr-defined]
        pkg.__package__ = name
        pkg.__spec__ = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        pkg.__spec__.submodule_search_locations = [kd]
        sys.modules[name] = pkg
    return name


def _interpreted_package() -> str:
    return kernels_package(_INTERPRETED_PACKAGE, kernels_dir())


def import_interpreted(package: str, module: str):
    """``package.module`` (a :func:`kernels_package`) imported with
    ``triton.knobs.runtime.interpret`` set (what ``TRITON_INTERPRET=1`` does
    at import time): every ``@triton.jit`` function there, the kernels and
    the helpers they call alike, is then an ``InterpretedFunction``, so
    nested calls work. Imported once per process; imports triton."""
    import triton
    # Gluon's language wraps triton.language functions when it is first
    # imported, and the interpreter swaps those for its own for good during
    # nested calls: Gluon is imported first so that a Gluon compile later in
    # this process (the sm_90 forward) still gets the real ones.
    import triton.experimental.gluon.language  # noqa: F401

    name = f"{package}.{module}"
    if name not in sys.modules:
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = True
            importlib.import_module(name)
    return sys.modules[name]


def interpreted_function(kernel: KernelSpec):
    """A kernel as Triton's interpreter runs it: the installed kernel sources
    imported a second time, into a private package, by
    :func:`import_interpreted`. The installed package (:func:`jit_function`,
    the compilers) keeps its JIT functions."""
    return getattr(import_interpreted(_interpreted_package(), kernel.module), kernel.function)
