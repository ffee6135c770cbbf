"""C and C++ programs built against an installed libaotriton_rocm, on CPU.

The consumers (native/examples/consumer_c, consumer_cpp) find the library with
find_package(aotriton_rocm 0.1 CONFIG) or pkg-config, from the paths that
`aotriton-rocm config` prints in a fresh venv (the runtime wheel) and in a
fresh conda prefix (the .conda packages); they run the attention forward and
backward of one fixed problem on the stub driver with a real archive (the
kernels' real argument lists) and print what they launched. Their launches
must be byte-identical with what the Python binding (aotriton_rocm.core.native,
ctypes, the same installed library) launches for the same problem.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aotriton_rocm._version import ABI_VERSION, __version__, public_version
from aotriton_rocm.tooling.builder.archive_writer import write_archive, write_manifest_sidecar

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "native" / "examples"
SONAME = f"libaotriton_rocm.so.{ABI_VERSION}"
ROCM = "6.4"
PY_MINOR = "%d.%d" % sys.version_info[:2]

# The consumers' problem, through the Python binding: same addresses (the stub
# never dereferences them), so the packed argument bytes must match exactly.
PYTHON_CONSUMER = r"""
import ctypes, json, sys
from aotriton_rocm.core import native

driver, archive = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
B, HQ, HKV, SQ, SK, D = 2, 4, 2, 128, 192, 64

def tensor(address, dtype, sizes):
    t = native.Tensor()
    t.data, t.dtype, t.rank = address, native.DTYPES[dtype], len(sizes)
    stride = 1
    for i in reversed(range(len(sizes))):
        t.sizes[i], t.strides[i] = sizes[i], stride
        stride *= sizes[i]
    return t

def check(status):
    native.check(status)

rt = native.Runtime(driver_library=driver, backend=native.BACKEND_CUDA)
if archive:
    rt.add_archive(archive)
p = native.Problem()
p.q = tensor(0x100000000, "float16", (B, HQ, SQ, D))
p.k = tensor(0x200000000, "float16", (B, HKV, SK, D))
p.v = tensor(0x300000000, "float16", (B, HKV, SK, D))
p.scale, p.causal, p.causal_alignment = 0.125, 1, native.CAUSAL_BOTTOM_RIGHT
p.window_left = p.window_right = -1
check(native.library().aotr_attn_check(ctypes.byref(p)))
check(rt.supported(0, p))
fwd = native.FwdParams()
fwd.stream, fwd.problem = 0x5000, p
fwd.out = tensor(0x400000000, "float16", (B, HQ, SQ, D))
fwd.lse = tensor(0x500000000, "float32", (B, HQ, SQ))
check(rt.fwd(fwd))
bwd = native.BwdParams()
bwd.stream, bwd.problem, bwd.out, bwd.lse = 0x5000, p, fwd.out, fwd.lse
bwd.grad_out = tensor(0x600000000, "float16", (B, HQ, SQ, D))
bwd.grad_q = tensor(0x700000000, "float16", (B, HQ, SQ, D))
bwd.grad_k = tensor(0x800000000, "float16", (B, HKV, SK, D))
bwd.grad_v = tensor(0x900000000, "float16", (B, HKV, SK, D))
bwd.delta = tensor(0xa00000000, "float32", (B, HQ, SQ))
check(rt.bwd(bwd))

stub = ctypes.CDLL(driver)
launches = []
for i in range(stub.aotr_stub_launch_count()):
    sym = ctypes.create_string_buffer(256)
    grid = (ctypes.c_uint * 3)()
    block, shared, size = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_size_t()
    stream = ctypes.c_void_p()
    assert stub.aotr_stub_launch_info(i, sym, 256, grid, ctypes.byref(block), ctypes.byref(shared),
                                      ctypes.byref(stream), ctypes.byref(size)) >= 0
    buf = ctypes.create_string_buffer(size.value)
    stub.aotr_stub_launch_args(i, buf, size.value)
    launches.append({"symbol": sym.value.decode(), "grid": list(grid), "block": block.value,
                     "shared": shared.value, "stream": stream.value or 0, "args": buf.raw.hex()})
print(json.dumps({"version": native.library().aotr_version().decode(),
                  "runtime_launch_count": rt.launch_count(), "launches": launches,
                  "library": str(native.library_path())}))
