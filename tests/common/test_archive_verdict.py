"""One verdict on an archive everywhere: the Python reader (archive.py) and
the runtime's C reader (libaotriton_rocm: native/src/json.c, archive.c)
accept and refuse the same index documents, and ``validate``, ``info``,
``smoke`` and the package intake give the C reader's verdict too, with no
traceback on any crafted index. Archives are real (tests/support/
real_archives.py); each crafted index is resealed (header sizes, blob offset,
index sha256) so that only its JSON decides."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest

from support import real_archives as RA
from aotriton_rocm.common import archive as A
from aotriton_rocm.common import archive_index as AX
from aotriton_rocm.tooling.builder import archive_writer as AW
from aotriton_rocm.commands import cli, smoke
from aotriton_rocm.core import device, native
from aotriton_rocm.common import images
from aotriton_rocm._version import __version__
from aotriton_rocm.tooling.package import archive_intake as AI
from aotriton_rocm.tooling.package.naming import PackagingError

HEADER = struct.Struct("<8sIIQQQ32s8x")
ARCH = "sm_90"  # `validate` checks its identity, then hands it to the C reader


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A real archive's bytes, its index document and its sidecar's bytes."""
    path = RA.write(tmp_path_factory.mktemp("base"), ARCH)
    data = path.read_bytes()
    _, _, hsize, isize, _, _, _ = HEADER.unpack(data[:A.HEADER_SIZE])
    return data, json.loads(data[hsize:hsize + isize]), A.manifest_path_for(path).read_bytes()


def reseal(data: bytes, index: bytes) -> bytes:
    """``data`` with its index replaced by ``index`` and a header that fits it."""
    magic, ver, hsize, isize, boff, bsize, _ = HEADER.unpack(data[:A.HEADER_SIZE])
    header = HEADER.pack(magic, ver, hsize, len(index), hsize + len(index), bsize,
                         hashlib.sha256(index).digest())
    return header + index + data[boff:boff + bsize]


def _text(doc) -> str:
    return json.dumps(doc, separators=(",", ":"))


def _edit(doc, fn):
    doc = json.loads(json.dumps(doc))
    fn(doc)
    return _text(doc)


