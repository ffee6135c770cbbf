"""``aotriton-rocm aotriton-prefix``: what it refuses before writing anything
(images ``info`` would fail, unknown archs and lines, mount points, files
where a parent directory should be, content it did not write) and how it
replaces a prefix (never neither the old nor the new one; what killed runs
left is restored or removed by the next run). Real archives
(support/real_archives.py) and the installed libaotriton_v2, in process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import real_archives as RA  # noqa: E402

from aotriton_rocm.commands import aotriton_prefix as AP  # noqa: E402
from aotriton_rocm.common.errors import CommandError, UsageError  # noqa: E402
from aotriton_rocm.common.files import file_sha256  # noqa: E402
from aotriton_rocm.common.paths import AOTRITON_API_LINE_OF, aotriton_api_line  # noqa: E402


@pytest.fixture
def images_dir(tmp_path, monkeypatch):
    d = tmp_path / "images"
    from aotriton_rocm.common.images import packaged_inputs_hash

    for arch in ("gfx942", "gfx908"):   # a checkout's runtime takes any build-inputs hash
        RA.write(d, arch, inputs_hash=packaged_inputs_hash() or "a" * 64)
    monkeypatch.setenv("AOTRITON_ROCM_ARCHIVE_DIR", str(d))
    return d


def _write(out: Path, *archs: str, line: str = "0.13", clean: bool = False, notes=None) -> dict:
    options = AP.PrefixOptions(out, line, tuple(archs) or None, clean)
    return AP.write_prefix(options, say=(notes.append if notes is not None else print))


def _tree(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): (os.readlink(p) if p.is_symlink() else p.read_bytes())
            for p in sorted(d.rglob("*")) if p.is_symlink() or p.is_file()}


def _hidden(d: Path) -> list:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:1000])


def _garbage(p: Path) -> None:
    p.write_bytes(os.urandom(3000))


def _wrong_arch(p: Path) -> None:
    p.write_bytes((p.parent / "gfx908.aotr").read_bytes())


@pytest.mark.parametrize("damage,needle", [(_truncate, "truncated"), (_garbage, "not an aotriton-rocm"),
                                           (_wrong_arch, "archive inside is for gfx908")])
def test_a_bad_image_is_refused_and_nothing_written(tmp_path, images_dir, damage, needle):
    from aotriton_rocm.commands.install_checks import archive_problems

    damage(images_dir / "gfx942.aotr")
    assert archive_problems("gfx942", images_dir / "gfx942.aotr")[1]   # info fails it too
    out = tmp_path / "prefix"
    with pytest.raises(CommandError) as e:
        _write(out)
    msg = str(e.value)
    assert e.value.exit_code == 1 and "gfx942: " in msg and needle in msg, msg
    assert "no prefix was written" in msg and "reinstall" in msg and "--arch" in msg
    assert not out.exists() and _hidden(tmp_path) == []
    # an existing prefix stays as it was
    _write(out, "gfx908")
    before = _tree(out)
    with pytest.raises(CommandError):
        _write(out)
    assert _tree(out) == before and _hidden(tmp_path) == []
    _write(out, "gfx908")   # leaving the bad one out works


def test_marker_lists_every_file_with_its_sha256(tmp_path, images_dir):
    out = tmp_path / "prefix"
    record = _write(out)
    marker = json.loads((out / AP.MARKER).read_text())
    assert marker == record
    files = {p.relative_to(out).as_posix() for p in out.rglob("*")
             if p.is_file() and not p.is_symlink()} - {AP.MARKER}
    assert set(marker["files"]) == files and len(files) > 5
    assert all(file_sha256(out / rel) == sha for rel, sha in marker["files"].items())
    assert marker["links"] == {"lib/libaotriton_v2.so": marker["library"]}
    assert marker["images"]["gfx942"] == file_sha256(images_dir / "gfx942.aotr")


def test_changed_or_added_files_need_clean(tmp_path, images_dir):
    out = tmp_path / "prefix"
    _write(out)
    (out / "lib" / "notes.txt").write_text("mine")
    header = out / "include" / "aotriton" / "flash.h"
    header.write_text(header.read_text() + "// edited\n")
    (out / "extra").mkdir()
    with pytest.raises(UsageError) as e:
        _write(out)
    msg = str(e.value)
    assert "added or changed since" in msg and "lib/notes.txt" in msg and "extra/" in msg
    assert "include/aotriton/flash.h (changed)" in msg and "--clean" in msg
    assert (out / "lib" / "notes.txt").read_text() == "mine"
    _write(out, clean=True)
    assert not (out / "lib" / "notes.txt").exists() and not (out / "extra").exists()
    assert "// edited" not in header.read_text()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    with pytest.raises(UsageError, match="was not written by aotriton-rocm aotriton-prefix"):
        _write(foreign)
    _write(foreign, clean=True)
    assert not (foreign / "keep.txt").exists() and (foreign / AP.MARKER).is_file()
    marker = json.loads((foreign / AP.MARKER).read_text())
    del marker["files"]   # as the first version of the command wrote it
    (foreign / AP.MARKER).write_text(json.dumps(marker))
    with pytest.raises(UsageError, match="written by an earlier aotriton-rocm, whose "
                                         "aotriton-rocm-prefix.json does not list the files"):
        _write(foreign)


def test_an_interrupt_between_the_renames_keeps_the_old_prefix(tmp_path, images_dir, monkeypatch):
    out = tmp_path / "prefix"
    _write(out, "gfx908")
    before = _tree(out)
    real_rename, calls = os.rename, []

    def rename(src, dst):   # Ctrl-C right after the old prefix went aside
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(CommandError) as e:
        _write(out)
    monkeypatch.setattr(os, "rename", real_rename)
    assert e.value.exit_code == 130 and "is as it was" in str(e.value)
    assert calls[0] == ("prefix", f".prefix.prefix-old-{os.getpid()}")
    assert _tree(out) == before and _hidden(tmp_path) == []


def test_the_next_run_undoes_what_a_killed_run_left(tmp_path, images_dir):
    """SIGKILL between the two renames: the prefix is aside, the new one
    staged. The next run renames the old one back (then replaces it), and
    removes every stage and old directory of a dead run, saying so."""
    out = tmp_path / "prefix"
    _write(out, "gfx908")
    dead = _dead_pid()
    aside, stage = tmp_path / f".prefix.prefix-old-{dead}", tmp_path / f".prefix.prefix-stage-{dead}"
    os.rename(out, aside)
    (stage / "lib").mkdir(parents=True)
    (stage / "lib" / "big.bin").write_bytes(b"\0" * 4096)
    legacy = tmp_path / f".prefix.prefix-{dead}"   # the stage name of earlier versions
    legacy.mkdir()
    live = tmp_path / f".prefix.prefix-stage-{os.getppid()}"   # a run in progress
    live.mkdir()
    notes = []
    _write(out, "gfx942", notes=notes)
    assert any(n.startswith(f"restored {out} from {aside.name}") for n in notes), notes
    assert f"removed {stage}, left by a killed run" in notes and len(notes) == 3, notes
    assert _hidden(tmp_path) == [live.name]
    assert sorted(p.name for p in (out / "lib" / "aotriton.images").iterdir()) == ["amd-gfx942"]
    # killed after the new prefix went in place: only the old one is left over
    os.rename(out, aside)
    (out / "lib").mkdir(parents=True)
    notes = []
    _write(out, "gfx908", clean=True, notes=notes)
    assert notes == [f"removed {aside}, left by a killed run"]
    assert _hidden(tmp_path) == [live.name]


def test_out_refused_up_front(tmp_path, images_dir):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match=f"{f} is a file, not a directory, so nothing can be "
                                         f"written under it"):
        _write(f / "sub")
    with pytest.raises(UsageError, match="is a file, not a directory: pass a directory"):
        _write(f)
    if os.path.ismount("/dev/shm"):
        with pytest.raises(UsageError) as e:
            _write(Path("/dev/shm"))
        assert "/dev/shm is a mount point" in str(e.value)
        assert "--out /dev/shm/aotriton-prefix" in str(e.value)


def test_only_existing_lines_are_accepted():
    for line in AOTRITON_API_LINE_OF:
        assert AP.parse_line(line) == AOTRITON_API_LINE_OF[line]
    for text in ("0.13.9", "0.13.0", "0.1", "13", "", "0.10"):
        with pytest.raises(UsageError) as e:
            AP.parse_line(text)
        assert f"--line {text}: not an AOTriton API line" in str(e.value)
        assert ", ".join(AP.api_lines()) in str(e.value)
    assert aotriton_api_line("0.12.0") == "0.13"   # torch-dropin's full versions still map


def test_unknown_arch_is_named_with_the_known_ones(tmp_path, images_dir):
    with pytest.raises(CommandError) as e:
        _write(tmp_path / "p", "gfx9422")
    msg = str(e.value)
    assert "unknown arch gfx9422" in msg and "installed: gfx908, gfx942" in msg
    assert "aotriton-rocm[gfx9422]" not in msg and "build --arch gfx9422" not in msg
    assert not (tmp_path / "p").exists()


def test_help_names_every_line_and_clean():
    import argparse

    p = argparse.ArgumentParser()
    AP.add_aotriton_prefix_arguments(p)
    text = " ".join(p.format_help().split())
    assert "--clean" in text and "not write" in text
    assert all(line in text for line in AP.api_lines())
    assert p.parse_args(["--out", "x"]).clean is False


def test_concurrent_runs_take_turns(tmp_path, images_dir):
    """Runs writing one --out at once (one per rank of a job) take turns on a
    lock beside it: each ends whole, and nothing of theirs is left beside it."""
    out = tmp_path / "prefix"
    code = ("import sys; from pathlib import Path; from aotriton_rocm.commands import aotriton_prefix as AP; "
            "AP.write_prefix(AP.PrefixOptions(Path(sys.argv[1]), '0.13', None, False), say=print)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    assert all(rc == 0 for rc, _ in results), results
    marker = json.loads((out / AP.MARKER).read_text())
    assert {rel: file_sha256(out / rel) for rel in marker["files"]} == marker["files"]
    assert _hidden(tmp_path) == []
