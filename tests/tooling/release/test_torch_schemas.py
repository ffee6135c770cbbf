"""A torch newer than the compatibility table: enable() compares what we bind
in it (op schemas, torch function signatures) with the tested torch
versions' (torch_schemas.json), runs with a one-time warning where they are
equal, and refuses naming what changed otherwise. The running torch is the
real one; only the version the check sees, or the stored table, is changed."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

import aotriton_rocm
from aotriton_rocm.core import torch_compat, torch_native
from aotriton_rocm.integrations import torch_integration
from aotriton_rocm.tooling.release import torch_schemas

FA = "_flash_attention_forward"


@pytest.fixture
def newer_torch(monkeypatch):
    """torch reports 2.99.0 (newer than the table); the one-time note is
    forgotten; nothing stays enabled."""
    monkeypatch.delenv(torch_compat.ALLOW_ENV, raising=False)
    monkeypatch.setenv(torch_integration.CPU_ENV, "1")
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    monkeypatch.setattr(torch_compat, "_noted_untested", set())
    yield
    aotriton_rocm.disable()


def _table_with_changed_op(op: str) -> dict:
    """The stored table, with ``op``'s schema in every tested torch as a
    torch with an extra argument would have it."""
    data = copy.deepcopy(torch_compat.load_interfaces())
    for entry in data["tested"].values():
        entry["ops"][op] = entry["ops"][op].replace("bool is_causal,", "bool is_causal, int x,")
    return data


def test_the_stored_interface_is_this_torchs_and_covers_what_we_bind():
    stored = torch_compat.load_interfaces()["tested"]
    minor = torch_compat.torch_minor(torch.__version__)
    assert {"2.13", "2.14", "2.15"} <= set(stored)
    assert torch_compat.interface_changes(stored[minor], torch_compat.torch_interface()) == []
    assert all(entry["ops"][FA].startswith(f"aten::{FA}(Tensor query") for entry in stored.values())
    # every op an override or the C++ extension sits on is compared
    bound = {op.split("::")[1] for op in vars(torch_integration).values()
             if isinstance(op, str) and op.startswith("aten::")}
    assert bound | set(torch_native.ATEN_OPS) <= set(torch_compat.BOUND_OPS)


def test_a_newer_torch_with_the_tested_schemas_runs_with_a_one_time_note(newer_torch):
    with pytest.warns(UserWarning, match=r"not tested with torch 2\.99\.0 .*have the schemas and "
                                         r"signatures they have in torch 2\.1\d"):
        aotriton_rocm.enable(cpu_interpreter=True)
    assert aotriton_rocm.is_enabled()
    aotriton_rocm.disable()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        aotriton_rocm.enable(cpu_interpreter=True)
    assert aotriton_rocm.is_enabled()


def test_a_newer_torch_with_a_changed_schema_is_refused_naming_it(newer_torch, monkeypatch):
    changed = _table_with_changed_op(FA)
    monkeypatch.setattr(torch_compat, "load_interfaces", lambda: changed)
    with pytest.raises(torch_compat.UnsupportedTorchError) as e:
        aotriton_rocm.enable(cpu_interpreter=True)
    msg = str(e.value)
    assert f"aten::{FA} (schema changed)" in msg and "tested up to torch 2.15" in msg
    assert "torch==2.15.*" in msg and "pip install -U aotriton-rocm" in msg
    assert not aotriton_rocm.is_enabled()
    if torch_integration.has_registry():  # torch's own activation path refuses too
        with pytest.raises(torch_compat.UnsupportedTorchError, match=f"aten::{FA}"):
            torch.nn.attention.activate_flash_attention_impl(aotriton_rocm.IMPL_NAME)
    assert not aotriton_rocm.is_enabled()
    # AOTRITON_ROCM_ALLOW_UNSUPPORTED_TORCH=1 still overrides the refusal
    monkeypatch.setenv(torch_compat.ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match=f"aten::{FA}.*going ahead anyway"):
        torch_compat.check_torch()


def test_a_changed_registry_function_is_refused_too(newer_torch, monkeypatch):
    data = copy.deepcopy(torch_compat.load_interfaces())
    for entry in data["tested"].values():
        entry["functions"]["nn.attention.activate_flash_attention_impl"] = "(impl, *, handle)"
    monkeypatch.setattr(torch_compat, "load_interfaces", lambda: data)
    with pytest.raises(torch_compat.UnsupportedTorchError,
                       match=r"torch\.nn\.attention\.activate_flash_attention_impl \(signature"):
        torch_compat.check_torch()


def test_older_and_listed_torch_keep_the_number_rule(monkeypatch):
    monkeypatch.delenv(torch_compat.ALLOW_ENV, raising=False)
    changed = _table_with_changed_op(FA)
    monkeypatch.setattr(torch_compat, "load_interfaces", lambda: changed)
    torch_compat.check_torch("2.14.1")  # listed: no schema comparison
    with pytest.raises(torch_compat.UnsupportedTorchError, match="it supports torch 2.5"):
        torch_compat.check_torch("2.4.1")  # older than the table: refused by its number


def test_the_generator_records_and_checks_a_real_torch(tmp_path, capsys):
    table = tmp_path / "torch_schemas.json"
    assert torch_schemas.main(["--file", str(table), "--check"]) == 1
    assert "no entry" in capsys.readouterr().err
    assert torch_schemas.main(["--file", str(table)]) == 0
    minor = torch_compat.torch_minor(torch.__version__)
    written = json.loads(table.read_text())
    assert written["tested"][minor]["torch"] == torch.__version__
    # the shipped entry is what this generator writes for this torch
    stored = torch_compat.load_interfaces()["tested"][minor]
    assert torch_compat.interface_changes(stored, written["tested"][minor]) == []
    assert torch_schemas.main(["--file", str(table), "--check"]) == 0
    written["tested"][minor]["ops"][FA] += " "
    table.write_text(json.dumps(written))
    torch_compat._load_interfaces_file.cache_clear()
    assert torch_schemas.main(["--file", str(table), "--check"]) == 1
    assert f"aten::{FA} (schema changed)" in capsys.readouterr().err
    table.write_text("{}")
    torch_compat._load_interfaces_file.cache_clear()
    assert torch_schemas.main(["--file", str(table)]) == 1
    assert "not a table of tested torch interfaces" in capsys.readouterr().err
