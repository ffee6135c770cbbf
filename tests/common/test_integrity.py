"""Integrity end to end: an archive must be what its file name, its sidecar,
the device and the runtime's ABI line say it is (archive_identity.identity_problems),
at every boundary: the runtime loader, smoke, info, validate, package, build.
Archives are real (tests/support/real_archives.py: the real writer); commands run
through their real entry points."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from support import real_archives as RA
from aotriton_rocm.common import archive as A
from aotriton_rocm.common import archive_identity as AI
from aotriton_rocm.core import backends, device
from aotriton_rocm.commands import cli, smoke
from aotriton_rocm.common import images
from aotriton_rocm._version import ABI_VERSION

ROOT = Path(__file__).resolve().parents[2]


# -- the rule ------------------------------------------------------------------

def test_identity_rule(tmp_path):
    good = RA.write(tmp_path / "a", "gfx942")
    assert AI.identity_problems(A.Archive.open(good), expected_arch="gfx942",
                               expected_abi=ABI_VERSION) == []
    # (1) a gfx90a archive and its sidecar copied to gfx942.*
    src = RA.write(tmp_path / "b", "gfx90a")
    renamed = RA.copy_as(src, tmp_path / "c", "gfx942")
    probs = AI.identity_problems(A.Archive.open(renamed), expected_arch="gfx942")
    text = "\n".join(probs)
    assert "file name says arch gfx942 but the archive inside is for gfx90a" in text
    assert "the archive is for gfx90a, the device is gfx942" in text
    assert "describes the archive file 'gfx90a.aotr', not gfx942.aotr" in text
    assert str(renamed) in text and "pip install --force-reinstall --no-deps 'aotriton-rocm-gfx942~=" in text
    assert "aotriton-rocm build --arch gfx942 --out" in "\n".join(
        AI.identity_problems(A.Archive.open(renamed), context="build"))
    # (2) an image of another ABI line
    other = RA.write(tmp_path / "d", "gfx942", version="0.2.0")
    [msg] = AI.identity_problems(A.Archive.open(other), expected_abi="0.1")
    assert "ABI line 0.2, the runtime is ABI line 0.1" in msg and str(other) in msg
    assert "aotriton-rocm-gfx942~=0.1.0" in msg and "aotriton-rocm~=0.2.0" in msg
    # a sidecar from another build of the same arch: hash named, both values
    RA.write(tmp_path / "e", "gfx942", inputs_hash="b" * 64)
    import shutil
    shutil.copyfile(tmp_path / "e" / "gfx942.manifest.json", tmp_path / "a" / "gfx942.manifest.json")
    [msg] = AI.identity_problems(A.Archive.open(good))
    assert "build_inputs_hash 'bbbb" in msg and f"differs from '{RA.tree_hash()[:4]}" in msg


def test_fifo_refused_before_opening(tmp_path):
    fifo = tmp_path / "gfx942.aotr"
    os.mkfifo(fifo)
    with pytest.raises(A.ArchiveError, match="is a FIFO, not a regular file"):
        A.Archive.open(fifo)  # would block forever in open() without the check
    (tmp_path / "gfx942.manifest.json").write_text("{}")
    assert "FIFO" in AI.verify_against_manifest(fifo)[0]


# -- the runtime loader ----------------------------------------------------------

def test_loader_refuses_other_arch_and_other_abi(isolated_images, monkeypatch):
    monkeypatch.setattr(backends, "arch_of", lambda i: "gfx942")
    src = RA.write(isolated_images.parent / "src", "gfx90a")
    RA.copy_as(src, isolated_images, "gfx942")
    b = backends.AOTBackend(0)
    assert b.problem and "the device is gfx942" in b.problem and "gfx90a" in b.problem
    reason = b.unsupported_reason(dtype="fp16", head_dim=64)
    assert reason == b.problem  # torch's kernel runs; no gfx90a code reaches the device
    assert not hasattr(b, "runtime")  # never handed to libaotriton_rocm
    RA.write(isolated_images, "gfx942", version="0.2.0")
    images.clear_cache()
    b = backends.AOTBackend(0)
    assert "ABI line 0.2, the runtime is ABI line 0.1" in b.problem
    RA.write(isolated_images, "gfx942")
    images.clear_cache()
    assert backends.AOTBackend(0).problem is None


def test_search_skips_fifo(isolated_images):
    os.mkfifo(isolated_images / "gfx942.aotr")
    assert images.find_archives() == {}
    assert any("not a regular file" in n for n in images.search_notes())


# -- smoke -----------------------------------------------------------------------

def _smoke(capsys, monkeypatch, *argv):
    monkeypatch.setattr(smoke, "cpu_cases", lambda quick=False: [])  # archive checks only
    monkeypatch.setattr(device, "gpu_available", lambda: False)
    rc = cli.main(["smoke", "--device", "cpu", *argv])
    return rc, capsys.readouterr().out


def test_smoke_catches_renamed_and_other_abi_images(isolated_images, capsys, monkeypatch):
    RA.write(isolated_images, "gfx908")
    src = RA.write(isolated_images.parent / "src", "gfx90a")
    RA.copy_as(src, isolated_images, "gfx942")
    RA.write(isolated_images, "gfx1100", version="0.2.0")
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1
    assert "PASS  archive gfx908" in out
    assert "FAIL  archive gfx942" in out and "the archive inside is for gfx90a" in out
    assert "FAIL  archive gfx1100" in out and "ABI line 0.2, the runtime is ABI line 0.1" in out
    assert "0 passed, 2 failed (2 of them installation checks)" in out


def test_smoke_prints_each_problem_once(isolated_images, capsys, monkeypatch):
    p = RA.write(isolated_images, "gfx942")
    RA.flip_payload_byte(p)
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1
    [row] = [line for line in out.splitlines() if line.startswith("FAIL  archive gfx942")]
    problems = row.split(": ", 1)[1].split("; ")
    assert len(problems) == len(set(problems)) and len(problems) >= 2
    assert sum("blob region sha256" in x for x in problems) == 1
    assert "0 passed, 1 failed" in out


def test_smoke_reads_every_archive_with_the_native_library(isolated_images, capsys, monkeypatch):
    """A healthy archive is read and verified again by libaotriton_rocm (the
    reader every GPU call uses); a library that cannot read it fails smoke."""
    from aotriton_rocm.core import native

    path = RA.write(isolated_images, "gfx942")
    read = []
    real = native.verify_archive
    monkeypatch.setattr(native, "verify_archive", lambda p: read.append(Path(p)) or real(p))
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 0 and read == [path] and "PASS  archive gfx942" in out

    def refuse(p):
        raise native.NativeError(6, "AOTR_IDENTITY_MISMATCH", f"{p}: refused")
    monkeypatch.setattr(native, "verify_archive", refuse)
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1 and "FAIL  archive gfx942: libaotriton_rocm: AOTR_IDENTITY_MISMATCH" in out


def test_smoke_without_images_fails_unless_told(isolated_images, capsys, monkeypatch):
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1
    assert "FAIL  kernel images: none installed, so no precompiled archive was checked" in out
    assert "--no-images-ok" in out and "0 passed, 1 failed" in out
    rc, out = _smoke(capsys, monkeypatch, "--no-images-ok")
    assert rc == 0 and "PASS  kernel images: none installed" in out


# -- info ------------------------------------------------------------------------

def test_info_lists_all_and_marks_bad(isolated_images, capsys):
    RA.write(isolated_images, "gfx908")
    damaged = RA.write(isolated_images, "gfx90a")
    damaged.write_bytes(b"AOTRKA\r\n" + b"\0" * 10)  # truncated header
    RA.copy_as(RA.write(isolated_images.parent / "src", "gfx90a"), isolated_images, "gfx942")
    RA.write(isolated_images, "gfx1100", version="0.2.0")
    rc = cli.main(["info"])
    cap = capsys.readouterr()
    assert rc == 1 and "Traceback" not in cap.out + cap.err
    lines = cap.out.splitlines()
    assert any(l.startswith("  gfx908: 2 kernels") for l in lines)
    assert any(l.startswith("  gfx90a: BAD ") and "truncated" in l for l in lines)
    assert any(l.startswith("  gfx942: BAD ") for l in lines)
    assert "the archive inside is for gfx90a" in cap.out
    assert any(l.startswith("  gfx1100: BAD ") for l in lines) and "ABI line 0.2" in cap.out
    assert "3 of 4 kernel image(s) unusable" in cap.err


def test_info_subprocess_no_traceback(tmp_path):
    d = tmp_path / "img"
    RA.write(d, "gfx942").write_bytes(b"garbage")
    env = dict(os.environ, AOTRITON_ROCM_ARCHIVE_DIR=str(d), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.run([sys.executable, "-m", "aotriton_rocm", "info"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "gfx942: BAD" in proc.stdout


# -- validate --------------------------------------------------------------------

def test_validate_reports_every_archive(tmp_path, capsys):

    d = tmp_path / "archives"
    bad = RA.write(d, "gfx90a")
    bad.write_bytes(b"not an archive")
    good = RA.write(d, "sm_90")  # not validated (cubin), identity checked
    renamed = RA.copy_as(RA.write(tmp_path / "src", "sm_90"), d, "sm_80")
    fifo = d / "gfx942.aotr"
    os.mkfifo(fifo)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "rc", cli.main(["validate", str(bad), str(good), str(renamed), str(fifo)])), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "validate hung on a FIFO"
    cap = capsys.readouterr()
    assert result["rc"] == 2
    assert "truncated kernel archive" in cap.err and "is a FIFO, not a regular file" in cap.err
    assert "FAIL sm_90" in cap.out and "file name says arch sm_80" in cap.out
    assert "aotriton-rocm build --arch sm_80 --out" in cap.out
    text = cap.out
    import re
    assert re.search(r"^sm_90\s.*not validated \(cuda\)$", text, re.M)
    assert re.search(r"^gfx90a\s.*FAIL \(unreadable\)$", text, re.M)


# -- package ---------------------------------------------------------------------

def _package(*argv):
    """`aotriton-rocm package` in a subprocess (no wheel is built when it refuses)."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    return subprocess.run([sys.executable, "-m", "aotriton_rocm", "package", "--source-root",
                           str(ROOT), *map(str, argv)], env=env, capture_output=True, text=True,
                          timeout=600)