"""


def _run(cmd, *, env=None, check=True, cwd=None) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n"
                    f"{r.stderr[-6000:]}", pytrace=False)
    return r


def _stub_env(env=None) -> dict:
    env = dict(os.environ if env is None else env)
    env["AOTR_STUB_CUDA_ARCH"] = "9.0"  # the stub reports an sm_90 device
    env.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)
    return env


def write_real_archive(d: Path) -> Path:
    """``d/sm_90.aotr`` (+ manifest sidecar): the fp16 head-dim-64 kernels with
    their real argument lists and stand-in code objects (test_runtime_stub)."""
    from test_runtime_stub import MANIFEST, _image, _record, _variants

    d.mkdir(parents=True, exist_ok=True)
    recs = [_record(v, f"k{i}") for i, v in enumerate(_variants())]
    path = d / "sm_90.aotr"
    write_archive(path, {**MANIFEST, "package_version": __version__}, [(r, _image(r.symbol)) for r in recs])
    write_manifest_sidecar(path)
    return path


def build_consumers(cmake_dir: Path, work: Path) -> dict:
    """consumer_c and consumer_cpp configured against ``cmake_dir`` alone."""
    out = {}
    for name in ("consumer_c", "consumer_cpp"):
        build = work / name
        _run(["cmake", "-S", EXAMPLES / name, "-B", build, f"-Daotriton_rocm_DIR={cmake_dir}",
              "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF", "-DCMAKE_BUILD_TYPE=Release"])
        _run(["cmake", "--build", build])
        out[name] = build / name
    return out


def build_with_pkg_config(pkgconfig_dir: Path, work: Path) -> Path:
    """consumer_c compiled and linked with plain cc and ``pkg-config --cflags --libs``."""
    env = dict(os.environ, PKG_CONFIG_PATH=str(pkgconfig_dir))
    env.pop("PKG_CONFIG_LIBDIR", None)
    flags = _run(["pkg-config", "--cflags", "--libs", "aotriton_rocm"], env=env).stdout.split()
    libdir = _run(["pkg-config", "--variable=libdir", "aotriton_rocm"], env=env).stdout.strip()
    assert _run(["pkg-config", "--modversion", "aotriton_rocm"], env=env).stdout.strip() == __version__
    work.mkdir(parents=True, exist_ok=True)
    exe = work / "consumer_c_pc"
    cc = os.environ.get("CC") or "cc"
    _run([cc, "-std=c11", "-Wall", "-Werror", EXAMPLES / "consumer_c" / "main.c", "-o", exe, *flags,
          "-ldl", f"-Wl,-rpath,{os.path.realpath(libdir)}"])
    return exe


def launches_of(exe, stub: Path, archive: Path | None, env=None) -> dict:
    r = _run([exe, stub, *([archive] if archive else [])], env=_stub_env(env))
    return json.loads(r.stdout)


def python_launches(python, stub: Path, archive: Path | None, env=None) -> dict:
    r = _run([python, "-c", PYTHON_CONSUMER, stub, *([archive] if archive else [])],
             env=_stub_env(env))
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_consumers(config, python, stub, archive, work, env=None):
    """Build the consumers from what ``config`` (the installed ``aotriton-rocm
    config``) prints and compare their launches with the Python binding's."""
    env = dict(os.environ if env is None else env)
    env.pop("AOTRITON_ROCM_NATIVE_LIB", None)  # the installed library, nothing else
    where = {k: Path(_run([*config, f"--{k}"], env=env).stdout.strip())
             for k in ("cmakedir", "includedir", "libdir", "pkgconfigdir", "library")}
    assert where["library"] == where["libdir"] / SONAME and where["library"].is_file()
    assert (where["includedir"] / "aotriton_rocm" / "aotriton_rocm.h").is_file()
    assert (where["cmakedir"] / "aotriton_rocmConfig.cmake").is_file()
    assert (where["pkgconfigdir"] / "aotriton_rocm.pc").is_file()
    exes = build_consumers(where["cmakedir"], work / "cmake")
    exes["consumer_c_pkgconfig"] = build_with_pkg_config(where["pkgconfigdir"], work / "pc")
    want = python_launches(python, stub, archive, env)
    assert Path(want.pop("library")).resolve() == where["library"].resolve()
    assert want["version"] == __version__ and want["runtime_launch_count"] == 4
    assert len(want["launches"]) == 4 and all(x["args"] for x in want["launches"])
    for name, exe in exes.items():
        [linked] = re.findall(rf"{re.escape(SONAME)} => (\S+)", _run(["ldd", exe]).stdout)
        assert Path(linked).resolve() == where["library"].resolve(), name
        assert launches_of(exe, stub, archive, env) == want, name
        # no archive given: the library finds the installed image beside itself
        assert launches_of(exe, stub, None, env) == want, name
    found = python_launches(python, stub, None, env)
    found.pop("library")
    assert found == want
    return where


