"""``torch-dropin`` never loses torch's own libaotriton_v2: torch upgrades the
record does not know about, a lost record or backup, concurrent runs, an
interrupt at every step, a full disk, a permission error.

Real files throughout: torch "wheels" whose libraries are compiled here with
the C compiler, installed and upgraded the way pip does it (the files the old
``torch-X.dist-info/RECORD`` lists removed, the new files and dist-info
written, the drop-in's own files left alone since pip does not know them).
Subprocesses run with AOTRITON_ROCM_NO_TORCH=1 (torch-dropin never imports
torch)."""
from __future__ import annotations

import base64
import csv
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_aotriton_api_commands beside it
from test_aotriton_api_commands import CC, _shared  # noqa: E402

from aotriton_rocm.commands import torch_dropin as D  # noqa: E402
from aotriton_rocm.commands import torch_lib_state as state  # noqa: E402
from aotriton_rocm.commands.cli import main as cli_main  # noqa: E402
from aotriton_rocm.common.paths import aotriton_api_library  # noqa: E402

pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler")

# torch version -> the libaotriton_v2 version its libtorch_hip.so needs
WHEELS = {"2.11.0": "0.11.2", "2.11.1": "0.11.2", "2.13.0": "0.12.0"}
LINE = {"0.11.2": "0.11", "0.12.0": "0.13"}
ENV = {**os.environ, "AOTRITON_ROCM_NO_TORCH": "1"}


def _name(torch_version: str) -> str:
    return f"libaotriton_v2.so.{WHEELS[torch_version]}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict:
    """torch version -> {path in site-packages: file}, each wheel's
    libaotriton_v2 distinct (2.11.0 and 2.11.1 need the same file name)."""
    out = {}
    for version, aotriton in WHEELS.items():
        build = tmp_path_factory.mktemp(f"wheel-{version}")
        name = f"libaotriton_v2.so.{aotriton}"
        _shared(build / name, name, f'const char *torch_build = "{version}";\n'
                "int upstream_aotriton(void){return 7;}\n")
        _shared(build / state.TORCH_HIP, state.TORCH_HIP, "int torch_hip(void){return 1;}\n",
                "-Wl,--no-as-needed", f"-L{build}", f"-l:{name}", "-lc")
        out[version] = {f"torch/lib/{name}": build / name,
                        f"torch/lib/{state.TORCH_HIP}": build / state.TORCH_HIP}
    return out


def pip_install(site: Path, wheels: dict, version: str) -> Path:
    """``pip install torch==version`` into ``site``, over the torch there."""
    for dist in site.glob("torch-*.dist-info"):
        for row in csv.reader((dist / "RECORD").read_text().splitlines()):
            (site / row[0]).unlink(missing_ok=True)
        shutil.rmtree(dist)
    rows = []
    for rel, src in wheels[version].items():
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        digest = base64.urlsafe_b64encode(hashlib.sha256(dst.read_bytes()).digest())
        rows.append(f"{rel},sha256={digest.rstrip(b'=').decode()},{dst.stat().st_size}")
    dist = site / f"torch-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
                                   "Summary: fake\n\nlong description\n")
    rows += [f"{dist.name}/METADATA,,", f"{dist.name}/RECORD,,"]
    (dist / "RECORD").write_text("\n".join(rows) + "\n")
    return site / "torch" / "lib"


def original(wheels: dict, version: str) -> bytes:
    return wheels[version][f"torch/lib/{_name(version)}"].read_bytes()


def ours(version: str) -> bytes:
    return aotriton_api_library(LINE[WHEELS[version]]).read_bytes()


