"""Cold start on a real GPU (the H100 via the sm_90 target): a fresh process
from `import aotriton_rocm` to the first SDPA result, traced phase by phase
(benchmarks/cold_start.py), and enable() handing the C++ runtime only the
archives of the visible GPUs. Skipped without a GPU or without an installed
image for its arch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from aotriton_rocm.core import device, torch_native
from aotriton_rocm.common import images
from aotriton_rocm.integrations import torch_integration

pytestmark = pytest.mark.gpu


ROOT = Path(__file__).resolve().parents[2]


def _cold_start():
    spec = importlib.util.spec_from_file_location("cold_start", ROOT / "benchmarks/cold_start.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_native_archives_are_the_visible_gpus_once_cuda_is_up():
    torch.cuda.init()
    archs = {device.arch_of(i) for i in range(torch.cuda.device_count())}
    want = sorted(str(images.find_archives()[a]) for a in archs if a in images.find_archives())
    assert sorted(torch_native.process_archives()) == want


def test_cold_start_is_traced_phase_by_phase():
    result, phases = _cold_start().run_once()
    assert result["our_launches"] > 0, result
    names = {name for name, *_ in phases}
    assert {"runtime_import", "overrides"} <= names, phases
    first_call = {name for name, _, _, first in phases if first}
    if torch_integration.has_registry() and torch_native.available():
        assert {"extension_load", "native_activate", "archive_index_read"} <= names, phases
        assert {"driver_open", "kernel_tables", "module_load", "first_launch"} <= first_call, \
            phases
    print(result, phases)