# ------------------------------------------------------------------ fast checks

@pytest.fixture(scope="module")
def cmake_install(native_build, tmp_path_factory) -> Path:
    """native/'s CMake install, then moved: the package files are relocatable."""
    first = tmp_path_factory.mktemp("cmake-install") / "first"
    _run(["cmake", "--install", native_build, "--prefix", first])
    moved = first.parent / "moved"
    shutil.move(first, moved)
    return moved


def test_versions_agree():
    """_version.py (setup.py), project(VERSION) (CMake) and the header's macros."""
    cmake = (ROOT / "native" / "CMakeLists.txt").read_text()
    [project_version] = re.findall(r"project\(aotriton_rocm VERSION (\S+)", cmake)
    header = (ROOT / "native/include/aotriton_rocm/aotriton_rocm.h").read_text()
    macros = dict(re.findall(r"#define AOTR_VERSION_(MAJOR|MINOR|PATCH) (\d+)", header))
    assert project_version == public_version(__version__)
    assert f"{macros['MAJOR']}.{macros['MINOR']}.{macros['PATCH']}" == project_version
    assert re.search(rf'#define AOTR_ABI_LINE "{re.escape(ABI_VERSION)}"', header)


@pytest.mark.slow
def test_cmake_install_layout(cmake_install):
    for rel in (f"lib/{SONAME}", "include/aotriton_rocm/aotriton_rocm.h",
                "lib/cmake/aotriton_rocm/aotriton_rocmConfig.cmake",
                "lib/cmake/aotriton_rocm/aotriton_rocmConfigVersion.cmake",
                "lib/pkgconfig/aotriton_rocm.pc"):
        assert (cmake_install / rel).exists(), rel
    pc = (cmake_install / "lib/pkgconfig/aotriton_rocm.pc").read_text()
    assert "prefix=${pcfiledir}/../.." in pc and f"Version: {__version__}" in pc
    for f in (cmake_install / "lib/cmake/aotriton_rocm").iterdir():
        assert "@" not in f.read_text() and str(ROOT) not in f.read_text(), f


@pytest.mark.slow
def test_setup_py_renders_what_cmake_installs(cmake_install):
    """The editable install's package files (setup.py) == CMake's install."""
    pkg_lib = ROOT / "src" / "aotriton_rocm" / "lib"
    if not (pkg_lib / "cmake").is_dir():
        pytest.skip("no editable build in src/aotriton_rocm/lib (scripts/dev-env.sh makes one)")
    for rel in ("cmake/aotriton_rocm/aotriton_rocmConfig.cmake",
                "cmake/aotriton_rocm/aotriton_rocmConfigVersion.cmake", "pkgconfig/aotriton_rocm.pc"):
        assert (pkg_lib / rel).read_text() == (cmake_install / "lib" / rel).read_text(), rel


FIND_PROJECT = """cmake_minimum_required(VERSION 3.19)
project(find_aotriton_rocm LANGUAGES NONE)
find_package(aotriton_rocm ${REQUEST} CONFIG REQUIRED)
get_target_property(location aotriton_rocm::aotriton_rocm IMPORTED_LOCATION)
get_target_property(soname aotriton_rocm::aotriton_rocm IMPORTED_SONAME)
get_target_property(include aotriton_rocm::aotriton_rocm INTERFACE_INCLUDE_DIRECTORIES)
message(STATUS "FOUND ${aotriton_rocm_VERSION}|${location}|${soname}|${include}")
"""


def find_package_results(cmake_dir: Path, work: Path, requests) -> dict:
    src = work / "find-src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "CMakeLists.txt").write_text(FIND_PROJECT)
    out = {}
    for i, req in enumerate(requests):
        r = _run(["cmake", "-S", src, "-B", work / f"find-{i}", f"-DREQUEST={req}",
                  f"-Daotriton_rocm_DIR={cmake_dir}"], check=False)
        m = re.search(r"FOUND ([^\n]*)", r.stdout)
        out[req] = m.group(1).split("|") if r.returncode == 0 and m else None
    return out


REQUESTS = {"": True, "0.1": True, "0.1.0": True, "0.1.0;EXACT": True, "0.1...0.2": True,
            "0.1...<1.0": True, "0.1.1": False, "0.2": False, "1.0": False, "0": False,
            "0.0.9...0.3": False}


@pytest.mark.slow
def test_find_package_by_abi_line(cmake_install, tmp_path):
    got = find_package_results(cmake_install / "lib/cmake/aotriton_rocm", tmp_path, REQUESTS)
    assert {req: r is not None for req, r in got.items()} == REQUESTS
    version, location, soname, include = got["0.1"]
    assert version == __version__ and soname == SONAME
    assert location == str(cmake_install / "lib" / SONAME)
    assert include == str(cmake_install / "include")


