"""The two commands around our libaotriton_v2 (AOTriton's API): ``aotriton-prefix``
(an AOTRITON_INSTALLED_PREFIX for a PyTorch build) and ``torch-dropin`` (our
library in place of the one inside a ROCm torch), on real files: libraries
compiled here with the C compiler, the installed libaotriton_v2 of each line,
small real kernel archives, and a CMake consumer of the prefix configured the
way PyTorch's aotriton.cmake consumes one."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import real_archives as RA  # noqa: E402

from aotriton_rocm.common.elf_dynamic import ElfError, read_dynamic  # noqa: E402
from aotriton_rocm.common.paths import aotriton_api_include, aotriton_api_library  # noqa: E402

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "aotriton_rocm", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def _shared(out: Path, soname: str, source: str, *link: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src), f"-Wl,-soname,{soname}",
                    "-Wl,-rpath,$ORIGIN", *link], check=True, capture_output=True)
    return out


def fake_torch(root: Path, aotriton_version: str = "0.11.2", kind: str = "rocm") -> Path:
    """A torch/lib whose libtorch_hip.so needs libaotriton_v2.so.<version> by that
    file name, as a ROCm torch wheel's does (or a CUDA / CPU torch's lib)."""
    lib = root / "torch" / "lib"
    lib.mkdir(parents=True)
    if kind == "cuda":
        _shared(lib / "libtorch_cuda.so", "libtorch_cuda.so", "int torch_cuda(void){return 1;}\n")
        return lib
    if kind == "cpu":
        _shared(lib / "libtorch_cpu.so", "libtorch_cpu.so", "int torch_cpu(void){return 1;}\n")
        return lib
    name = f"libaotriton_v2.so.{aotriton_version}"
    _shared(lib / name, name, "int upstream_aotriton(void){return 7;}\n")
    _shared(lib / "libtorch_hip.so", "libtorch_hip.so", "int torch_hip(void){return 1;}\n",
            "-Wl,--no-as-needed", f"-L{lib}", f"-l:{name}", "-lc")
    return lib


def test_elf_dynamic_reads_soname_and_needed(tmp_path):
    lib = fake_torch(tmp_path)
    info = read_dynamic(lib / "libtorch_hip.so")
    assert info.soname == "libtorch_hip.so"
    assert "libaotriton_v2.so.0.11.2" in info.needed and "libc.so.6" in info.needed
    if shutil.which("readelf"):   # an independent reader agrees
        out = subprocess.run(["readelf", "-d", str(lib / "libtorch_hip.so")], capture_output=True,
                             text=True, check=True).stdout
        assert sorted(info.needed) == sorted(line.split("[")[1].split("]")[0] for line in
                                             out.splitlines() if "(NEEDED)" in line)
    (tmp_path / "text.so").write_text("not an ELF file")
    with pytest.raises(ElfError, match="not an ELF"):
        read_dynamic(tmp_path / "text.so")


@pytest.mark.parametrize("version,line", [("0.11.2", "0.11"), ("0.12.0", "0.13"), ("0.13.0", "0.13"),
                                          ("0.14.0", "0.14")])
def test_dropin_installs_the_same_line_and_undo_restores(tmp_path, version, line):
    lib = fake_torch(tmp_path, version)
    name = f"libaotriton_v2.so.{version}"
    original = (lib / name).read_bytes()
    p = _cli("torch-dropin", "--torch-lib", str(lib))
    assert p.returncode == 0, p.stderr
    ours = aotriton_api_library(line)
    assert (lib / name).read_bytes() == ours.read_bytes()
    assert (lib / f"{name}.aotriton-rocm-backup").read_bytes() == original
    record = json.loads((lib / ".aotriton-rocm-dropin.json").read_text())
    assert record["file"] == name and record["aotriton_api_line"] == line
    # torch's library loads ours under the name it needs, with every symbol resolved
    code = ("import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW); "
            "print([l.split()[-1] for l in open('/proc/self/maps') if 'libaotriton_v2' in l][0])")
    p = subprocess.run([sys.executable, "-c", code, str(lib / "libtorch_hip.so")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()) == lib / name
    assert read_dynamic(lib / name).soname == ours.name
    # what smoke and info report once that library is loaded
    code = ("import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW); "
            "from aotriton_rocm.commands.torch_lib_state import loaded_aotriton; print(loaded_aotriton())")
    p = subprocess.run([sys.executable, "-c", code, str(lib / "libtorch_hip.so")],
                       capture_output=True, text=True)
    assert p.stdout.startswith(f"aotriton-rocm's drop-in (AOTriton API line {line}): {lib / name}"), \
        p.stdout + p.stderr
    # a second run keeps the first backup (torch's own library), not ours
    assert _cli("torch-dropin", "--torch-lib", str(lib)).returncode == 0
    assert (lib / f"{name}.aotriton-rocm-backup").read_bytes() == original
    p = _cli("torch-dropin", "--torch-lib", str(lib), "--undo")
    assert p.returncode == 0, p.stderr
    assert (lib / name).read_bytes() == original
    p = subprocess.run([sys.executable, "-c", code, str(lib / "libtorch_hip.so")],
                       capture_output=True, text=True)
    assert p.stdout.startswith(f"torch's own AOTriton: {lib / name}"), p.stdout + p.stderr
    assert not (lib / ".aotriton-rocm-dropin.json").exists()
    assert not (lib / f"{name}.aotriton-rocm-backup").exists()
    assert sorted(f.name for f in lib.iterdir() if f.name.startswith(".")) == []


@pytest.mark.parametrize("kind,version,message", [
    ("cuda", "0.11.2", "CUDA torch"),
    ("cpu", "0.11.2", "CPU-only torch"),
    ("rocm", "0.10.0", "AOTriton 0.10.0 is not an API line"),
])
def test_dropin_refuses(tmp_path, kind, version, message):
    lib = fake_torch(tmp_path, version, kind)
    before = sorted(f.name for f in lib.iterdir())
    p = _cli("torch-dropin", "--torch-lib", str(lib))
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert sorted(f.name for f in lib.iterdir()) == before


def test_dropin_refuses_undo_without_a_dropin(tmp_path):
    p = _cli("torch-dropin", "--torch-lib", str(fake_torch(tmp_path)), "--undo")
    assert p.returncode == 2 and "no aotriton-rocm drop-in to undo" in p.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="mounts torch's lib read-only in a mount namespace of its own")
def test_dropin_refuses_a_read_only_torch(tmp_path):
    lib = fake_torch(tmp_path)
    before = {f.name: f.read_bytes() for f in lib.iterdir() if f.is_file()}
    script = (f"mount --bind {lib} {lib} && mount -o remount,ro,bind {lib} && "
              f"exec {sys.executable} -m aotriton_rocm torch-dropin --torch-lib {lib}")
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                       timeout=300)
    if "mount:" in p.stderr:
        pytest.skip(f"no read-only bind mount here: {p.stderr.strip()}")
    assert p.returncode == 2 and "read-only file system" in p.stderr, p.stderr
    assert {f.name: f.read_bytes() for f in lib.iterdir() if f.is_file()} == before


@pytest.fixture
def images_dir(tmp_path):
    d = tmp_path / "images"
    RA.write(d, "gfx942")
    RA.write(d, "gfx908")
    return d


def test_prefix_layout_and_replacement(tmp_path, images_dir):
    out = tmp_path / "prefix"
    env = {"AOTRITON_ROCM_ARCHIVE_DIR": str(images_dir)}
    p = _cli("aotriton-prefix", "--out", str(out), "--line", "0.12", env=env)
    assert p.returncode == 0, p.stderr
    assert f"AOTRITON_INSTALLED_PREFIX={out}" in p.stdout
    lib = out / "lib"
    ours = aotriton_api_library("0.13")
    assert (lib / ours.name).read_bytes() == ours.read_bytes()
    assert os.readlink(lib / "libaotriton_v2.so") == ours.name
    for arch in ("gfx908", "gfx942"):
        assert (lib / "aotriton.images" / f"amd-{arch}" / f"{arch}.aotr").read_bytes() == \
            (images_dir / f"{arch}.aotr").read_bytes()
    headers = sorted(p.relative_to(out).as_posix() for p in (out / "include").rglob("*.h"))
    want = sorted(("include/" + p.relative_to(aotriton_api_include("0.13")).as_posix())
                  for p in aotriton_api_include("0.13").rglob("*.h"))
    assert headers == want and "include/aotriton/flash.h" in headers
    # a rerun replaces its own prefix (one arch now); a foreign directory is refused
    p = _cli("aotriton-prefix", "--out", str(out), "--line", "0.11", "--arch", "gfx942", env=env)
    assert p.returncode == 0, p.stderr
    assert sorted(d.name for d in (lib / "aotriton.images").iterdir()) == ["amd-gfx942"]
    assert (lib / aotriton_api_library("0.11").name).is_file()
    assert not (lib / ours.name).exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    p = _cli("aotriton-prefix", "--out", str(foreign), env=env)
    assert p.returncode == 2 and "was not written by aotriton-rocm" in p.stderr
    assert [f.name for f in foreign.iterdir()] == ["keep.txt"]
    p = _cli("aotriton-prefix", "--out", str(tmp_path / "p2"), "--arch", "gfx1100", env=env)
    assert p.returncode == 1 and "aotriton-rocm[gfx1100]" in p.stderr, p.stderr
    assert not (tmp_path / "p2").exists()
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                    reason="needs cmake and a C++ compiler")
@pytest.mark.parametrize("line", ["0.11", "0.13", "0.14"])
def test_prefix_builds_a_consumer_as_pytorch_does(tmp_path, images_dir, line):
    """PyTorch's aotriton.cmake with AOTRITON_INSTALLED_PREFIX=$P: link
    $P/lib/libaotriton_v2.so, include $P/include."""
    prefix = tmp_path / "prefix"
    p = _cli("aotriton-prefix", "--out", str(prefix), "--line", line,
             env={"AOTRITON_ROCM_ARCHIVE_DIR": str(images_dir)})
    assert p.returncode == 0, p.stderr
    src = tmp_path / "consumer"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.18)
        project(consumer LANGUAGES CXX)
        set(CMAKE_CXX_STANDARD 17)
        add_library(__caffe2_aotriton INTERFACE)
        target_link_libraries(__caffe2_aotriton INTERFACE "$ENV{AOTRITON_INSTALLED_PREFIX}/lib/libaotriton_v2.so")
        target_include_directories(__caffe2_aotriton INTERFACE $ENV{AOTRITON_INSTALLED_PREFIX}/include)
        add_executable(consumer main.cpp)
        target_link_libraries(consumer PRIVATE __caffe2_aotriton)
        """))
    (src / "main.cpp").write_text(textwrap.dedent("""\
        #include <aotriton/config.h>
        #include <aotriton/flash.h>
        #include <cstdio>
        int main() {
          std::printf("%d.%d.%d\\n", AOTRITON_VERSION_MAJOR, AOTRITON_VERSION_MINOR, AOTRITON_VERSION_PATCH);
          // no GPU here: the library answers with an error code, it does not crash
          hipError_t e = aotriton::v2::flash::check_gpu(aotriton::Stream(nullptr));
          std::printf("%d\\n", static_cast<int>(e));
          return 0;
        }
        """))
    env = {**os.environ, "AOTRITON_INSTALLED_PREFIX": str(prefix)}
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(src), "-B", str(build)], ["cmake", "--build", str(build)]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    run = subprocess.run([str(build / "consumer")], capture_output=True, text=True,
                         env={**env, "LD_LIBRARY_PATH": str(prefix / "lib")})
    assert run.returncode == 0, run.stderr
    version, check_gpu = run.stdout.split()
    assert version == aotriton_api_library(line).name.split(".so.")[1]
    assert int(check_gpu) != 0
    needed = read_dynamic(build / "consumer").needed
    assert aotriton_api_library(line).name in needed
