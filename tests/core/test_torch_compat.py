"""Torch compatibility matrix: data file, runtime refusal, autoload warning,
`aotriton-rocm pin`, and the README table generated from the data."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import aotriton_rocm
from aotriton_rocm import _autoload
from aotriton_rocm.core import torch_compat
from aotriton_rocm.integrations import torch_integration
from aotriton_rocm.commands.cli import main as cli_main
from aotriton_rocm.tooling.release import pin

ROOT = Path(__file__).resolve().parents[2]


def test_data_covers_this_torch_and_line():
    data = torch_compat.load()
    assert torch_compat.DATA_FILE.is_file()
    supported = torch_compat.supported_torch()
    assert supported == torch_compat.supported_torch(aotriton_rocm.ABI_VERSION)
    # the registry route needs torch >= 2.10, the aten-override route >= 2.5
    # (the SDPA op schemas it overrides); 2.11 runs on the GPU machine, 2.13 here,
    # 2.14 and 2.15 in scripts/test-torch-compat.sh
    assert all(tuple(map(int, v.split("."))) >= (2, 5) for v in supported)
    assert {"2.11", "2.13", "2.14", "2.15"} <= set(supported)
    assert torch_compat.torch_minor(torch.__version__) in supported
    assert data["schema"] == 1


def test_torch_minor_parsing():
    assert torch_compat.torch_minor("2.11.0+rocm6.4") == "2.11"
    assert torch_compat.torch_minor("2.13.0a0+git1234") == "2.13"
    assert torch_compat.torch_minor("2.10") == "2.10"
    with pytest.raises(ValueError):
        torch_compat.torch_minor("nightly")


def test_check_torch_refuses_with_a_clear_message(monkeypatch):
    monkeypatch.delenv(torch_compat.ALLOW_ENV, raising=False)
    torch_compat.check_torch("2.11.0+rocm6.4")
    with pytest.raises(torch_compat.UnsupportedTorchError) as e:
        torch_compat.check_torch("2.4.1+rocm6.1")
    msg = str(e.value)
    assert "does not support torch 2.4.1+rocm6.1" in msg
    assert "2.5, 2.6, 2.7, 2.8, 2.9, 2.10, 2.11, 2.12, 2.13, 2.14, 2.15" in msg
    assert "torch==2.15.*" in msg
    assert torch_compat.ALLOW_ENV in msg
    monkeypatch.setenv(torch_compat.ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match="going ahead anyway"):
        torch_compat.check_torch("2.4.1")


def test_enable_refuses_unsupported_torch(monkeypatch):
    monkeypatch.delenv(torch_compat.ALLOW_ENV, raising=False)
    monkeypatch.setattr(torch, "__version__", "2.4.0+rocm6.1")
    with pytest.raises(torch_compat.UnsupportedTorchError, match="supports torch 2.5"):
        aotriton_rocm.enable()
    assert not aotriton_rocm.is_enabled()
    if torch_integration.has_registry():  # torch's own activation path refuses too
        with pytest.raises(torch_compat.UnsupportedTorchError):
            torch.nn.attention.activate_flash_attention_impl(aotriton_rocm.IMPL_NAME)
        assert torch.nn.attention.current_flash_attention_impl() != aotriton_rocm.IMPL_NAME
    assert not aotriton_rocm.is_enabled()


def test_autoload_warns_instead_of_raising(monkeypatch):
    monkeypatch.delenv(torch_compat.ALLOW_ENV, raising=False)
    monkeypatch.setenv("AOTRITON_ROCM_ENABLE", "1")
    monkeypatch.setattr(torch, "__version__", "2.4.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _autoload.autoload()  # must not raise: it runs inside `import torch`
    assert any("does not support torch 2.4.0" in str(w.message) for w in caught)
    assert not aotriton_rocm.is_enabled()


def test_pin_lines():
    res = pin.pin_lines("2.11", ["gfx942", "sm_90"])
    assert res["pip"] == ["aotriton-rocm[gfx942,sm90]~=0.1.0", "torch==2.11.*"]
    assert res["conda"] == ["aotriton-rocm >=0.1.0,<0.2.0a0", "aotriton-rocm-gfx942 >=0.1.0,<0.2.0a0",
                            "aotriton-rocm-sm90 >=0.1.0,<0.2.0a0"]
    data = {"schema": 1, "lines": [{"line": "0.1", "torch": ["2.10", "2.11"]},
                                   {"line": "0.2", "torch": ["2.11", "2.12"]}]}
    assert pin.pin_lines("2.11.0", data=data)["pip"][0] == "aotriton-rocm~=0.2.0"  # newest line
    assert pin.pin_lines("2.10", data=data)["conda"] == ["aotriton-rocm >=0.1.0,<0.2.0a0"]
    with pytest.raises(pin.PinError, match="supported torch versions: 2.10, 2.11, 2.12"):
        pin.pin_lines("2.9", data=data)


def test_pin_command(capsys):
    assert cli_main(["pin", "--torch", "2.11"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "aotriton-rocm~=0.1.0" in out and "aotriton-rocm >=0.1.0,<0.2.0a0" in out
    assert cli_main(["pin", "--torch", "2.11", "--arch", "gfx942"]) == 0
    assert "aotriton-rocm[gfx942]~=0.1.0" in capsys.readouterr().out
    assert cli_main(["pin", "--torch", "2.4"]) == 1
    err = capsys.readouterr().err
    assert "no aotriton-rocm release supports torch 2.4" in err and "2.10" in err


def test_readme_table_is_generated_from_the_data(tmp_path):
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    table = torch_compat.render_table()
    assert table in text, "README's torch table is stale: run tooling.pin.update_readme(Path('README.md'))"
    assert text.count(torch_compat.TABLE_BEGIN) == 1
    assert pin.update_readme(readme, check=True)
    # update_readme rewrites a stale table in place
    stale = tmp_path / "README.md"
    stale.write_text(text.replace("| 0.1.x |", "| 0.0.x |"), encoding="utf-8")
    assert not pin.update_readme(stale)
    assert stale.read_text(encoding="utf-8") == text


def test_wheel_ships_the_data():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = data["tool"]["setuptools"]["package-data"]["aotriton_rocm"]
    assert {"torch_compat.json", "torch_schemas.json", "abi.json"} <= set(shipped)
    json.loads(torch_compat.DATA_FILE.read_text(encoding="utf-8"))
    json.loads(torch_compat.SCHEMAS_FILE.read_text(encoding="utf-8"))


def test_conda_recipe_takes_the_torch_range_from_the_data():
    """recipe/recipe.yaml names no torch version of its own: `package` renders
    `pytorch ${{ torch_spec }}` from torch_compat.json, and the rendered
    runtime output constrains pytorch to exactly the supported minors."""
    pytest.importorskip("rattler_build")
    import re

    from rattler import BuildString, MatchSpec, PackageRecord
    from rattler_build import Stage0Recipe

    from aotriton_rocm.tooling.package import conda

    recipe = (ROOT / "recipe" / "recipe.yaml").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in recipe.splitlines() if re.match(r"\s*-\s*pytorch\b", ln)]
    assert lines == ["- pytorch ${{ torch_spec }}"], lines
    supported = torch_compat.supported_torch()
    hi = supported[-1].split(".")
    spec = f">={supported[0]},<{hi[0]}.{int(hi[1]) + 1}.0a0"
    assert conda.torch_requirement(aotriton_rocm.__version__, ROOT) == spec == ">=2.5,<2.16.0a0"

    variants = conda._variant_config(ROOT, aotriton_rocm.__version__, "6.4", ["gfx942"], ["3.12"])
    rendered = Stage0Recipe.from_file(ROOT / "recipe" / "recipe.yaml").render(variants)
    runtime = [v for v in rendered if v.recipe.package.name == "aotriton-rocm"]
    assert runtime
    for v in runtime:
        constraints = v.recipe.requirements.to_dict()["run_constraints"]
        assert f"pytorch {spec}" in constraints, constraints
    ms = MatchSpec(f"pytorch {spec}")
    for version in ("2.9.1", "2.10.0", "2.11.2", "2.13.0", "2.15.0", "2.16.0a0", "2.16.0rc1",
                    "2.16.0"):
        rec = PackageRecord(name="pytorch", version=version, build=BuildString("0"), build_number=0,
                            subdir="linux-64")
        assert ms.matches(rec) == (torch_compat.torch_minor(version) in supported), version
