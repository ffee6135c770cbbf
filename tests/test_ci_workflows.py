"""ci/gpu-smoke.yml (the GPU smoke job for self-hosted AMD runners) cannot run
here: check that it parses and stays consistent with ci/targets.toml."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def load_workflow():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (it comes with the build extra's "
                                              "distributed): the workflow's YAML is not checked")
    return yaml.safe_load((ROOT / "ci" / "gpu-smoke.yml").read_text())


def test_gpu_smoke_workflow():
    wf = load_workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"workflow_dispatch", "workflow_call"} <= set(triggers)
    job = wf["jobs"]["smoke"]
    assert job["runs-on"][:2] == ["self-hosted", "rocm"] and job["runs-on"][2] == "${{ matrix.arch }}"
    assert job["strategy"]["fail-fast"] is False
    targets = tomllib.loads((ROOT / "ci" / "targets.toml").read_text())
    amd_defaults = [a for a in targets["default_archs"] if a.startswith("gfx")]
    assert job["strategy"]["matrix"]["arch"] == amd_defaults
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "aotriton-rocm\" smoke --device gpu --json" in runs
    assert "python3 -m venv" in runs and "torch.version.hip" in runs
    uses = [s.get("uses", "") for s in job["steps"]]
    assert any(u.startswith("actions/download-artifact@") for u in uses)
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "${{ always() }}"
