"""The build tooling's libraries (pyelftools, msgpack, matplotlib, rich,
cyclonedx-python-lib: the ``build`` extra) stay out of the runtime: importing
the runtime loads none of them, and the runtime commands (``smoke``, ``info``)
start in a process where they cannot be imported at all."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import aotriton_rocm

# top-level import names of the tooling-only libraries
TOOLING_LIBRARIES = ("elftools", "msgpack", "matplotlib", "rich", "cyclonedx", "packageurl", "serializable")

# Every runtime module: the package minus the tooling, the CLI (which offers
# the tooling's commands) and ``python -m`` glue.
NOT_RUNTIME = {"aotriton_rocm.commands.cli", "aotriton_rocm.__main__"}
RUNTIME_MODULES = sorted(
    m.name for m in pkgutil.walk_packages(aotriton_rocm.__path__, "aotriton_rocm.")
    if not m.name.startswith("aotriton_rocm.tooling") and m.name not in NOT_RUNTIME)

# Installed in a fresh interpreter before anything else: the libraries
# cannot be imported (as if not installed), and every attempt is recorded.
BLOCKER = """
import importlib.abc, sys
BLOCKED = set({blocked!r})
ATTEMPTS = []
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            ATTEMPTS.append(name)
            raise ImportError(f"No module named {{name!r}} (blocked by the test)")
        return None
sys.meta_path.insert(0, Blocker())
"""


def _run(code: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=Path(__file__).resolve().parent)


def test_runtime_modules_are_found():
    # the list the next test imports is the real runtime, not an empty walk
    assert {"aotriton_rocm.common.archive", "aotriton_rocm.core.attention", "aotriton_rocm.core.kernel_spec",
            "aotriton_rocm.commands.smoke", "aotriton_rocm.integrations.torch_integration"} <= set(RUNTIME_MODULES)


def test_runtime_imports_no_tooling_library():
    """Even with the libraries installed (this environment has the build
    extra), the runtime modules load none of them."""
    code = f"""
import importlib, json, sys
for name in {RUNTIME_MODULES!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {TOOLING_LIBRARIES!r})))
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_runtime_imports_without_tooling_libraries():
    """The runtime modules import where the libraries are not installed, and
    never even look for them."""
    code = BLOCKER.format(blocked=TOOLING_LIBRARIES) + f"""
import importlib, json
for name in {RUNTIME_MODULES!r}:
    importlib.import_module(name)
print(json.dumps(ATTEMPTS))
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []


def test_runtime_commands_start_without_tooling_libraries():
    """``aotriton-rocm smoke --help`` and ``aotriton-rocm info`` with the
    libraries not importable: both run to their normal end."""
    code = BLOCKER.format(blocked=TOOLING_LIBRARIES) + """
import contextlib, io, json
from aotriton_rocm.commands.cli import main
results = {}
for argv in (["smoke", "--help"], ["info"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:  # --help exits 0
            rc = e.code
    results[argv[0]] = [rc, out.getvalue()]
print(json.dumps(results))
"""
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    rc, text = results["smoke"]
    assert rc == 0 and text.startswith("usage: aotriton-rocm smoke"), text
    rc, text = results["info"]
    # 0, or 1 when an installed kernel image is unusable; never a crash
    assert rc in (0, 1) and text.startswith(f"aotriton-rocm {aotriton_rocm.__version__} "), text
    assert "GPU: " in text
