"""The C archive reader (libaotriton_rocm) against archives written by the
Python writer: it must agree with aotriton_rocm.common.archive on what is valid,
refuse archives of another arch / ABI line, and fail cleanly (never crash
or hang) on damaged files."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from aotriton_rocm._version import ABI_VERSION
from aotriton_rocm.common.archive import HEADER_SIZE, Archive, ArchiveError, KernelRecord
from aotriton_rocm.tooling.builder.archive_writer import write_archive

ARGS = (("Q", "*fp16"), ("sm_scale", "fp32"), ("seqlen_q", "i32"), ("philox_offset", "i64"),
        ("global_scratch", "*i8"), ("profile_scratch", "*i8"))
HEADER = struct.Struct("<8sIIQQQ32s8x")


def _record(i: int, kernel: str = "attn_fwd") -> KernelRecord:
    f = {"dtype": ("fp16", "bf16", "fp32")[i % 3], "head_dim": 64, "pad_head": False,
         "has_bias": bool(i % 2), "enable_dropout": False}
    cfg = {"BLOCK_M": 64, "BLOCK_N": 16 * (i + 1), "num_warps": 4, "num_stages": 1}
    return KernelRecord(key=f"{kernel}|{i}", kernel=kernel, functional=f, config=cfg, constexprs={},
                        symbol=kernel, num_warps=4, num_stages=1, warp_size=64, shared=1024 * i,
                        global_scratch_size=0, profile_scratch_size=0, args=ARGS,
                        divisible_16=("Q",), grid=("1", "1", "1"))


def make_archive(path: Path, arch: str = "gfx942", n: int = 3, abi: str = ABI_VERSION) -> Path:
    man = {"package_version": "0.1.0", "abi_version": abi, "rocm_profile": "6.4", "arch": arch,
           "backend": "cuda" if arch.startswith("sm_") else "hip", "warp_size": 64,
           "compiler": "triton", "compiler_version": "3.9.0", "build_inputs_hash": "0" * 64}
    kernels = [(_record(i), bytes(range(256)) * (i + 1) + f"code {i}".encode()) for i in range(n)]
    write_archive(path, man, kernels, preset=0)
    return path


def reseal(path: Path, edit) -> None:
    """Rewrite the index through ``edit(index_dict)`` (or ``edit(bytes) -> bytes``)
    with a correct header (sizes, blob offset, sha256): the index still passes
    its hash check, so the reader's own validation is what is tested."""
    data = path.read_bytes()
    magic, ver, hsize, isize, boff, bsize, _ = HEADER.unpack(data[:HEADER_SIZE])
    index = data[hsize:hsize + isize]
    blobs = data[boff:boff + bsize]
    if isinstance(edit, bytes):
        new_index = edit
    else:
        doc = json.loads(index)
        edit(doc)
        new_index = json.dumps(doc, separators=(",", ":")).encode()
    header = HEADER.pack(magic, ver, hsize, len(new_index), hsize + len(new_index), bsize,
                         hashlib.sha256(new_index).digest())
    path.write_bytes(header + new_index + blobs)


