"""The import graph of src/aotriton_rocm, built with ``ast``: no cycle among
modules, imports run one way, nothing outside the tooling imports it, and the
runtime commands start without importing the build tooling.

The folders are the layers; a module's layer is its folder's:

    0  common/        stdlib leaves: errors, files, paths, the archive reader
    1  core/          runtime core: device, native library, backends, attention
    2  integrations/  what users call: torch SDPA, flash-attn's API and operators
    3  commands/      the aotriton-rocm command and its runtime commands
    4  tooling/       build, package, release, tune (builder/, package/, ...)

The few modules at the top of the package (``__init__``, ``__main__``,
``_version``, ``_autoload``, and ``flash_attn_interface``, which keeps the
path of flash-attn's own module) are placed one by one in TOP_LEVEL."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "aotriton_rocm"
PKG = "aotriton_rocm"

# Lower layers never import higher ones. A module's layer is its folder's; a
# module at the top of the package must be listed in TOP_LEVEL, and a new
# folder in FOLDERS, so that each is placed on purpose.
FOLDERS = {"common": 0, "core": 1, "integrations": 2, "commands": 3, "tooling": 4}
TOP_LEVEL = {"_version": 0, "__init__": 2, "_autoload": 2, "flash_attn_interface": 2, "__main__": 3}
TOOLING = FOLDERS["tooling"]


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    return ".".join(rel.parts)


def _layer(module: str) -> int:
    folder, dot, _ = module.partition(".")
    layer = FOLDERS.get(folder) if dot else TOP_LEVEL.get(module)
    if layer is None:
        where = f"{folder}/ to FOLDERS" if dot else f"{module} to TOP_LEVEL"
        raise AssertionError(f"src/aotriton_rocm/{module.replace('.', '/')}.py has no layer: add "
                             f"{where} in {Path(__file__).name}, or move it into a layer's folder")
    return layer


def _resolve(module: str, level: int, name: str | None, is_package: bool) -> str:
    parts = module.split(".")
    if module.endswith("__init__"):
        parts = parts[:-1]
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def import_graph() -> Dict[str, Set[str]]:
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    known = set(files)

    def existing(dotted: str) -> str | None:
        while dotted:
            for cand in (dotted, f"{dotted}.__init__"):
                if cand in known:
                    return cand
            dotted = dotted.rpartition(".")[0]
        return None

    graph: Dict[str, Set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        out: Set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name[len(PKG) + 1:] or "__init__" for a in node.names
                           if a.name == PKG or a.name.startswith(PKG + ".")]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = _resolve(module, node.level, node.module, is_package)
                elif node.module and (node.module == PKG or node.module.startswith(PKG + ".")):
                    base = node.module[len(PKG) + 1:]
                else:
                    continue
                if not node.module or node.module == PKG:
                    # `from . import x` runs the package's __init__ first (and a
                    # reader cannot tell a submodule from an attribute of it):
                    # an edge to the package as well as to module x
                    targets.append(base or "__init__")
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    targets.append(sub if existing(sub) == sub else base or "__init__")
            for t in targets:
                found = existing(t) or "__init__"
                if found != module:
                    out.add(found)
        graph[module] = out
    return graph


def _cycles(graph: Dict[str, Set[str]]):
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack, on, found = [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_sees_known_edges():
    g = import_graph()
    assert "common.archive_index" in g["common.archive"] and "common.files" in g["common.archive_identity"]
    assert "common.kernel_abi" in g["tooling.builder.archive_writer"]
    assert "tooling.package.naming" in g["tooling.package.wheels"]
    assert "integrations.torch_integration" in g["__init__"]
    assert "common.images" in g["commands.info"] and "core.device" in g["commands.info"]


def test_no_import_cycles():
    assert _cycles(import_graph()) == []


def test_imports_run_one_way():
    for module in import_graph():
        _layer(module)  # every module has one
    wrong = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
             for m, targets in sorted(import_graph().items()) for t in sorted(targets)
             if _layer(t) > _layer(m)]
    assert wrong == []


# The tooling's stage subpackages, lowest first: a stage imports only itself,
# the stages listed before it that it depends on, and the runtime.
TOOLING_STAGES = {
    "common": set(),
    "builder": {"common"},
    "package": {"common"},
    "tune": {"common", "builder"},
    "release": {"common", "builder", "package"},
}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "tooling" and len(parts) > 2 else None


def test_every_tooling_module_is_in_a_stage():
    loose = [m for m in import_graph() if m.startswith("tooling.") and _stage(m) is None
             and m != "tooling.__init__"]
    assert loose == [], f"put these in a stage subpackage of tooling/ ({sorted(TOOLING_STAGES)}): {loose}"
    assert set(TOOLING_STAGES) == {_stage(m) for m in import_graph() if _stage(m)}


def test_tooling_stages_import_one_way():
    wrong = [f"{m} imports {t}" for m, targets in sorted(import_graph().items()) if _stage(m)
             for t in sorted(targets) if _stage(t) and _stage(t) != _stage(m)
             and _stage(t) not in TOOLING_STAGES[_stage(m)]]
    assert wrong == []


def test_runtime_never_imports_tooling():
    wrong = [f"{m} -> {t}" for m, targets in sorted(import_graph().items()) if _layer(m) < TOOLING
             for t in targets if _layer(t) == TOOLING]
    assert wrong == []


def test_format_leaves_use_the_standard_library_only():
    allowed = set(sys.stdlib_module_names) | {PKG}
    leaves = [p for p in (SRC / "common").glob("*.py") if p.stem not in ("images", "paths")]
    for path in leaves + [SRC / "_version.py"]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [node.module.split(".")[0]]
            else:
                continue
            assert set(tops) <= allowed, f"{path.relative_to(SRC)} imports {tops}"


@pytest.mark.parametrize("command", [["config", "--libdir"], ["info"], ["smoke", "--help"]])
def test_runtime_commands_do_not_import_the_build_tooling(command):
    code = ("import sys\nfrom aotriton_rocm.commands import cli\n"
            "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('aotriton_rocm.tooling')"
            " or m.split('.')[0] in ('rattler', 'rattler_build', 'matplotlib', 'elftools', 'auditwheel')))")
    proc = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ,
                                            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr


def test_build_extra_import_names_cover_pyproject():
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    from aotriton_rocm.commands.cli import BUILD_EXTRA_IMPORTS

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["build"]
    names = {Requirement(r).name for r in extra}
    assert names <= set(BUILD_EXTRA_IMPORTS), names - set(BUILD_EXTRA_IMPORTS)


def test_a_real_import_error_is_not_hidden(tmp_path, monkeypatch, capsys):
    """Only a missing dependency of the build extra gets the install hint."""
    from aotriton_rocm.commands import cli

    def broken(name, package=None):
        raise ModuleNotFoundError("No module named 'aotriton_rocm.tooling.nonexistent'",
                                  name="aotriton_rocm.tooling.nonexistent")

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["pin", "--torch", "2.11"])

    def no_rattler(name, package=None):
        raise ModuleNotFoundError("No module named 'rattler'", name="rattler")

    monkeypatch.setattr(cli.importlib, "import_module", no_rattler)
    assert cli.main(["package"]) == 2
    assert "pip install 'aotriton-rocm[build]'" in capsys.readouterr().err