def _refused(proc, out: Path, *needles):
    text = proc.stderr
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    for n in needles:
        assert n in text, text
    assert not out.exists() or not any(out.glob("*.whl"))


def test_package_verifies_every_archive(tmp_path):
    out = tmp_path / "dist"
    # (3a) a gfx942 archive with a flipped payload byte
    d = tmp_path / "flipped"
    RA.flip_payload_byte(RA.write(d, "gfx942"))
    _refused(_package("--archives", d, "--out", out, "--no-conda"), out,
             "nothing was packaged", "gfx942.aotr", "blob region sha256")
    # (3b) a gfx90a archive next to the gfx942 sidecar
    d = tmp_path / "swapped"
    RA.write(d, "gfx942")
    import shutil
    shutil.copyfile(RA.write(tmp_path / "src90a", "gfx90a"), d / "gfx942.aotr")
    _refused(_package("--archives", d, "--out", out, "--no-conda"), out,
             "file name says arch gfx942 but the archive inside is for gfx90a",
             "aotriton-rocm build --arch gfx942 --out")
    # an image of another ABI line than the tree being packaged
    d = tmp_path / "abi"
    RA.write(d, "gfx942", version="0.2.0")
    _refused(_package("--archives", d, "--out", out, "--no-conda"), out, "0.2.0")