def tool(build: Path, *args, timeout: float = 20) -> subprocess.CompletedProcess:
    exe = build / "tests" / "aotr_archive_tool"
    return subprocess.run([str(exe), *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def one_error(r: subprocess.CompletedProcess, status: str) -> str:
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ERROR {status}: "), r.stdout
    return lines[0]


# -- valid archives --------------------------------------------------------------------------

@pytest.mark.parametrize("arch,n", [("gfx942", 2), ("gfx90a", 1), ("gfx950", 5), ("sm_90", 3)])
def test_counts_and_identity_agree_with_python(native_build, tmp_path, arch, n):
    p = make_archive(tmp_path / f"{arch}.aotr", arch, n)
    a = Archive.open(p)
    assert a.verify() == []
    r = tool(native_build, "--verify", p)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["OK", a.arch, a.manifest["abi_version"], str(len(a))]


def test_many_archives_one_line_each(native_build, tmp_path):
    good = make_archive(tmp_path / "gfx942.aotr")
    r = tool(native_build, good, tmp_path / "missing.aotr", good)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0] == lines[2] == f"OK gfx942 {ABI_VERSION} 3"
    assert lines[1].startswith("ERROR AOTR_NOT_FOUND: ")


def dump(build: Path, path: Path):
    exe = build / "tests" / "aotr_archive_dump"
    r = subprocess.run([str(exe), str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    assert r.stderr == "", r.stderr[-3000:]
    return r


_DTYPES = {"fp16": 1, "bf16": 2, "fp32": 3}
_KINDS = {"i32": 2, "fp32": 3, "i64": 4}


def test_records_and_code_objects_agree_with_python(native_build, tmp_path):
    """Every parsed field and every code object (fetched by 8 threads at once)."""
    p = make_archive(tmp_path / "gfx942.aotr", n=6)
    a = Archive.open(p)
    r = dump(native_build, p)
    assert r.returncode == 0, r.stdout
    got = [json.loads(line) for line in r.stdout.splitlines()]
    assert [g["key"] for g in got] == [k.key for k in a.kernels]
    for g, k in zip(got, a.kernels):
        f = k.functional
        assert g["kernel"] == k.kernel and g["symbol"] == k.symbol
        assert g["dtype"] == _DTYPES[f["dtype"]] and g["head_dim"] == f["head_dim"]
        assert (g["pad_head"], g["has_bias"], g["enable_dropout"]) == (
            int(f["pad_head"]), int(f["has_bias"]), int(f["enable_dropout"]))
        assert (g["block_m"], g["block_n"]) == (k.config["BLOCK_M"], k.config["BLOCK_N"])
        assert (g["num_warps"], g["num_stages"], g["warp_size"], g["shared"]) == (
            k.num_warps, k.num_stages, k.warp_size, k.shared)
        assert (g["offset"], g["compressed_size"], g["size"]) == (k.offset, k.compressed_size, k.size)
        assert [tuple(x[:2]) for x in g["args"]] == list(k.args)
        assert [x[2] for x in g["args"]] == [1 if t.startswith("*") else _KINDS[t] for _, t in k.args]
        assert g["divisible_16"] == list(k.divisible_16)
        code = a.code_object(k)
        assert g["code_size"] == len(code) and g["code_sha256"] == hashlib.sha256(code).hexdigest()
        assert g["record_is_json"] == 1


def test_absent_optional_axes(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr", n=2)

    def edit(d):
        k = d["kernels"][0]
        for name in ("pad_head", "has_bias", "enable_dropout"):
            del k["functional"][name]
        k["config"] = {"num_warps": 4}
        d["kernels"][1]["functional"].update(pad_head=1, has_bias=0)
    reseal(p, edit)
    r = dump(native_build, p)
    assert r.returncode == 0, r.stdout
    g0, g1 = (json.loads(x) for x in r.stdout.splitlines())
    assert (g0["pad_head"], g0["has_bias"], g0["enable_dropout"]) == (-1, -1, -1)
    assert (g0["block_m"], g0["block_n"]) == (0, 0)
    assert (g1["pad_head"], g1["has_bias"]) == (1, 0)


def test_corrupt_code_object_on_first_use(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr")
    a = Archive.open(p)
    victim = a.kernels[2]
    data = bytearray(p.read_bytes())
    data[a._blob_offset + victim.offset + victim.compressed_size - 10] ^= 0x01  # in the xz footer/check
    p.write_bytes(bytes(data))
    r = dump(native_build, p)
    assert r.returncode == 1
    assert r.stdout.startswith(f"ERROR AOTR_ARCHIVE_INVALID: {p}: kernel '{victim.key}' is corrupted")


# -- identity ----------------------------------------------------------------------------------

def test_archive_renamed_to_another_arch(native_build, tmp_path):
    src = make_archive(tmp_path / "gfx90a.aotr", "gfx90a")
    p = tmp_path / "gfx942.aotr"
    shutil.copy(src, p)
    Archive.open(p)  # the Python reader leaves names to its caller
    line = one_error(tool(native_build, p), "AOTR_IDENTITY_MISMATCH")
    assert str(p) in line and "gfx90a" in line and "gfx942" in line
    assert "pip install --force-reinstall --no-deps aotriton-rocm-gfx942" in line


def test_archive_name_must_end_in_aotr(native_build, tmp_path):
    src = make_archive(tmp_path / "gfx942.aotr")
    p = tmp_path / "gfx942"
    shutil.copy(src, p)
    one_error(tool(native_build, p), "AOTR_IDENTITY_MISMATCH")


def test_other_abi_line(native_build, tmp_path):
    p = make_archive(tmp_path / "sm_90.aotr", "sm_90", abi="0.2")
    line = one_error(tool(native_build, p), "AOTR_IDENTITY_MISMATCH")
    assert "0.2" in line and ABI_VERSION in line
    assert f"pip install 'aotriton-rocm[sm90]~={ABI_VERSION}.0'" in line


def test_other_abi_line_in_the_abi_record(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr")
    reseal(p, lambda d: d["manifest"]["abi"].update(abi_line="9.9"))
    Archive.open(p)
    line = one_error(tool(native_build, p), "AOTR_IDENTITY_MISMATCH")
    assert "9.9" in line


def test_manifest_format_version_must_match_the_header(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr")
    reseal(p, lambda d: d["manifest"].update(format_version=2))
    one_error(tool(native_build, p), "AOTR_IDENTITY_MISMATCH")


def test_newer_format_says_upgrade(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr")
    data = bytearray(p.read_bytes())
    data[8:12] = struct.pack("<I", 2)
    p.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="newer"):
        Archive.open(p)
    line = one_error(tool(native_build, p), "AOTR_IDENTITY_MISMATCH")
    assert "newer" in line and "Upgrade aotriton-rocm" in line


# -- damaged archives --------------------------------------------------------------------------

def test_missing_file(native_build, tmp_path):
    line = one_error(tool(native_build, tmp_path / "gfx942.aotr"), "AOTR_NOT_FOUND")
    assert str(tmp_path / "gfx942.aotr") in line
    one_error(tool(native_build, tmp_path / "no" / "dir" / "gfx942.aotr"), "AOTR_NOT_FOUND")


def test_fifo_does_not_hang(native_build, tmp_path):
    fifo = tmp_path / "x.aotr"
    os.mkfifo(fifo)
    line = one_error(tool(native_build, fifo, timeout=10), "AOTR_ARCHIVE_INVALID")
    assert "not a regular file" in line


def test_directory(native_build, tmp_path):
    (tmp_path / "gfx942.aotr").mkdir()
    one_error(tool(native_build, tmp_path / "gfx942.aotr"), "AOTR_ARCHIVE_INVALID")


def _python_rejects(p: Path) -> bool:
    try:
        Archive.open(p)
    except ArchiveError:
        return True
    return False


def test_truncated(native_build, tmp_path):
    src = make_archive(tmp_path / "src" / "gfx942.aotr").read_bytes()
    _, _, _, isize, boff, _, _ = HEADER.unpack(src[:HEADER_SIZE])
    p = tmp_path / "gfx942.aotr"
    for size in (0, 7, 40, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + isize // 2, boff,
                 boff + 10, len(src) - 1):
        p.write_bytes(src[:size])
        assert _python_rejects(p), size
        line = one_error(tool(native_build, p), "AOTR_ARCHIVE_INVALID")
        assert line.startswith(f"ERROR AOTR_ARCHIVE_INVALID: {p}: ")
        assert "truncated" in line or "corrupted" in line, line


def test_bad_magic(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr")
    data = bytearray(p.read_bytes())
    data[0] ^= 0xFF
    p.write_bytes(bytes(data))
    assert _python_rejects(p)
    assert "bad magic" in one_error(tool(native_build, p), "AOTR_ARCHIVE_INVALID")


def test_flipped_index_byte(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr")
    data = bytearray(p.read_bytes())
    data[HEADER_SIZE + 20] ^= 0x01
    p.write_bytes(bytes(data))
    assert _python_rejects(p)
    assert "sha256 mismatch" in one_error(tool(native_build, p), "AOTR_ARCHIVE_INVALID")


def test_flipped_blob_byte_fails_verify_naming_the_kernel(native_build, tmp_path):
    p = make_archive(tmp_path / "gfx942.aotr")
    a = Archive.open(p)
    victim = a.kernels[1]
    data = bytearray(p.read_bytes())
    # a byte inside the compressed payload of kernel 1 (past its xz stream header)
    data[a._blob_offset + victim.offset + victim.compressed_size // 2] ^= 0x40
    p.write_bytes(bytes(data))
    problems = Archive.open(p).verify()
    assert any(victim.key in x for x in problems), problems
    assert tool(native_build, p).returncode == 0  # opening reads the index only
    line = one_error(tool(native_build, "--verify", p), "AOTR_ARCHIVE_INVALID")
    assert f"kernel '{victim.key}'" in line and "blob region sha256" in line
    for other in (a.kernels[0], a.kernels[2]):
        assert f"kernel '{other.key}'" not in line


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["manifest"].pop("rocm_profile"), "manifest lacks rocm_profile"),
    (lambda d: d.pop("kernels"), "no kernels list"),
    (lambda d: d.update(kernels=[]), "lists no kernels (an empty image)"),
    (lambda d: d["kernels"][1]["args"].append(["flag", "i1"]), "'i1'"),
    (lambda d: d["kernels"][0]["functional"].update(dtype="fp8"), "'fp8'"),
    (lambda d: d["kernels"][0].pop("symbol"), "no symbol"),
    (lambda d: d["kernels"][0].update(num_warps="4"), "num_warps"),
    (lambda d: d["kernels"][0].update(sha256="AB" * 32), "sha256"),
    (lambda d: d["kernels"][0]["args"].append(["x"]), "[name, type]"),
    (lambda d: d["kernels"][2].update(offset=10 ** 6), "outside the blob region"),
    (lambda d: d["kernels"][2].update(compressed_size=2 ** 64 - 1), "offset/compressed_size"),
    (lambda d: d["kernels"][2].update(compressed_size=2 ** 63 - 1), "outside the blob region"),
    (lambda d: d["kernels"][1].update(key=d["kernels"][0]["key"]), "appears twice"),
    (lambda d: d["kernels"][0]["functional"].update(pad_head="yes"), "pad_head"),
])
def test_bad_records(native_build, tmp_path, edit, needle):
    p = make_archive(tmp_path / "gfx942.aotr")
    reseal(p, edit)
    assert _python_rejects(p)  # one verdict: the Python reader refuses it too
    line = one_error(tool(native_build, p), "AOTR_ARCHIVE_INVALID")
    assert needle in line, line
    assert line.startswith(f"ERROR AOTR_ARCHIVE_INVALID: {p}: ")


@pytest.mark.parametrize("index", [b"", b"{", b"[]", b'{"manifest":{}, "kernels":[]} x',
                                   b'{"manifest":"\\ud800","kernels":[]}', b"\xff"])
def test_bad_index_json(native_build, tmp_path, index):
    p = make_archive(tmp_path / "gfx942.aotr")
    reseal(p, index)
    assert _python_rejects(p)
    one_error(tool(native_build, p), "AOTR_ARCHIVE_INVALID")


# -- finding archives --------------------------------------------------------------------------

def test_find_in_dir_and_env(native_build, tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    make_archive(a / "gfx942.aotr")
    make_archive(b / "sm_90.aotr", "sm_90")
    (b / "gfx942.aotr").mkdir()  # not a regular file: skipped
    monkeypatch.setenv("AOTRITON_ROCM_ARCHIVE_DIR", f"::{tmp_path / 'none'}:{b}:{a}/")
    r = tool(native_build, "--find", "gfx942", "", "--find", "sm_90", "", "--find", "gfx942", b)
    assert r.returncode == 0, r.stdout
    found = [x.split(" ", 1)[1] for x in r.stdout.splitlines() if x.startswith("FOUND ")]
    assert found == [f"{a}/gfx942.aotr", f"{b}/sm_90.aotr", f"{a}/gfx942.aotr"]
    monkeypatch.setenv("AOTRITON_ROCM_ARCHIVE_DIR", str(b))
    r = tool(native_build, "--find", "sm_90", a)  # dir comes first, but has no sm_90
    assert r.stdout.splitlines()[0] == f"FOUND {b}/sm_90.aotr"


def test_find_not_found_lists_places(native_build, tmp_path, monkeypatch):
    monkeypatch.setenv("AOTRITON_ROCM_ARCHIVE_DIR", f"{tmp_path / 'e1'}:{tmp_path / 'e2'}")
    line = one_error(tool(native_build, "--find", "sm_90", tmp_path / "d"), "AOTR_NOT_FOUND")
    for d in ("d", "e1", "e2"):
        assert f"{tmp_path / d}/sm_90.aotr" in line
    assert "pip install 'aotriton-rocm[sm90]'" in line and "AOTRITON_ROCM_ARCHIVE_DIR" in line


@pytest.mark.parametrize("arch", ["", "../gfx942", "gfx/942", "..", "gfx942.aotr", "gfx 942"])
def test_find_refuses_bad_arch_names(native_build, tmp_path, arch):
    make_archive(tmp_path / "gfx942.aotr")
    one_error(tool(native_build, "--find", arch, tmp_path), "AOTR_INVALID_ARGUMENT")


_FIND_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    lib = ctypes.CDLL(sys.argv[1])
    lib.aotr_find_archive.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.aotr_last_error.restype = ctypes.c_char_p
    lib.aotr_status_name.restype = ctypes.c_char_p
    cap = int(sys.argv[3])
    buf = ctypes.create_string_buffer(max(cap, 1))
    st = lib.aotr_find_archive(sys.argv[2].encode(), None, buf, cap)
    if st == 0:
        print("FOUND " + buf.value.decode())
    else:
        print(lib.aotr_status_name(st).decode() + ": " + lib.aotr_last_error().decode())
""")


def _find_via_copied_library(native_build, env, libdir: Path, arch: str, cap: int = 4096) -> str:
    real = sorted((native_build).glob("libaotriton_rocm.so.*.*.*"))[0]
    libdir.mkdir(parents=True, exist_ok=True)
    lib = libdir / "libaotriton_rocm.so.0.1"
    shutil.copy(real, lib)
    env = dict(env)
    env.pop("AOTRITON_ROCM_ARCHIVE_DIR", None)
    r = subprocess.run([sys.executable, "-c", _FIND_SCRIPT, str(lib), arch, str(cap)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_find_beside_the_library_wheel_layout(native_build, native_env, tmp_path):
    site = tmp_path / "site-packages"
    make_archive(site / "aotriton_rocm_sm90" / "sm_90.aotr", "sm_90")
    make_archive(site / "aotriton_rocm_gfx942" / "gfx942.aotr")
    libdir = site / "aotriton_rocm" / "lib"
    out = _find_via_copied_library(native_build, native_env, libdir, "sm_90")
    assert out == f"FOUND {site.resolve()}/aotriton_rocm_sm90/sm_90.aotr"
    out = _find_via_copied_library(native_build, native_env, libdir, "gfx942")
    assert out == f"FOUND {site.resolve()}/aotriton_rocm_gfx942/gfx942.aotr"
    out = _find_via_copied_library(native_build, native_env, libdir, "gfx950")
    assert out.startswith("AOTR_NOT_FOUND: ")
    assert f"{site.resolve()}/aotriton_rocm_gfx950/gfx950.aotr" in out
    assert "pip install 'aotriton-rocm[gfx950]'" in out
    # a path buffer too small for the result
    out = _find_via_copied_library(native_build, native_env, libdir, "gfx942", cap=8)
    assert out.startswith("AOTR_INVALID_ARGUMENT: ") and "gfx942.aotr" in out


def test_find_beside_the_library_conda_layout(native_build, native_env, tmp_path):
    prefix = tmp_path / "prefix"
    make_archive(prefix / "share" / "aotriton-rocm" / "gfx942.aotr")
    out = _find_via_copied_library(native_build, native_env, prefix / "lib", "gfx942")
    assert out == f"FOUND {prefix.resolve()}/share/aotriton-rocm/gfx942.aotr"
    out = _find_via_copied_library(native_build, native_env, prefix / "lib", "sm_90")
    assert out.startswith("AOTR_NOT_FOUND: ")
    assert f"{prefix.resolve()}/share/aotriton-rocm/sm_90.aotr" in out


# -- fuzz --------------------------------------------------------------------------------------

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def fuzz_seed(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("fuzz-seed")
    return make_archive(d / "gfx942.aotr", n=3).read_bytes()


_edits = st.lists(st.tuples(st.sampled_from(["flip", "set", "delete", "insert"]),
                            st.integers(min_value=0, max_value=1 << 20),
                            st.integers(min_value=0, max_value=255)), min_size=1, max_size=4)


def _apply(data: bytearray, edits) -> bytearray:
    for op, pos, byte in edits:
        if not data:
            break
        i = pos % len(data)
        if op == "flip":
            data[i] ^= 1 << (byte % 8)
        elif op == "set":
            data[i] = byte
        elif op == "delete":
            del data[i]
        else:
            data.insert(i, byte)
    return data


@settings(max_examples=200, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(["file", "index", "index", "truncate"]), edits=_edits,
       cut=st.integers(min_value=0, max_value=1 << 20))
def test_fuzz_damaged_archives_fail_cleanly(native_build, fuzz_seed, where, edits, cut):
    """Random damage never crashes or hangs the reader. "index" damages the
    index JSON and reseals it (fresh sha256), so the parser and the record
    checks see the damage instead of the hash check."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "gfx942.aotr"
        p.write_bytes(fuzz_seed)
        if where == "file":
            p.write_bytes(bytes(_apply(bytearray(fuzz_seed), edits)))
        elif where == "truncate":
            p.write_bytes(fuzz_seed[:cut % len(fuzz_seed)])
        else:
            _, _, hsize, isize, _, _, _ = HEADER.unpack(fuzz_seed[:HEADER_SIZE])
            reseal(p, bytes(_apply(bytearray(fuzz_seed[hsize:hsize + isize]), edits)))
        r = tool(native_build, "--verify", p, timeout=10)
        assert r.returncode in (0, 1), (r.returncode, r.stdout, r.stderr[-3000:])
        lines = r.stdout.splitlines()
        assert len(lines) == 1, r.stdout
        if r.returncode == 0:
            assert lines[0].startswith("OK gfx942 ")
        else:
            assert lines[0].startswith("ERROR AOTR_"), lines[0]
        assert r.stderr == "", r.stderr[-3000:]