@pytest.mark.slow
def test_cmake_install_consumers(native_build, cmake_install, tmp_path):
    """The consumers against the CMake install tree (no Python packaging involved)."""
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    archive = write_real_archive(tmp_path / "archives")
    exes = build_consumers(cmake_install / "lib/cmake/aotriton_rocm", tmp_path / "build")
    exes["pc"] = build_with_pkg_config(cmake_install / "lib/pkgconfig", tmp_path / "pc")
    env = dict(os.environ, AOTRITON_ROCM_NATIVE_LIB=str(cmake_install / "lib" / SONAME))
    want = python_launches(sys.executable, stub, archive, env)
    assert Path(want.pop("library")) == cmake_install / "lib" / SONAME
    assert len(want["launches"]) == 4
    for name, exe in exes.items():
        assert launches_of(exe, stub, archive) == want, name
    bad = _run([exes["consumer_c"], stub, tmp_path / "missing.aotr"], env=_stub_env(), check=False)
    assert bad.returncode == 1 and "aotr_runtime_add_archive" in bad.stderr


def test_config_command_imports_nothing_heavy():
    code = ("import sys, runpy; sys.argv = ['-m', 'config', '--cmakedir']\n"
            "import aotriton_rocm, aotriton_rocm.commands.cli as cli\n"
            "rc = cli.main(['config', '--cmakedir'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'triton', 'numpy', 'rattler', 'rattler_build', 'elftools') "
            "or m.startswith('aotriton_rocm.tooling') or m == 'aotriton_rocm.commands.smoke')\n"
            "print(rc, heavy)\n")
    r = _run([sys.executable, "-c", code])
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "0 []", r.stdout
    r = _run([sys.executable, "-m", "aotriton_rocm", "config", "--libdir", "--library"])
    libdir, library = r.stdout.strip().splitlines()
    assert Path(library) == Path(libdir) / SONAME


# ------------------------------------------------------------ installed packages

@pytest.fixture(scope="module")
def packages(native_build, tmp_path_factory):
    """The runtime wheel, the sm_90 image wheel of a real archive and the .conda
    packages, as `aotriton-rocm package` writes them."""
    from conftest import _sanitized

    if _sanitized(native_build):
        pytest.skip("packaging under the sanitizer run: the packages' library is not the "
                    "sanitized build (the CMake-install consumer test covers that one)")
    for mod in ("build", "auditwheel", "rattler", "rattler_build"):
        pytest.importorskip(mod)
    from aotriton_rocm.tooling.package import command as pkg
    from aotriton_rocm.tooling.package.conda import build_conda

    base = tmp_path_factory.mktemp("consumer-packages")
    archives = base / "archives"
    write_real_archive(archives)
    files = pkg.build_wheels(ROOT, archives, base / "dist", ["sm_90"], ROCM, False)
    conda = build_conda(ROOT, archives, base / "conda", ["sm_90"], ROCM,
                        python_versions=[PY_MINOR], runtime_wheel=files[0])
    return {"archive": archives / "sm_90.aotr", "runtime": files[0], "image": files[1],
            "channel": base / "conda", "conda": conda}


@pytest.mark.slow
def test_consumers_against_the_wheel(native_build, packages, tmp_path):
    from aotriton_rocm.tooling.release.envs import clean_env, install_wheels_in_fresh_venv

    python = install_wheels_in_fresh_venv([packages["runtime"], packages["image"]],
                                          tmp_path / "venv", extra_requirements=())
    env = clean_env()
    config = [python.parent / "aotriton-rocm", "config"]
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    where = check_consumers(config, python, stub, packages["archive"], tmp_path / "w", env)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                     env=env).stdout.strip())
    assert where["cmakedir"] == site / "aotriton_rocm" / "lib" / "cmake" / "aotriton_rocm"
    # python -m gives the same answer
    r = _run([python, "-m", "aotriton_rocm", "config", "--cmakedir"], env=env)
    assert Path(r.stdout.strip()) == where["cmakedir"]
    got = find_package_results(where["cmakedir"], tmp_path / "find", REQUESTS)
    assert {req: r is not None for req, r in got.items()} == REQUESTS