def test_package_refuses_mixed_builds(tmp_path):
    # (4) a stale archive of another build beside the current one
    d = tmp_path / "archives"
    RA.write(d, "gfx942", inputs_hash="a" * 64)
    RA.write(d, "gfx90a", inputs_hash="b" * 64)
    out = tmp_path / "dist"
    _refused(_package("--archives", d, "--out", out, "--no-conda"), out,
             "come from 2 different builds", "gfx942: aaaaaaaaaaaaaaaa", "gfx90a: bbbbbbbbbbbbbbbb",
             "aotriton-rocm build --arch gfx90a,gfx942 --out")


def test_package_argument_errors(tmp_path):
    d = tmp_path / "archives"
    RA.write(d, "gfx942")
    proc = _package("--archives", d, "--out", tmp_path / "o", "--no-conda", "--no-wheels")
    assert proc.returncode == 2 and "leave nothing to build" in proc.stderr
    f = tmp_path / "file"
    f.write_text("x")
    proc = _package("--archives", d, "--out", f, "--no-conda")
    assert proc.returncode == 2 and "is a file, not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr and f.read_text() == "x"


def _default_sigint():
    """A shell that starts a job in the background without job control
    ignores SIGINT in it, and Python then never installs its handler: give
    the command under test the default disposition, as in a terminal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_package_interrupt_leaves_out_untouched(tmp_path, sig, code):
    import signal
    import time

    d = tmp_path / "archives"
    RA.write(d, "gfx942")
    out = tmp_path / "dist"
    out.mkdir()
    (out / "earlier.txt").write_text("from an earlier run")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.Popen([sys.executable, "-m", "aotriton_rocm", "package", "--source-root",
                             str(ROOT), "--archives", str(d), "--out", str(out), "--no-conda",
                             "--clean"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    staging = tmp_path / f".dist.package-staging-{proc.pid}"
    deadline = time.monotonic() + 120
    while not staging.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert staging.exists(), "package never started staging its output"
    time.sleep(2)  # inside the runtime wheel build
    proc.send_signal(getattr(signal, sig))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    last = stderr.splitlines()[-1]
    assert "Traceback" not in stderr and ("interrupted" in last or "terminated" in last)
    assert sorted(p.name for p in out.iterdir()) == ["earlier.txt"]
    assert not staging.exists()
    assert not [p for p in Path(tempfile.gettempdir()).glob(f"aotriton-*-{proc.pid}-*")]


def test_package_leftover_staging_is_removed(tmp_path):
    # a staging directory of a run that died (its pid is gone) goes at the next run
    d = tmp_path / "archives"
    RA.write(d, "gfx942", inputs_hash="a" * 64)
    RA.write(d, "gfx90a", inputs_hash="b" * 64)  # refused: the run stops after the cleanup
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    left = tmp_path / f".dist.package-staging-{dead}"
    (left / "conda").mkdir(parents=True)
    proc = _package("--archives", d, "--out", tmp_path / "dist", "--no-conda")
    assert proc.returncode == 1 and not left.exists()


@pytest.mark.slow
def test_package_owns_its_out(tmp_path):
    """package replaces the whole content of --out (never adds to it): a
    directory it did not write only with --clean, its own earlier output
    always; SHA256SUMS and the SBOM list exactly this run's files; a
    symlinked --out stays a symlink."""
    import json

    d = tmp_path / "archives"
    RA.write(d, "gfx942")
    out = tmp_path / "dist"
    out.mkdir()
    (out / "earlier.txt").write_text("not package's")
    proc = _package("--archives", d, "--out", out, "--no-conda", "--rocm", "6.4")
    assert proc.returncode == 2 and "did not write (earlier.txt)" in proc.stderr
    assert "--clean" in proc.stderr and sorted(p.name for p in out.iterdir()) == ["earlier.txt"]
    proc = _package("--archives", d, "--out", out, "--no-conda", "--rocm", "6.4", "--clean")
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert "PACKAGE-COMPLETE" in names and "earlier.txt" not in names
    marker = json.loads((out / "PACKAGE-COMPLETE").read_text())
    assert marker["archs"] == ["gfx942"] and marker["build_inputs_hash"] == RA.tree_hash()
    assert any(f.startswith("aotriton_rocm_gfx942-") for f in marker["files"])
    assert all((out / f).is_file() for f in marker["files"])
    assert not list(tmp_path.glob(".dist.package-*"))
    printed = proc.stdout.split()
    assert printed and all(Path(p).parent == out and Path(p).is_file() for p in printed)
    _assert_lists_exactly(out, marker["files"])
    # an older image wheel left in package's own output (the probe's mix) goes
    # at the next run, which writes through a symlink to that directory
    stale = out / "aotriton_rocm_gfx90a-0.0.9-py3-none-manylinux_2_28_x86_64.whl"
    stale.write_bytes(b"older kernels")
    link = tmp_path / "link"
    link.symlink_to(out, target_is_directory=True)
    proc = _package("--archives", d, "--out", link, "--no-conda", "--rocm", "6.4")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and link.resolve() == out.resolve()
    assert not stale.exists() and not os.path.lexists(tmp_path / "dist" / stale.name)
    assert not list(tmp_path.glob(".*package-*"))
    _assert_lists_exactly(out, json.loads((out / "PACKAGE-COMPLETE").read_text())["files"])


def _assert_lists_exactly(out: Path, files):
    """SHA256SUMS lists the run's files and its SBOM, nothing else; so does the SBOM."""
    import json

    sums = sorted(line.split("  ", 1)[1] for line in (out / "SHA256SUMS").read_text().splitlines())
    [sbom] = [f for f in sums if f.endswith(".cdx.json")]
    assert sorted(f for f in sums if f != sbom) == sorted(files)
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted(sums + ["PACKAGE-COMPLETE", "SHA256SUMS"])
    names = json.dumps(json.loads((out / sbom).read_text()))
    assert all(Path(f).name in names for f in files)
    assert "aotriton_rocm_gfx90a-0.0.9" not in names