def dropin(lib: Path, *extra: str, capsys=None):
    """The command in this process: (exit status, stdout, stderr)."""
    rc = cli_main(["torch-dropin", "--torch-lib", str(lib), *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def record(lib: Path) -> dict:
    return json.loads((lib / state.RECORD).read_text())


def hidden(lib: Path) -> list:
    return sorted(f.name for f in lib.iterdir() if f.name.startswith("."))


def backups(lib: Path) -> list:
    return sorted(f.name for f in lib.iterdir() if f.name.endswith(state.BACKUP_SUFFIX))


def assert_installed(lib: Path, wheels: dict, version: str) -> None:
    name = _name(version)
    assert (lib / name).read_bytes() == ours(version)
    assert backups(lib) == [name + state.BACKUP_SUFFIX]
    assert (lib / (name + state.BACKUP_SUFFIX)).read_bytes() == original(wheels, version)
    r = record(lib)
    assert (r["torch_version"], r["file"], r["aotriton_api_line"]) == \
        (version, name, LINE[WHEELS[version]])
    assert r["original_sha256"] == hashlib.sha256(original(wheels, version)).hexdigest()
    assert r["sha256"] == hashlib.sha256(ours(version)).hexdigest()
    assert hidden(lib) == [state.RECORD]


def assert_restored(lib: Path, wheels: dict, version: str) -> None:
    assert (lib / _name(version)).read_bytes() == original(wheels, version)
    assert backups(lib) == [] and hidden(lib) == []


def test_upgrade_to_another_file_name(tmp_path, wheels, capsys):
    lib = pip_install(tmp_path, wheels, "2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    assert_installed(lib, wheels, "2.11.0")
    pip_install(tmp_path, wheels, "2.13.0")
    assert not (lib / _name("2.11.0")).exists() and (lib / state.RECORD).exists()
    rc, out, err = dropin(lib, capsys=capsys)
    assert rc == 0, err
    assert ("retired the drop-in record of torch 2.11.0 (libaotriton_v2.so.0.11.2): torch 2.13.0 "
            "(libaotriton_v2.so.0.12.0) is installed now, and its backup "
            "libaotriton_v2.so.0.11.2.aotriton-rocm-backup") in out
    assert "torch 2.13.0's own is kept as libaotriton_v2.so.0.12.0.aotriton-rocm-backup" in out
    assert_installed(lib, wheels, "2.13.0")
    rc, out, err = dropin(lib, "--undo", capsys=capsys)
    assert rc == 0 and "restored torch 2.13.0's own libaotriton_v2.so.0.12.0" in out, err
    assert_restored(lib, wheels, "2.13.0")


def test_upgrade_to_the_same_file_name(tmp_path, wheels, capsys):
    lib = pip_install(tmp_path, wheels, "2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    pip_install(tmp_path, wheels, "2.11.1")
    rc, out, err = dropin(lib, capsys=capsys)
    assert rc == 0, err
    assert "retired the drop-in record of torch 2.11.0 (libaotriton_v2.so.0.11.2): torch 2.11.1" in out
    assert_installed(lib, wheels, "2.11.1")
    assert dropin(lib, "--undo", capsys=capsys)[0] == 0
    assert_restored(lib, wheels, "2.11.1")


@pytest.mark.parametrize("new", ["2.11.1", "2.13.0"])
def test_undo_after_an_upgrade_only_tidies(tmp_path, wheels, capsys, new):
    lib = pip_install(tmp_path, wheels, "2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    pip_install(tmp_path, wheels, new)
    rc, out, err = dropin(lib, "--undo", capsys=capsys)
    assert rc == 0, err
    assert "retired the drop-in record of torch 2.11.0" in out
    assert f"{lib / _name(new)} is torch {new}'s own already; nothing to restore" in out
    assert_restored(lib, wheels, new)


def test_reinstalled_same_version_is_backed_up_anew(tmp_path, wheels, capsys):
    """pip install --force-reinstall of a rebuilt wheel of the same version:
    the file on disk is neither ours nor the recorded original."""
    lib = pip_install(tmp_path, wheels, "2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    rebuilt = dict(wheels)
    rebuilt["2.11.0"] = dict(wheels["2.11.0"])
    rebuilt["2.11.0"][f"torch/lib/{_name('2.11.0')}"] = wheels["2.11.1"][f"torch/lib/{_name('2.11.1')}"]
    pip_install(tmp_path, rebuilt, "2.11.0")
    rc, out, err = dropin(lib, capsys=capsys)
    assert rc == 0 and "was reinstalled since" in out, err
    assert (lib / (_name("2.11.0") + state.BACKUP_SUFFIX)).read_bytes() == original(wheels, "2.11.1")
    assert dropin(lib, "--undo", capsys=capsys)[0] == 0
    assert (lib / _name("2.11.0")).read_bytes() == original(wheels, "2.11.1")


def test_no_record_never_backs_up_ours(tmp_path, wheels, capsys):
    lib = pip_install(tmp_path, wheels, "2.11.0")
    name = _name("2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    # record gone: the backup matches pip's RECORD of this torch, so it is adopted
    (lib / state.RECORD).unlink()
    rc, out, err = dropin(lib, capsys=capsys)
    assert rc == 0, err
    assert_installed(lib, wheels, "2.11.0")
    # record gone and nothing vouches for the backup (no pip metadata): refused, nothing touched
    (lib / state.RECORD).unlink()
    shutil.rmtree(tmp_path / "torch-2.11.0.dist-info")
    before = {f.name: f.read_bytes() for f in lib.iterdir()}
    for extra in ((), ("--undo",)):
        rc, out, err = dropin(lib, *extra, capsys=capsys)
        assert rc == 1 and "pip install --force-reinstall --no-deps torch " in err, err
        assert f"{name}.aotriton-rocm-backup is not torch's own" in err and out == ""
        assert {f.name: f.read_bytes() for f in lib.iterdir()} == before


@pytest.mark.parametrize("old,says", [
    ("older", "retired the drop-in record of an older aotriton-rocm (it names no torch version)"),
    ("unreadable", "retired an unreadable drop-in record"),
])
def test_a_record_of_no_use_is_retired(tmp_path, wheels, capsys, old, says):
    """A record written before records named torch's version (or a damaged
    one): the backup is kept only because pip's RECORD vouches for it."""
    lib = pip_install(tmp_path, wheels, "2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    fields = ("file", "backup", "original_sha256", "sha256", "aotriton_api_line", "source")
    (lib / state.RECORD).write_text(json.dumps({k: record(lib)[k] for k in fields})
                                if old == "older" else "{not json")
    rc, out, err = dropin(lib, capsys=capsys)
    assert rc == 0 and says in out, err
    assert_installed(lib, wheels, "2.11.0")


def test_lost_backup_is_never_claimed(tmp_path, wheels, capsys):
    lib = pip_install(tmp_path, wheels, "2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    (lib / (_name("2.11.0") + state.BACKUP_SUFFIX)).unlink()
    for extra in ((), ("--undo",)):
        rc, out, err = dropin(lib, *extra, capsys=capsys)
        assert rc == 1 and out == "", out
        assert ("is aotriton-rocm's, and no libaotriton_v2.so.0.11.2.aotriton-rocm-backup of torch "
                "2.11.0's own is there. Get torch's own libaotriton_v2 back with: pip install "
                "--force-reinstall --no-deps torch==2.11.0 ;") in err, err
    assert (lib / _name("2.11.0")).read_bytes() == ours("2.11.0") and backups(lib) == []
    # what the message says fixes it
    pip_install(tmp_path, wheels, "2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    assert_installed(lib, wheels, "2.11.0")


def test_reinstall_line_names_the_rocm_index():
    assert state.reinstall_line("2.11.0+rocm7.1") == ("pip install --force-reinstall --no-deps "
                                                  "torch==2.11.0+rocm7.1 --index-url "
                                                  "https://download.pytorch.org/whl/rocm7.1")


def test_parallel_runs_serialise(tmp_path, wheels, capsys):
    """One run per rank of a job on a shared environment, install and undo mixed."""
    for trial, mix in enumerate([["install"] * 8, ["install", "--undo"] * 4, ["install"] * 8]):
        site = tmp_path / f"t{trial}"
        lib = pip_install(site, wheels, "2.11.0")
        procs = [subprocess.Popen([sys.executable, "-m", "aotriton_rocm", "torch-dropin",
                                   "--torch-lib", str(lib)] + ([m] if m == "--undo" else []),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
                 for m in mix]
        results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        for m, (rc, out, err) in zip(mix, results):
            assert "Traceback" not in err and (rc == 0 or (m == "--undo" and rc == 2)), err
        if (lib / state.RECORD).exists():
            assert_installed(lib, wheels, "2.11.0")
        else:
            assert_restored(lib, wheels, "2.11.0")
        assert dropin(lib, "--undo", capsys=capsys)[0] in (0, 2)
        assert_restored(lib, wheels, "2.11.0")


# --- an interrupt at every step ---------------------------------------------------------------

STEPS = {"install": ["record written", "record", "backup written", "backup", "swap written", "swap"],
         "upgrade": ["retire", "record written", "record", "backup written", "backup",
                     "swap written", "swap"],
         "update": ["record written", "record", "swap written", "swap"],
         "undo": ["restore", "forget"]}


def scenario(name: str, site: Path, wheels: dict, capsys) -> tuple:
    """(torch lib, torch version at the end, the command's extra arguments)."""
    lib = pip_install(site, wheels, "2.11.0")
    if name == "install":
        return lib, "2.11.0", ()
    assert dropin(lib, capsys=capsys)[0] == 0
    if name == "undo":
        return lib, "2.11.0", ("--undo",)
    if name == "update":   # in place: the library of an older aotriton-rocm, known by its record
        older = wheels["2.11.1"][f"torch/lib/{_name('2.11.1')}"]
        shutil.copy2(older, lib / _name("2.11.0"))
        sha = D.file_sha256(older)
        (lib / state.RECORD).write_text(json.dumps({**record(lib), "sha256": sha,
                                                "ours_sha256": {sha: "0.11"}}))
        return lib, "2.11.0", ()
    pip_install(site, wheels, "2.13.0")
    return lib, "2.13.0", ()


def test_the_steps_are_those_tested(tmp_path, wheels, capsys, monkeypatch):
    for name, steps in STEPS.items():
        lib, _, extra = scenario(name, tmp_path / name, wheels, capsys)
        seen = []
        monkeypatch.setattr(D, "_reached", seen.append)
        assert dropin(lib, *extra, capsys=capsys)[0] == 0
        monkeypatch.setattr(D, "_reached", lambda step: None)
        assert seen == steps


KILL = ("import os, sys\n"
        "from aotriton_rocm.commands import torch_dropin\n"
        "from aotriton_rocm.commands.cli import main\n"
        "torch_dropin._reached = lambda step: os._exit(9) if step == sys.argv[1] else None\n"
        "sys.exit(main(sys.argv[2:]))\n")


@pytest.mark.parametrize("how", ["killed", "ctrl-c"])
@pytest.mark.parametrize("name,step", [(n, s) for n, steps in STEPS.items() for s in steps])
def test_interrupt_at_every_step(tmp_path, wheels, capsys, monkeypatch, name, step, how):
    lib, version, extra = scenario(name, tmp_path / "a", wheels, capsys)
    if how == "killed":   # kill -9 or power loss: no clean-up runs
        p = subprocess.run([sys.executable, "-c", KILL, step, "torch-dropin", "--torch-lib",
                            str(lib), *extra], capture_output=True, text=True, env=ENV, timeout=120)
        assert p.returncode == 9, p.stderr
    else:
        def stop(reached):
            if reached == step:
                raise KeyboardInterrupt
        monkeypatch.setattr(D, "_reached", stop)
        rc, out, err = dropin(lib, *extra, capsys=capsys)
        monkeypatch.setattr(D, "_reached", lambda reached: None)
        assert rc == 130 and "interrupted" in err
        assert not [f for f in hidden(lib) if f.endswith(D.TMP_SUFFIX) or f == D.LOCK]
    # torch's own is on disk: in place, or as the backup
    target, backup = lib / _name(version), lib / (_name(version) + state.BACKUP_SUFFIX)
    assert original(wheels, version) in [f.read_bytes() for f in (target, backup) if f.exists()]
    other = tmp_path / "b"
    shutil.copytree(tmp_path / "a", other)
    # the next run finishes the drop-in, and --undo then restores torch's own
    rc, out, err = dropin(lib, capsys=capsys)
    assert rc == 0, err
    assert_installed(lib, wheels, version)
    assert dropin(lib, "--undo", capsys=capsys)[0] == 0
    assert_restored(lib, wheels, version)
    # or --undo at once gets torch's own back
    lib = other / "torch" / "lib"
    rc, out, err = dropin(lib, "--undo", capsys=capsys)
    assert rc in (0, 2) and "Traceback" not in err, err
    assert_restored(lib, wheels, version)


# --- a full disk, a permission error -----------------------------------------------------------

@pytest.mark.parametrize("name,step,code,says", [
    ("install", "record written", errno.EACCES, "permission denied: run as the owner of"),
    ("install", "backup written", errno.ENOSPC, "no space left on device: free space on"),
    ("install", "swap written", errno.ENOSPC, "no space left on device: free space on"),
    ("upgrade", "backup written", errno.ENOSPC, "no space left on device: free space on"),
    ("undo", "restore", errno.EACCES, "permission denied: run as the owner of"),
])
def test_os_errors_are_clean(tmp_path, wheels, capsys, monkeypatch, name, step, code, says):
    lib, version, extra = scenario(name, tmp_path, wheels, capsys)

    def fail(reached):
        if reached == step:
            raise OSError(code, os.strerror(code))
    monkeypatch.setattr(D, "_reached", fail)
    rc, out, err = dropin(lib, *extra, capsys=capsys)
    monkeypatch.setattr(D, "_reached", lambda reached: None)
    assert rc == 1 and out == "" and "Traceback" not in err, err
    assert says in err and "then run the command again" in err
    target = lib / _name(version)
    if target.read_bytes() == original(wheels, version):
        assert f"{target} is torch {version}'s own, as before." in err and "kept as" not in err
    else:
        assert f"{target} is aotriton-rocm's; torch {version}'s own is kept as" in err
        assert (lib / (_name(version) + state.BACKUP_SUFFIX)).read_bytes() == original(wheels, version)
    assert not [f for f in hidden(lib) if f.endswith(D.TMP_SUFFIX) or f == D.LOCK]
    if name == "undo":   # an undo whose rename happened: what is left is tidied by the next one
        assert dropin(lib, "--undo", capsys=capsys)[0] == 0
    else:
        assert dropin(lib, capsys=capsys)[0] == 0
        assert_installed(lib, wheels, version)


# --- which library smoke and info say torch loaded ----------------------------------------------

LOADED = ("import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW); "
          "from aotriton_rocm.commands.torch_lib_state import loaded_aotriton; print(loaded_aotriton())")


def loaded(lib: Path) -> str:
    p = subprocess.run([sys.executable, "-c", LOADED, str(lib / state.TORCH_HIP)], capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_loaded_aotriton_goes_by_the_hash(tmp_path, wheels, capsys):
    lib = pip_install(tmp_path, wheels, "2.11.0")
    target = lib / _name("2.11.0")
    assert dropin(lib, capsys=capsys)[0] == 0
    drop = f"aotriton-rocm's drop-in (AOTriton API line 0.11): {target}"
    # a stale record (another torch, another hash) or none: ours is still ours
    stale = {**record(lib), "torch_version": "2.9.0", "sha256": "0" * 64, "ours_sha256": {}}
    (lib / state.RECORD).write_text(json.dumps(stale))
    assert loaded(lib) == drop
    (lib / state.RECORD).unlink()
    assert loaded(lib) == drop
    # a library of ours no longer shipped (an older aotriton-rocm) is known by the record
    older = wheels["2.11.1"][f"torch/lib/{_name('2.11.1')}"]
    shutil.copy2(older, target)
    (lib / state.RECORD).write_text(json.dumps({**stale, "sha256": D.file_sha256(older)}))
    assert loaded(lib) == f"aotriton-rocm's drop-in (AOTriton API line 0.11): {target}"
    (lib / state.RECORD).unlink()
    assert loaded(lib) == f"torch's own AOTriton: {target}"