def _in_manifest(doc, raw: str) -> str:
    """The index with ``raw`` JSON text put first in the manifest object."""
    text = _text(doc)
    head = '{"manifest":{'
    assert text.startswith(head)
    return head + raw + "," + text[len(head):]


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def _corpus(doc):
    """(name, index text, both readers accept it)."""
    k0 = lambda fn: lambda d: fn(d["kernels"][0])  # noqa: E731
    good = [
        ("as written", _text(doc)),
        ("pretty printed", json.dumps(doc, indent=2)),
        ("nesting 64 deep", _in_manifest(doc, f'"x":{_nested(62)}')),  # index, manifest, 62
        ("surrogate pair", _in_manifest(doc, r'"x":"\ud83d\ude00"')),
        ("duplicate key, the last wins", _in_manifest(doc, '"arch":"gfx90a"')),
        ("huge integer kept as a double", _in_manifest(doc, '"x":' + "9" * 30)),
        ("1e308", _in_manifest(doc, '"x":1e308')),
        ("1e-400 underflows to 0", _in_manifest(doc, '"x":1e-400')),
        ("num_warps 4.0", _edit(doc, k0(lambda r: r.update(num_warps=4.0)))),
        ("pad_head 0", _edit(doc, k0(lambda r: r["functional"].update(pad_head=0)))),
        ("format_version 1.0", _edit(doc, lambda d: d["manifest"].update(format_version=1.0))),
    ]
    bad = [
        ("1e999", _in_manifest(doc, '"x":1e999')),
        ("-1e999", _in_manifest(doc, '"x":-1e999')),
        ("integer overflowing to inf", _in_manifest(doc, '"x":' + "9" * 400)),
        ("NaN", _in_manifest(doc, '"x":NaN')),
        ("Infinity", _in_manifest(doc, '"x":Infinity')),
        ("-Infinity", _in_manifest(doc, '"x":-Infinity')),
        ("lone high surrogate", _in_manifest(doc, r'"x":"\ud800"')),
        ("lone low surrogate", _in_manifest(doc, r'"x":"\udc00"')),
        ("high surrogate before a non-surrogate", _in_manifest(doc, r'"x":"\ud800\u0041"')),
        ("lone surrogate in a key", _in_manifest(doc, r'"\udbff":1')),
        ("lone surrogate hidden by a duplicate key", _in_manifest(doc, r'"x":["\ud800"],"x":1')),
        ("\\u0000", _in_manifest(doc, r'"x":"a\u0000b"')),
        ("raw control character", _in_manifest(doc, '"x":"a\tb"')),
        ("nesting 65 deep", _in_manifest(doc, f'"x":{_nested(63)}')),
        ("nesting 5000 deep", _in_manifest(doc, f'"x":{_nested(5000)}')),
        ("leading zero", _in_manifest(doc, '"x":01')),
        ("byte order mark", "\ufeff" + _text(doc)),
        ("trailing garbage", _text(doc) + " x"),
        ("empty", ""),
        ("index is a list", _text([doc])),
        ("index is a number", "1"),
        ("no manifest", _edit(doc, lambda d: d.pop("manifest"))),
        ("kernels missing", _edit(doc, lambda d: d.pop("kernels"))),
        ("empty kernels list", _edit(doc, lambda d: d.update(kernels=[]))),
        ("kernel record is a list", _edit(doc, lambda d: d.update(kernels=[list(d["kernels"][0])]))),
        ("kernel record is a string", _edit(doc, lambda d: d["kernels"].append("x"))),
        ("key is a number", _edit(doc, k0(lambda r: r.update(key=7)))),
        ("functional is a list", _edit(doc, k0(lambda r: r.update(functional=[["dtype", "fp16"]])))),
        ("config is a list", _edit(doc, k0(lambda r: r.update(config=[])))),
        ("num_warps is a string", _edit(doc, k0(lambda r: r.update(num_warps="4")))),
        ("num_warps 4.5", _edit(doc, k0(lambda r: r.update(num_warps=4.5)))),
        ("num_warps true", _edit(doc, k0(lambda r: r.update(num_warps=True)))),
        ("num_warps huge", _edit(doc, k0(lambda r: r.update(num_warps=10 ** 30)))),
        ("size 2**64", _edit(doc, k0(lambda r: r.update(size=2 ** 64)))),
        ("offset -1", _edit(doc, k0(lambda r: r.update(offset=-1)))),
        ("args is an object", _edit(doc, k0(lambda r: r.update(args={})))),
        ("args pair of one", _edit(doc, k0(lambda r: r["args"].append(["x"])))),
        ("divisible_16 is a string", _edit(doc, k0(lambda r: r.update(divisible_16="Q")))),
        ("sha256 in capitals", _edit(doc, k0(lambda r: r.update(sha256=r["sha256"].upper())))),
        ("duplicate kernel key", _edit(doc, lambda d: d["kernels"][1].update(key=d["kernels"][0]["key"]))),
        ("arch is a number", _edit(doc, lambda d: d["manifest"].update(arch=90))),
        ("abi_version is a list", _edit(doc, lambda d: d["manifest"].update(abi_version=["0.1"]))),
        ("format_version is a string", _edit(doc, lambda d: d["manifest"].update(format_version="1"))),
        ("format_version true", _edit(doc, lambda d: d["manifest"].update(format_version=True))),
    ]
    return [(n, t, True) for n, t in good] + [(n, t, False) for n, t in bad]


def _python_accepts(path: Path) -> bool:
    try:
        return not A.Archive.open(path).verify()
    except A.ArchiveError:
        return False


def _c_accepts(path: Path) -> bool:
    try:
        native.verify_archive(path)
    except native.NativeError:
        return False
    return True


def _write_all(base, d: Path):
    """Each crafted archive in a directory of its own, with a sidecar that
    matches it wherever the readers accept it (so that only the index decides)."""
    data, doc, sidecar = base
    out = []
    for i, (name, text, ok) in enumerate(_corpus(doc)):
        path = d / str(i) / f"{ARCH}.aotr"
        path.parent.mkdir(parents=True)
        path.write_bytes(reseal(data, text.encode("utf-8")))
        if _python_accepts(path):
            AW.write_manifest_sidecar(path)
        else:  # the old sidecar, naming this file's bytes
            side = json.loads(sidecar)
            side["archive"].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                   size=path.stat().st_size)
            A.manifest_path_for(path).write_text(json.dumps(side))
        out.append((name, path, ok))
    return out


@pytest.fixture(scope="module")
def crafted(base, tmp_path_factory):
    return _write_all(base, tmp_path_factory.mktemp("crafted"))


def test_both_readers_agree_on_every_document(crafted):
    wrong = [(name, ok, _python_accepts(p), _c_accepts(p)) for name, p, ok in crafted
             if not (_python_accepts(p) == _c_accepts(p) == ok)]
    assert not wrong, "(document, expected, python, C): " + repr(wrong)