def test_package_refuses_before_any_work(tmp_path):
    """Refused up front, each with the file and the next step: a mount point
    as --out, archives of other kernel sources (both hashes, the rebuild
    command), a subset build without --allow-subset."""
    out = tmp_path / "dist"
    if os.path.ismount("/dev/shm"):
        proc = _package("--archives", tmp_path, "--out", "/dev/shm", "--no-conda")
        assert proc.returncode == 2 and "/dev/shm is a mount point" in proc.stderr
        assert "--out /dev/shm/dist" in proc.stderr and "Traceback" not in proc.stderr
    inside = RA.write(tmp_path / "dist" / "archives", "gfx942").parent
    proc = _package("--archives", inside, "--out", out, "--no-conda", "--clean")
    assert proc.returncode == 2 and f"holds the archives ({inside})" in proc.stderr
    assert (inside / "gfx942.aotr").is_file()
    shutil.rmtree(out)
    d = tmp_path / "older"
    RA.write(d, "gfx942", inputs_hash="b" * 64)
    RA.write(d, "gfx90a", inputs_hash="b" * 64)
    _refused(_package("--archives", d, "--out", out, "--no-conda"), out,
             "2 archive(s) were not built from the sources being packaged",
             f"build inputs hash {'b' * 64}, the source tree's {RA.tree_hash()}",
             "aotriton-rocm build --arch gfx90a,gfx942 --out OUT, then package OUT/archives "
             f"(build writes its archives into OUT/archives/, never into {tmp_path}/older itself)")
    d = tmp_path / "subset"
    RA.write(d, "gfx942", subset="dtype=fp16")
    _refused(_package("--archives", d, "--out", out, "--no-conda"), out,
             "come from a subset build", "(--only dtype=fp16)", "--allow-subset",
             "aotriton-rocm build --arch gfx942 --out")
    assert not out.exists()