@pytest.fixture(scope="module")
def conda_prefix(packages, tmp_path_factory) -> Path:
    """A fresh prefix with the runtime and the sm_90 image installed by py-rattler."""
    from aotriton_rocm.tooling.package.conda import install_conda

    prefix = tmp_path_factory.mktemp("conda-consumers") / "prefix"
    install_conda(packages["channel"], ["aotriton-rocm-sm90",
                                        f"aotriton-rocm *py{PY_MINOR.replace('.', '')}*"], prefix)
    return prefix


@pytest.mark.slow
def test_consumers_against_a_conda_prefix(native_build, packages, conda_prefix, tmp_path):
    from aotriton_rocm.tooling.release.envs import python_for_conda_prefix

    prefix = conda_prefix
    # one copy of the library, in the prefix's lib/; none in site-packages
    assert (prefix / "lib" / SONAME).is_file()
    assert not list(prefix.glob("lib/python*/site-packages/aotriton_rocm/lib"))
    assert (prefix / "share" / "aotriton-rocm" / "sm_90.aotr").is_file()
    python, env = python_for_conda_prefix(prefix)
    config = [prefix / "bin" / "aotriton-rocm", "config"]
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    where = check_consumers(config, python, stub, packages["archive"], tmp_path / "w", env)
    prefix = prefix.resolve()
    assert {k: p.resolve() for k, p in where.items()} == {
        "cmakedir": prefix / "lib/cmake/aotriton_rocm", "includedir": prefix / "include",
        "libdir": prefix / "lib", "pkgconfigdir": prefix / "lib/pkgconfig",
        "library": prefix / "lib" / SONAME}


AOTRITON_API = ROOT / "tests" / "native_library" / "aotriton_api"


@pytest.mark.slow
def test_conda_prefix_is_an_aotriton_prefix(native_build, conda_prefix, tmp_path):
    """$PREFIX serves a PyTorch build with AOTRITON_INSTALLED_PREFIX=$PREFIX:
    lib/libaotriton_v2.so* and include/aotriton/ of API line 0.13; a consumer
    of AOTriton's API built as PyTorch's aotriton.cmake builds against it runs
    the installed image on the stub driver, with the library in $PREFIX/lib
    and copied into a torch in the prefix's site-packages."""
    pytest.importorskip("torch")
    prefix = conda_prefix.resolve()
    name = "libaotriton_v2.so.0.13.0"
    lib = prefix / "lib" / name
    assert lib.is_file() and not lib.is_symlink()
    assert os.readlink(prefix / "lib" / "libaotriton_v2.so") == name
    # the same library as the line's own (rattler-build gives each copy its own RPATH)
    from aotriton_rocm.tooling.release.abi_aotriton_api import read_api_lib
    line_lib = read_api_lib(prefix / "lib" / "aotriton_api" / "0.13" / name, None, "0.13")
    assert read_api_lib(lib, None, "0.13").exports == line_lib.exports and len(line_lib.exports) > 80
    headers = prefix / "include" / "aotriton"
    ours = prefix / "include" / "aotriton_api" / "0.13" / "aotriton"
    assert sorted(p.relative_to(headers) for p in headers.rglob("*.h")) == \
        sorted(p.relative_to(ours) for p in ours.rglob("*.h"))
    config = (headers / "config.h").read_text()
    assert "#define AOTRITON_VERSION_MAJOR 0u" in config and "#define AOTRITON_VERSION_MINOR 13u" in config

    build = tmp_path / "consumer"
    _run(["cmake", "-S", AOTRITON_API / "consumer", "-B", build,
          f"-DAOTRITON_INSTALLED_PREFIX={prefix}", "-DCMAKE_BUILD_TYPE=Release"])
    _run(["cmake", "--build", build])
    consumer = build / "libaotriton_api_consumer.so"
    stub = native_build / "tests" / "libaotr_stub_driver.so"
    scenario = [sys.executable, AOTRITON_API / "prefix_scenario.py", consumer, stub]
    env = _stub_env()
    assert _run([*scenario, lib, "found"], env=env).stdout.strip().endswith("ok")
    # a torch built in this environment: its torch/lib, six directories below $PREFIX
    torch_lib = prefix / "lib" / f"python{PY_MINOR}" / "site-packages" / "torch" / "lib"
    torch_lib.mkdir(parents=True)
    try:
        shutil.copy2(lib, torch_lib / name)
        assert _run([*scenario, torch_lib / name, "found"], env=env).stdout.strip().endswith("ok")
    finally:
        shutil.rmtree(torch_lib.parent)
    # the control: a copy outside any install finds no image
    (tmp_path / "elsewhere").mkdir()
    shutil.copy2(lib, tmp_path / "elsewhere" / name)
    assert _run([*scenario, tmp_path / "elsewhere" / name, "none"], env=env).stdout.strip().endswith("ok")
