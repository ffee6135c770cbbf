"""Cold-start timing points (AOTRITON_ROCM_TRACE=1) of libaotriton_rocm on the
stub driver: every one-time step of the first call prints one line that
benchmarks/cold_start.py parses, and nothing is printed without the variable."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from aotriton_rocm.core import native  # noqa: E402
from aotriton_rocm._version import ABI_VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    import torch
    from aotriton_rocm.core import native
    from aotriton_rocm.tooling.builder.archive_writer import write_archive
    from stub_archive import MANIFEST, records, stub_runtime
    archive = {archive!r}
    write_archive(archive, MANIFEST, records())
    rt = stub_runtime({stub!r}, archive)
    q = torch.empty(1, 2, 64, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, 64)
    p = native.FwdParams()
    p.stream = 0x5000
    p.problem = native.make_problem(q, q, q, scale=0.125)
    p.out, p.lse = native.tensor_view(torch.empty_like(q)), native.tensor_view(lse)
    for _ in range(2):  # the second call is timed by nothing
        native.check(rt.fwd(p))
    print("ok")
""")


def _cold_start():
    spec = importlib.util.spec_from_file_location("cold_start", ROOT / "benchmarks/cold_start.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("traced", [True, False])
def test_first_call_phases_are_traced(native_build, native_env, tmp_path, traced):
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    env = dict(native_env, AOTR_STUB_CUDA_ARCH="9.0", AOTR_STUB_COMPUTE_UNITS="132")
    env[native.ENV_VAR] = str(native_build / f"libaotriton_rocm.so.{ABI_VERSION}")
    env["AOTRITON_ROCM_TRACE"] = "1" if traced else "0"
    code = CHILD.format(here=str(Path(__file__).parent), archive=str(tmp_path / "sm_90.aotr"),
                        stub=str(stub))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr
    phases = _cold_start()._phases(proc.stderr)
    if not traced:
        assert phases == [] and "trace" not in proc.stderr
        return
    names = [name for name, *_ in phases]
    # add_archive opens and reads the index; the first call sets the device up,
    # loads the one forward kernel and launches it; the second call adds nothing
    assert names == ["archive_index_read", "archive_index_parse", "archive_records",
                     "driver_open", "device_archive", "kernel_tables", "code_object",
                     "module_load", "scratch_alloc", "first_launch"], proc.stderr
    assert all(ms >= 0 for _, ms, _, _ in phases)
    detail = dict((name, d) for name, _, d, _ in phases)
    assert "sm_90.aotr" in detail["archive_index_read"] and "attn_fwd" in detail["module_load"]