# Number, string, literal and nesting edge cases of RFC 8259, put in the manifest: json.c
# decides each one way or the other, and the Python reader decides it the same way.
EDGES = [b"-0", b"-0.0", b"0e5", b"1E+2", b"1e", b"-", b".5", b"+1", b"0x1", b"1.", b"00", b"-01",
         b"1e+", b"4.9e-324", b"2.4e-324", b"1.7976931348623157e308", b"1.7976931348623159e308",
         b"-9223372036854775808", b"9223372036854775808", b"1" + b"0" * 308, b"1" + b"0" * 309,
         b"9" * 5000, b"0." + b"1" * 1000, b"-NaN", b"Infinity1", b"tru", b"nul", b"[1,]",
         b'{"a":1,}', b"{1:2}", b"\x0c1", b"\xc2\xa01", b"\t\n\r 2", b'"\x7f"', b'"\\/"',
         b'"\\u00e9"', '"\u00e9"'.encode(), b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"',
         b'"\xed\xa0\x80"', b'"\xef\xbf\xbf"', b'"\\uD800\\uDC00"', b'"\\udbff\\udfff"',
         b'"\\ud800\\ud800\\udc00"', b'"\\u12"', b'"\\u004G"', b'"\\U0041"', b'"\\x"',
         b'"\x00"', b'"a\\\\"', b'["]"]', b'"\\"["', b'{"":1}',
         b'{"a":' * 62 + b"1" + b"}" * 62, b'{"a":' * 63 + b"1" + b"}" * 63]


def test_readers_agree_on_edge_cases(base, tmp_path):
    data, doc, _ = base
    text = _text(doc).encode()
    head = b'{"manifest":{'
    verdicts = {}
    for i, fragment in enumerate(EDGES):
        path = tmp_path / str(i) / f"{ARCH}.aotr"
        path.parent.mkdir()
        path.write_bytes(reseal(data, head + b'"x":' + fragment + b"," + text[len(head):]))
        verdicts[fragment[:40]] = (_python_accepts(path), _c_accepts(path))
    assert [f for f, (py, c) in verdicts.items() if py != c] == []
    assert 10 < sum(py for py, _ in verdicts.values()) < len(EDGES) - 10


def test_refusals_are_archive_errors_that_say_the_fix(crafted):
    for name, p, ok in crafted:
        if ok:
            continue
        with pytest.raises(A.ArchiveError) as e:
            A.Archive.open(p).verify()
            raise A.ArchiveError("opened")  # refused by verify() only: not in this corpus
        assert str(p) in str(e.value) and "pip install --force-reinstall" in str(e.value), name


def test_strict_json_rules():
    loads = AX.strict_json_loads
    assert loads(b'[12345678901234567890, -9223372036854775808]') == [1.2345678901234567e19,
                                                                       -2 ** 63]
    assert loads(_nested(64).encode()) == loads(_nested(64))
    assert AX._max_depth(b'["[[[", {"a\\"[": [[]]}]') == 4  # brackets in strings do not count
    for bad, why in ((b"[1e999]", "out of range"), (b"[NaN]", "NaN"),
                     (b'["\\ud800"]', "surrogate"), (b'{"\\u0000":1}', "u0000"),
                     (_nested(65).encode(), "deeper than 64"), (b'"\xed\xa0\x80"', "utf-8")):
        with pytest.raises(ValueError, match=why):
            loads(bad)


# -- the commands --------------------------------------------------------------------------

def _install(path: Path, images_dir: Path) -> None:
    for f in (path, A.manifest_path_for(path)):
        shutil.copyfile(f, images_dir / f.name)
    images.clear_cache()


def _smoke(capsys, monkeypatch, *argv):
    monkeypatch.setattr(smoke, "cpu_cases", lambda quick=False: [])  # archive checks only
    monkeypatch.setattr(device, "gpu_available", lambda: False)
    rc = cli.main(["smoke", "--device", "cpu", *argv])
    return rc, capsys.readouterr().out


def test_validate_info_smoke_and_intake_give_one_verdict(crafted, isolated_images, capsys,
                                                         monkeypatch):
    """Every crafted archive: `validate`, `info`, `smoke` and the package
    intake accept exactly those both readers accept; none raises."""
    monkeypatch.setattr(smoke, "cpu_cases", lambda quick=False: [])
    monkeypatch.setattr(device, "gpu_available", lambda: False)
    for name, path, ok in crafted:
        verdicts = {"validate": cli.main(["validate", str(path)]) == 0}
        _install(path, isolated_images)
        verdicts["info"] = cli.main(["info"]) == 0
        verdicts["smoke"] = cli.main(["smoke", "--device", "cpu"]) == 0
        verdicts["package"] = not AI.verify_archive(path, A.manifest_path_for(path), __version__)
        out = capsys.readouterr()
        assert "Traceback" not in out.out + out.err, name
        assert verdicts == dict.fromkeys(verdicts, ok), (name, verdicts, out.out[-3000:],
                                                         out.err[-3000:])


