"""What installing the package costs every ``import torch``: torch's backend
autoload imports ``aotriton_rocm`` inside it, so that import must load
nothing heavy. Counted in modules (``-X importtime`` and ``sys.modules`` of a
fresh interpreter), not in milliseconds, so that a loaded machine cannot make
it flaky; the timings are printed in the failure message."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

# Never imported on the way: torch's compiler stack (seconds), the SDPA bias
# module that pulls it in, Triton, and our own runtime (loaded on activation).
FORBIDDEN_PREFIXES = ("torch._dynamo", "torch._inductor", "triton", "sympy",
                      "torch.nn.attention.bias", "torch._functorch.aot_autograd",
                      "aotriton_rocm.integrations.torch_integration", "aotriton_rocm.core.backends",
                      "aotriton_rocm.core.attention", "aotriton_rocm.core.native",
                      "aotriton_rocm.core.kernel_spec", "aotriton_rocm.integrations.function_mode")
# `import aotriton_rocm` may add: the package, _version, registry (the lazy
# entry in torch's flash registry), and the autoload hook; one spare for a
# small stdlib module a refactor might need. Anything beyond that is a module
# loaded before anyone asked for it.
MAX_NEW_MODULES = 5

_ROW = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")

_CHILD = textwrap.dedent("""
    import json, sys
    {imports}
    print(json.dumps(sorted(sys.modules)))
""")


def _env(autoload: bool, extra_path: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AOTRITON_ROCM_ENABLE", "AOTRITON_ROCM_CPU_INTERPRETER")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1" if autoload else "0"
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    return env


def _run(imports: str, env: dict) -> tuple[list[str], dict[str, int]]:
    """(sys.modules after ``imports``, cumulative importtime per module in us)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           _CHILD.format(imports=imports)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    times = {}
    for line in proc.stderr.splitlines():
        m = _ROW.match(line)
        if m:
            times[m[4]] = int(m[2])
    return json.loads(proc.stdout.strip().splitlines()[-1]), times


def _check(added: set[str], times: dict[str, int], what: str) -> None:
    timing = {m: round(times[m] / 1e3, 2) for m in sorted(added) if m in times}
    forbidden = sorted(m for m in added if m.startswith(FORBIDDEN_PREFIXES))
    assert not forbidden, f"{what} imported {forbidden} (ms: {timing})"
    assert len(added) <= MAX_NEW_MODULES, (
        f"{what} imported {len(added)} modules beyond torch's own: {sorted(added)} (ms: {timing})")


def test_import_aotriton_rocm_after_torch_loads_nothing_heavy():
    env = _env(autoload=False)
    base, _ = _run("import torch", env)
    ours, times = _run("import torch\nimport aotriton_rocm", env)
    added = set(ours) - set(base)
    assert "aotriton_rocm" in added
    _check(added, times, "import aotriton_rocm")


def _autoload_entry_path(tmp_path) -> str | None:
    """A dist-info declaring our entry point, on a path for the child, unless
    the installed package already declares it."""
    for ep in importlib.metadata.entry_points(group="torch.backends"):
        if ep.value == "aotriton_rocm._autoload:autoload":
            return None
    info = tmp_path / "aotriton_rocm_autoload_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: aotriton-rocm-autoload-probe\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[torch.backends]\naotriton_rocm = aotriton_rocm._autoload:autoload\n")
    return str(tmp_path)


def test_torch_backend_autoload_loads_nothing_heavy(tmp_path):
    extra = _autoload_entry_path(tmp_path)
    base, _ = _run("import torch", _env(autoload=False, extra_path=extra))
    # the autoload runs inside `import torch`; say what the child saw
    probe = ("import torch\nimport torch.nn.attention as A\n"
             "assert 'AOTRITON_ROCM' in getattr(A, 'list_flash_attention_impls', lambda: "
             "['AOTRITON_ROCM'])(), 'the autoload did not register us'")
    ours, times = _run(probe, _env(autoload=True, extra_path=extra))
    added = set(ours) - set(base)
    assert "aotriton_rocm._autoload" in added, "torch's autoload did not run our hook"
    _check(added, times, "torch's backend autoload")


def test_lazy_import_then_enable_runs_sdpa_on_our_kernels():
    """The cheap import leaves the runtime unloaded; enable() loads it and
    SDPA runs on our kernels (CPU interpreter route), matching torch's math."""
    pytest.importorskip("triton", reason="the CPU route runs kernels in Triton's interpreter")
    code = textwrap.dedent("""
        import sys
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import aotriton_rocm
        assert "aotriton_rocm.integrations.torch_integration" not in sys.modules
        assert not aotriton_rocm.is_enabled()
        aotriton_rocm.enable(cpu_interpreter=True)
        assert aotriton_rocm.is_enabled()
        aotriton_rocm.reset_launch_counts()
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 24, 64, generator=g).half() for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        launches = aotriton_rocm.launch_counts()[("interpreter:cpu", "attn_fwd")]
        assert launches == 1, aotriton_rocm.launch_counts()
        torch.testing.assert_close(out.float(), ref, atol=3e-3, rtol=0)
        aotriton_rocm.disable()
        assert not aotriton_rocm.is_enabled()
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(autoload=False),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


def test_registry_activation_after_cheap_import_loads_the_runtime():
    """torch's own activation path (``activate_flash_attention_impl``) works on
    the lazily registered entry."""
    code = textwrap.dedent("""
        import sys
        import torch
        import aotriton_rocm
        A = torch.nn.attention
        if not hasattr(A, "register_flash_attention_impl"):
            print("no registry"); sys.exit(0)
        import os
        os.environ["AOTRITON_ROCM_CPU_INTERPRETER"] = "1"
        A.activate_flash_attention_impl(aotriton_rocm.IMPL_NAME)
        assert aotriton_rocm.is_enabled() and A.current_flash_attention_impl() == "AOTRITON_ROCM"
        A.restore_flash_attention_impl()
        assert not aotriton_rocm.is_enabled()
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(autoload=False),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] in ("ok", "no registry"), proc.stdout


def test_the_gpu_routes_runtime_loads_no_compiler_stack():
    """What enable() imports on the GPU route (torch_integration and its
    modules): no Triton, no torch compiler stack, no kernel-spec reader (those
    serve the CPU interpreter route only)."""
    env = _env(autoload=False)
    base, _ = _run("import torch", env)
    ours, times = _run("import torch\nimport aotriton_rocm\nimport aotriton_rocm.integrations.torch_integration",
                       env)
    added = set(ours) - set(base)
    heavy = ("torch._dynamo", "torch._inductor", "triton", "sympy", "torch.nn.attention.bias",
             "aotriton_rocm.core.kernel_spec", "tomllib", "aotriton_rocm.tooling")
    wrong = sorted(m for m in added if m.startswith(heavy))
    assert not wrong, f"the runtime imported {wrong}"
    # ours, and nothing from outside the package beyond a few stdlib modules
    foreign = sorted(m for m in added if not m.startswith("aotriton_rocm"))
    assert len(foreign) <= 3, foreign