def test_package_removes_scratch_of_killed_runs(tmp_path):
    """A killed run's scratch in the temporary directory (its pid is gone)
    goes at the next run, even one that is refused; a live run's stays."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    tmp = tmp_path / "tmp"
    left = [tmp / f"aotriton-wheels-{dead}-x1", tmp / f"aotriton-conda-{dead}-x2"]
    live = tmp / f"aotriton-wheels-{os.getpid()}-x3"
    for p in left + [live]:
        (p / "runtime").mkdir(parents=True)
        (p / "runtime" / "big.bin").write_bytes(b"\0" * 4096)
    stale_link = tmp_path / f".dist.package-old-{dead}"
    stale_link.symlink_to(tmp_path)
    out = tmp_path / "dist"
    out.mkdir()
    (out / "x").write_text("x")
    env = dict(os.environ, TMPDIR=str(tmp), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.run([sys.executable, "-m", "aotriton_rocm", "package", "--source-root",
                           str(ROOT), "--archives", str(tmp_path), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert not any(p.exists() for p in left) and live.exists()
    assert not os.path.lexists(stale_link) and tmp_path.is_dir()


# -- build -----------------------------------------------------------------------

def _toy_root(base: Path) -> Path:
    from support.toy_build import make_root
    return make_root(base)


def _build_cli(root: Path, *argv):
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    return subprocess.run([sys.executable, "-m", "aotriton_rocm", "build", "--no-progress",
                           "--source-root", str(root), "--rocm", "6.4", *map(str, argv)],
                          env=env, capture_output=True, text=True, timeout=600)


def test_build_sets_aside_stale_archive_and_package_refuses_mixed(tmp_path):
    pytest.importorskip("triton")
    root = _toy_root(tmp_path / "root")
    out = tmp_path / "out"
    proc = _build_cli(root, "--arch", "gfx942,sm_90", "--out", out, "-j", "1")
    assert proc.returncode == 0, proc.stderr
    # the same inputs, another arch alone: the earlier archives stay (same hash)
    old_hash = A.Archive.open(out / "archives" / "sm_90.aotr").manifest["build_inputs_hash"]
    # kernels change; gfx942 alone is rebuilt into the same --out
    (root / "kernels" / "toy.py").write_text((root / "kernels" / "toy.py").read_text() + "\n# v2\n")
    proc = _build_cli(root, "--arch", "gfx942", "--out", out, "-j", "1")
    assert proc.returncode == 0, proc.stderr
    assert "sm_90.aotr came from other build inputs" in proc.stderr
    names = sorted(p.name for p in (out / "archives").iterdir())
    assert names == ["gfx942.aotr", "gfx942.manifest.json", "stale"]
    stale = A.Archive.open(out / "archives" / "stale" / "sm_90.aotr")
    assert stale.manifest["build_inputs_hash"] == old_hash
    new_hash = A.Archive.open(out / "archives" / "gfx942.aotr").manifest["build_inputs_hash"]
    assert new_hash != old_hash
    # put it back (a user's cp): package refuses the mix
    import shutil
    for f in ("sm_90.aotr", "sm_90.manifest.json"):
        shutil.copyfile(out / "archives" / "stale" / f, out / "archives" / f)
    dist = tmp_path / "dist"
    _refused(_package("--archives", out / "archives", "--out", dist, "--no-conda"), dist,
             "come from 2 different builds", "aotriton-rocm build --arch gfx942,sm_90 --out")
    # another arch of the same inputs built later leaves gfx942 alone
    (out / "archives" / "sm_90.aotr").unlink()
    (out / "archives" / "sm_90.manifest.json").unlink()
    proc = _build_cli(root, "--arch", "sm_90", "--out", out, "-j", "1")
    assert proc.returncode == 0, proc.stderr
    assert "came from other build inputs" not in proc.stderr
    assert (out / "archives" / "gfx942.aotr").is_file()


def test_build_argument_errors(tmp_path):
    pytest.importorskip("triton")
    root = _toy_root(tmp_path / "root")
    proc = _build_cli(root, "--arch", "", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "names no arch" in proc.stderr
    assert not (tmp_path / "o").exists()
    proc = _build_cli(root, "--arch", "gfx942", "-j", "-3", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "must be 1 or more" in proc.stderr
    f = tmp_path / "file"
    f.write_text("x")
    proc = _build_cli(root, "--arch", "gfx942", "--out", f)
    assert proc.returncode == 2 and "is a file, not a directory" in proc.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    target = ro / "out" if os.geteuid() != 0 else Path("/sys/aotriton-rocm-test-out")
    proc = _build_cli(root, "--arch", "gfx942", "--out", target)
    assert proc.returncode == 2 and "cannot be written" in proc.stderr, proc.stderr
    for p in (proc,):
        assert "Traceback" not in p.stderr


def test_build_removes_leftovers_of_interrupted_runs(tmp_path):
    pytest.importorskip("triton")
    from aotriton_rocm.tooling.builder import command as B

    root = _toy_root(tmp_path / "root")
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    leftovers = [out / ".tmp" / f"triton-cache-{dead}-abc", out / ".tmp" / "triton-cache-x1y2"]
    alive = out / ".tmp" / f"triton-cache-{os.getpid()}-running"
    for d in leftovers + [alive]:
        (d / "junk").mkdir(parents=True)
        (d / "junk" / "big.bin").write_bytes(b"\0" * 4096)
    B.build("6.4", ["gfx942"], out, source_root=root, jobs=1, progress=False)
    assert not any(d.exists() for d in leftovers)
    assert alive.exists()  # a build running now (here: this process) is left alone


def _session_pids(sid: int):
    """Processes of session ``sid`` (the build and everything it started)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state ppid pgrp session
            pids.append(int(d.name))
    return pids