def test_info_refuses_an_empty_image(base, isolated_images, capsys):
    data, doc, _ = base
    path = isolated_images / f"{ARCH}.aotr"
    path.write_bytes(reseal(data, _edit(doc, lambda d: d.update(kernels=[])).encode()))
    assert cli.main(["info"]) == 1
    out = capsys.readouterr().out
    assert f"  {ARCH}: BAD {path}: kernel archive index is invalid: the index lists no kernels " \
           f"(an empty image)" in out


def _refusing_c_reader(monkeypatch):
    def refuse(p):
        raise native.NativeError(5, "AOTR_ARCHIVE_INVALID", f"{p}: refused by the C reader")
    monkeypatch.setattr(native, "verify_archive", refuse)


def test_validate_and_intake_ask_the_c_reader(tmp_path, capsys, monkeypatch):
    path = RA.write(tmp_path, ARCH)
    assert cli.main(["validate", str(path)]) == 0
    assert not AI.verify_archive(path, A.manifest_path_for(path), __version__)
    _refusing_c_reader(monkeypatch)
    AI._verified.clear()
    assert cli.main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {ARCH} C reader: libaotriton_rocm: AOTR_ARCHIVE_INVALID" in out
    problems = AI.verify_archive(path, A.manifest_path_for(path), __version__)
    assert "refused by the C reader" in problems[0]
    assert problems[-1].startswith("fix: rebuild it: aotriton-rocm build --arch sm_90")
    with pytest.raises(PackagingError, match="refused by the C reader"):
        AI.collect_archives(tmp_path, [ARCH], __version__)
    AI._verified.clear()


def test_library_that_does_not_load_is_one_failure(isolated_images, capsys, monkeypatch,
                                                   tmp_path):
    """The library's row fails once; the archive rows pass on the Python
    checks and say that the C reader did not read them."""
    RA.write(isolated_images, "gfx942")
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setenv(native.ENV_VAR, str(tmp_path / "missing" / "libaotriton_rocm.so.0.1"))
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 1 and "FAIL  library: cannot load" in out
    [row] = [line for line in out.splitlines() if "archive gfx942" in line]
    assert row.startswith("PASS  archive gfx942: ") and "not checked by the C reader" in row
    assert "0 passed, 1 failed" in out
    # a build-time check has no library row: there the unread archive fails
    path = RA.write(tmp_path / "build", ARCH)
    assert cli.main(["validate", str(path)]) == 1
    assert "C reader: not checked, libaotriton_rocm did not load" in capsys.readouterr().out


def test_payload_damage_row_ends_with_the_fix(isolated_images, capsys, monkeypatch):
    RA.flip_payload_byte(RA.write(isolated_images, "gfx942"))
    rc, out = _smoke(capsys, monkeypatch)
    [row] = [line for line in out.splitlines() if line.startswith("FAIL  archive gfx942")]
    assert rc == 1 and "sha256" in row
    assert row.endswith("fix: reinstall the image: pip install --force-reinstall --no-deps "
                        f"'aotriton-rocm-gfx942~={__version__.rsplit('.', 1)[0]}.0' (conda: conda "
                        f"install --force-reinstall 'aotriton-rocm-gfx942="
                        f"{__version__.rsplit('.', 1)[0]}')"), row


def test_subset_image_is_named_in_info_and_smoke(isolated_images, capsys, monkeypatch):
    RA.write(isolated_images, "gfx942", subset="attn_fwd:dtype=fp16")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    [line] = [l for l in out.splitlines() if l.startswith("  gfx942:")]
    assert line.startswith("  gfx942: 2 kernels")
    assert line.endswith("(subset image: built with --only attn_fwd:dtype=fp16, it holds only the "
                         "kernels that filter selects)")
    rc, out = _smoke(capsys, monkeypatch)
    assert rc == 0 and "PASS  archive gfx942: " in out
    assert "(subset image: built with --only attn_fwd:dtype=fp16" in out


@pytest.mark.parametrize("sidecar", [
    "[]", '{"manifest": [], "archive": {}, "kernels": []}', '{"manifest": {}, "archive": []}',
    '{"manifest": {"arch": NaN}, "archive": {}, "kernels": []}', '{"manifest": {}, "kernels": "x"}',
    '{"manifest": {"x": ' + _nested(80) + '}}', '{"manifest": {"arch": "\\ud800"}}',
])
def test_crafted_sidecar_is_refused_without_traceback(sidecar, isolated_images, capsys,
                                                      monkeypatch):
    path = RA.write(isolated_images, "gfx942")
    A.manifest_path_for(path).write_text(sidecar)
    rc, out = _smoke(capsys, monkeypatch)
    [row] = [line for line in out.splitlines() if "archive gfx942" in line]
    assert rc == 1 and row.startswith("FAIL  archive gfx942: ") and "pip install" in row
    assert cli.main(["info"]) == 1
    with pytest.raises(PackagingError):
        AI.collect_archives(isolated_images, ["gfx942"], __version__)