@pytest.mark.parametrize("sig,code,group", [("SIGINT", 130, True), ("SIGTERM", 143, False)])
def test_build_interrupt_ends_the_build(tmp_path, sig, code, group):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) and
    SIGTERM (to the build alone, as `kill` does) end a real build within
    seconds: exit 130 / 143, every compile worker gone, no archive."""
    import signal
    import time

    pytest.importorskip("triton")
    root = _toy_root(tmp_path / "root")
    out = tmp_path / "out"
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.Popen([sys.executable, "-m", "aotriton_rocm", "build", "--no-progress",
                             "--source-root", str(root), "--rocm", "6.4", "--arch", "gfx942,sm_90",
                             "--only", "dtype=fp16", "--out", str(out), "-j", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 180
        while len(_session_pids(proc.pid)) < 2 and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and len(_session_pids(proc.pid)) >= 2, "no compile worker started"
        time.sleep(1.0)  # the workers are compiling
        sent = time.monotonic()
        if group:
            os.killpg(proc.pid, getattr(signal, sig))
        else:
            proc.send_signal(getattr(signal, sig))
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, stderr
    assert took < 10, f"took {took:.1f} s to end"
    assert "Traceback" not in stderr, stderr
    assert "no archive written" in stderr.splitlines()[-1]
    time.sleep(0.5)
    assert _session_pids(proc.pid) == [], "compile workers outlived the build"
    assert not list(out.rglob("*.aotr")) and not (out / ".tmp").exists()


# -- smoke and info: the installation checks --------------------------------------

def test_info_verifies_what_smoke_verifies(isolated_images, capsys, monkeypatch):
    """A flipped payload byte: info too says so and exits non-zero (it used
    to count the kernels and pass)."""
    RA.flip_payload_byte(RA.write(isolated_images, "gfx942"))
    rc = cli.main(["info"])
    cap = capsys.readouterr()
    assert rc == 1 and "gfx942: BAD" in cap.out and "blob region sha256" in cap.out
    assert "library: libaotriton_rocm" in cap.out
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1 and "FAIL  archive gfx942" in out and "blob region sha256" in out


def test_images_of_another_build_than_the_runtime(isolated_images, capsys, monkeypatch):
    """The runtime wheel records the build-inputs hash it was packaged with;
    an image of other kernel sources fails smoke and info."""
    RA.write(isolated_images, "gfx942", inputs_hash="b" * 64)
    monkeypatch.setattr(images, "packaged_inputs_hash", lambda: RA.tree_hash())
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1 and "built from other kernel sources (build inputs hash bbbb" in out
    assert RA.tree_hash() in out and "'aotriton-rocm-gfx942~=" in out
    assert cli.main(["info"]) == 1 and "built from other kernel sources" in capsys.readouterr().out
    monkeypatch.setattr(images, "packaged_inputs_hash", lambda: "b" * 64)
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 0, out


def test_missing_archive_of_installed_image_names_its_wheel(tmp_path, capsys, monkeypatch):
    """An installed image wheel (its entry point and package are there) whose
    .aotr was deleted: the fix reinstalls that very wheel."""
    import importlib.metadata as md

    site = tmp_path / "site"
    pkg = site / "aotriton_rocm_gfx942"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    dist_info = site / "aotriton_rocm_gfx942-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: aotriton-rocm-gfx942\n"
                                        "Version: 0.1.0\n")
    (dist_info / "entry_points.txt").write_text("[aotriton_rocm.images]\n"
                                                "gfx942 = aotriton_rocm_gfx942\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(images.ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "empty-prefix"))
    monkeypatch.setattr(images, "_entry_points", lambda: list(
        md.distribution("aotriton-rocm-gfx942").entry_points))
    images.clear_cache()
    try:
        fix = "pip install --force-reinstall --no-deps 'aotriton-rocm-gfx942==0.1.0'"
        rc = cli.main(["info"])
        cap = capsys.readouterr()
        assert rc == 1 and fix in cap.out and "none installed" not in cap.out
        rc, out = _smoke(capsys, monkeypatch)
        assert rc == 1 and f"FAIL  archive gfx942: {pkg / 'gfx942.aotr'} is missing" in out
        assert fix in out and "none installed" not in out
    finally:
        images.clear_cache()


def _as_user_without_root_reads():
    """A command prefix under which file permissions apply (root: the same
    uid without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, via setpriv)."""
    if os.geteuid() != 0:
        return []
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv reads every directory")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.parametrize("mode", [0o000, 0o600])
def test_unreadable_image_directory(tmp_path, mode):
    """info, smoke and the GPU route's lookup with an image directory the
    user cannot list (000) or cannot search (600): a clear message naming
    the directory and the fix, never a traceback."""
    d = tmp_path / "images"
    RA.write(d, "gfx942")
    code = ("import sys\n"
            "from aotriton_rocm.commands import cli, smoke\n"
            "from aotriton_rocm.common import images\n"
            "from aotriton_rocm.core import device\n"
            "smoke.cpu_cases = lambda quick=False: []\n"
            "device.gpu_available = lambda: False\n"
            "print('lookup', images.find_archives())\n"
            "images.clear_cache()\n"
            "print('info rc', cli.main(['info']))\n"
            "print('smoke rc', cli.main(['smoke', '--device', 'cpu']))\n")
    env = dict(os.environ, AOTRITON_ROCM_ARCHIVE_DIR=str(d), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    d.chmod(mode)
    try:
        proc = subprocess.run([*_as_user_without_root_reads(), sys.executable, "-c", code],
                              env=env, capture_output=True, text=True, timeout=300)
    finally:
        d.chmod(0o755)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in text, text
    assert "lookup {}" in proc.stdout and "info rc 1" in proc.stdout and "smoke rc 1" in proc.stdout
    assert f"BAD cannot read {d}" in proc.stdout and "chmod -R a+rX" in proc.stdout
    assert f"FAIL  kernel images: cannot read {d}" in proc.stdout


def test_smoke_json_error_message(isolated_images, capsys, monkeypatch):
    monkeypatch.setattr(smoke, "cpu_cases", lambda quick=False: [])
    monkeypatch.setattr(device, "gpu_available", lambda: False)
    rc = cli.main(["smoke", "--device", "cpu", "--no-images-ok", "--json", "/nonexistent/x.json"])
    err = capsys.readouterr().err
    assert rc == 2 and "/nonexistent does not exist" in err and "Traceback" not in err


def test_broken_torch_extension_fails_smoke_and_info(isolated_images, tmp_path, capsys, monkeypatch):
    """An empty libaotriton_rocm_torch.so (the default route on torch >=
    2.10) fails smoke and info; so does an empty libaotriton_rocm."""
    from aotriton_rocm.core import torch_native

    if not torch_native._torch_version_ok():
        pytest.skip("torch < 2.10 takes no torch extension")
    RA.write(isolated_images, "gfx942")
    empty = tmp_path / "libaotriton_rocm_torch.so"
    empty.write_bytes(b"")
    monkeypatch.setenv(torch_native.ENV_VAR, str(empty))
    monkeypatch.setattr(torch_native, "_lib", None)
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1 and f"FAIL  torch extension: cannot load {empty}" in out
    assert "pip install --force-reinstall --no-deps 'aotriton-rocm==" in out
    assert cli.main(["info"]) == 1
    cap = capsys.readouterr()
    assert "torch extension: BAD cannot load" in cap.out and "torch extension" in cap.err
    env = dict(os.environ, AOTRITON_ROCM_NATIVE_LIB=str(empty), TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               AOTRITON_ROCM_ARCHIVE_DIR=str(isolated_images))
    proc = subprocess.run([sys.executable, "-m", "aotriton_rocm", "info"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"library: BAD cannot load {empty}" in proc.stdout


def test_damaged_sidecar_gives_short_lines(isolated_images, capsys, monkeypatch):
    import json

    path = RA.write(isolated_images, "gfx942")
    side = A.manifest_path_for(path)
    doc = json.loads(side.read_text())
    doc["archive"]["size"] = "9" * 65536
    doc["kernels"] = [dict(k, key="k" * 65536 + str(i)) for i, k in enumerate(doc["kernels"])] * 3
    side.write_text(json.dumps(doc))
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1 and max(len(line) for line in out.splitlines()) < 3000
    assert "more characters" in out


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a read-only file system (a tmpfs mounted ro; root only)."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs",
                                            str(d)], capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a read-only file system")
    yield d
    subprocess.run(["umount", str(d)], check=False)


def test_read_only_file_system_is_named(read_only_dir, tmp_path):
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    proc = subprocess.run([sys.executable, "-m", "aotriton_rocm", "release", "--source-root",
                           str(ROOT), "--out", str(read_only_dir / "rel")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "read-only file system" in proc.stderr and "permission denied" not in proc.stderr
    proc = _package("--archives", tmp_path, "--out", read_only_dir / "dist", "--no-conda")
    assert proc.returncode == 2 and "read-only file system" in proc.stderr
    assert "permission denied" not in proc.stderr


# -- enable() without a GPU ------------------------------------------------------------

def test_enable_without_gpu_says_so(monkeypatch):
    import aotriton_rocm
    from aotriton_rocm.integrations import torch_integration

    monkeypatch.setattr(torch_integration, "gpu_available", lambda: False)
    monkeypatch.delenv(torch_integration.CPU_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"no GPU is visible.*enable\(cpu_interpreter=True\)"):
        aotriton_rocm.enable()
    assert not aotriton_rocm.is_enabled()
    aotriton_rocm.enable(cpu_interpreter=True)  # the CPU route is still there
    try:
        assert aotriton_rocm.is_enabled()
    finally:
        aotriton_rocm.disable()


def test_autoload_on_cpu_only_machine_warns(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine where torch sees no GPU")
    env = dict(os.environ, AOTRITON_ROCM_ENABLE="1")
    env.pop("AOTRITON_ROCM_CPU_INTERPRETER", None)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import torch\n"
            "from aotriton_rocm import _autoload, is_enabled\n"
            "_autoload.autoload()\n"  # as torch's backend autoload calls it
            "print('enabled', is_enabled())\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "enabled False" in proc.stdout
    assert "no GPU is visible" in proc.stderr and "Traceback" not in proc.stderr
