"""Static code-object validation (aotriton_rocm.tooling.builder.codeobject, `aotriton-rocm
validate`): the metadata note's MessagePack framing, ELF + AMDGPU metadata parsing checked
against what triton itself reports for real HSACOs compiled here (a tiny
kernel and one FlashAttention forward variant for gfx908, gfx942 and
gfx1100), and rejection of corrupted / wrong-arch / incomplete code objects.
AMD code objects cannot be executed here: these checks are all we have."""

from __future__ import annotations

import re
import struct

import pytest

from aotriton_rocm.common.archive import KernelRecord
from aotriton_rocm.tooling.builder.archive_writer import write_archive
from aotriton_rocm.commands.cli import main as cli_main

pytest.importorskip("elftools")
pytest.importorskip("msgpack")

from aotriton_rocm.tooling.builder import codeobject as C  # noqa: E402
from aotriton_rocm.tooling.builder.codeobject import (ArchLimits, CodeObjectError, MsgpackError, decode_metadata,  # noqa: E402
                                                validate_kernel)


# -- msgpack (the metadata note's framing around the msgpack library) ----------

def test_metadata_note_framing():
    import msgpack

    md = {"amdhsa.version": [1, 2], "amdhsa.kernels": [{".name": "k", ".vgpr_count": 300}]}
    blob = msgpack.packb(md)
    assert decode_metadata(blob) == md
    assert decode_metadata(blob + b"\0" * 3) == md  # note descriptors are zero-padded to 4 bytes


@pytest.mark.parametrize("data, what", [
    (b"\xa5ab", "truncated"), (b"\x92\x01", "truncated"), (b"\xc1", "malformed data \\(FormatError\\)"),
    (b"\x01\x02", "1 trailing bytes"), (b"\x81\x91\x01\x02", "malformed data \\(TypeError"),
    (b"\xa2\xff\xfe", "malformed data \\(UnicodeDecodeError"),
])
def test_metadata_rejects_malformed_msgpack(data, what):
    with pytest.raises(MsgpackError, match=what):
        decode_metadata(data)


# -- real code objects ---------------------------------------------------------

triton = pytest.importorskip("triton")

from aotriton_rocm.tooling.common.targets import load_targets  # noqa: E402
from aotriton_rocm.core.kernel_spec import SCRATCH_ARGS, load_variants  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TARGETS = load_targets(ROOT / "ci" / "targets.toml")
ARCHS = ("gfx908", "gfx942", "gfx1100")

TINY_ARGS = (("X", "*fp16"), ("Y", "*fp16"), ("n", "i32"), ("alpha", "fp32"))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{(arch, 'tiny'|'flash'): (compiled kernel, record dict)}."""
    import os

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from aotriton_rocm.tooling.builder.triton_compile import load_kernel_function

    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set: kernels are not JIT functions")
    src_dir = tmp_path_factory.mktemp("tiny")
    (src_dir / "tiny.py").write_text(
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def tiny(X, Y, n, alpha, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    m = offs < n\n"
        "    tl.store(Y + offs, (tl.load(X + offs, mask=m) * alpha).to(tl.float16), mask=m)\n")
    tiny = load_kernel_function(str(src_dir), "tiny", "tiny")
    spec = load_variants(ROOT / "kernels")
    params = spec.check_sources()
    fwd = next(v for v in spec.variants_for(TARGETS.archs["gfx942"])
               if v.kernel == "attn_fwd" and v.functional.get("dtype") == "fp16"
               and v.functional.get("head_dim") == 64)
    flash = load_kernel_function(str(ROOT / "kernels"), fwd.module, fwd.function)
    out = {}
    try:
        for arch in ARCHS:
            target = GPUTarget(*TARGETS.archs[arch].gpu_target_args())
            k = triton.compile(ASTSource(fn=tiny, signature={**dict(TINY_ARGS), "BLOCK": "constexpr"},
                                         constexprs={"BLOCK": 256}), target=target)
            out[(arch, "tiny")] = (k, _rec(k, TINY_ARGS))
            ps = params[fwd.kernel]
            types = dict(fwd.args)
            sig = {p: "constexpr" if p in fwd.constexprs else types[p] for p in ps}
            src = ASTSource(fn=flash, signature=sig, constexprs=dict(fwd.constexprs),
                            attrs={(ps.index(n),): [["tt.divisibility", 16]] for n in fwd.divisible_16})
            k = triton.compile(src, target=target, options=dict(fwd.options))
            out[(arch, "flash")] = (k, _rec(k, tuple(fwd.args)))
    finally:
        mp.undo()
    return out


def _rec(k, args):
    md = k.metadata
    return {"symbol": md.name, "args": tuple(args) + SCRATCH_ARGS, "num_warps": md.num_warps,
            "shared": md.shared, "warp_size": md.warp_size}


def _limits(arch):
    return ArchLimits.from_spec(TARGETS.archs[arch])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("which", ["tiny", "flash"])
def test_parse_matches_triton(compiled, arch, which):
    k, rec = compiled[(arch, which)]
    code = k.asm["hsaco"]
    info = C.inspect_code_object(code)
    assert info.arch == arch and info.mach == TARGETS.archs[arch].mach
    assert info.code_object_version == 5 and info.abi_version == 3
    assert info.target.endswith("-" + arch)
    assert rec["symbol"] in info.symbols and rec["symbol"] + ".kd" in info.symbols
    km = info.kernel(rec["symbol"])
    assert km.symbol == rec["symbol"] + ".kd"
    assert km.wavefront_size == k.metadata.warp_size == TARGETS.archs[arch].warp_size
    # triton's AMD kernels take all their LDS dynamically at launch
    assert km.group_segment_fixed_size == 0
    # the same numbers the assembler printed in the metadata YAML of the amdgcn text
    asm = k.asm["amdgcn"]
    for key in ("vgpr_count", "sgpr_count", "agpr_count", "vgpr_spill_count",
                "private_segment_fixed_size", "kernarg_segment_size"):
        m = re.search(r"^\s*(?:-\s+)?\." + key + r":\s*(\d+)", asm, re.M)
        if m is None:  # e.g. no .agpr_count on RDNA: absent from both
            assert "." + key not in km.raw and getattr(km, key) == 0, key
        else:
            assert int(m.group(1)) == getattr(km, key), key
    # the explicit arguments in their natural layout, then only the implicit
    # (hidden_*) ones the HIP runtime fills at launch: the flash kernels read
    # the grid size (tl.num_programs) from hidden_block_count_y
    layout, end = C.expected_kernarg_layout(rec["args"])
    assert [(a[".offset"], a[".size"]) for a in km.explicit_args] == [(o, s) for _, o, s in layout]
    hidden = km.args[len(km.explicit_args):]
    assert all(a[".value_kind"].startswith("hidden_") and a[".offset"] >= end for a in hidden)
    assert km.kernarg_segment_size == end if not hidden else km.kernarg_segment_size > end
    assert bool(hidden) == (which == "flash")
    v = validate_kernel(code, rec, _limits(arch), code_object_version=5)
    assert v.stats["lds_bytes"] == k.metadata.shared
    # the occupancy estimate reproduces LLVM's own figure (VGPR-bound here)
    llvm = int(re.search(r";\s*Occupancy:\s*(\d+)", asm).group(1))
    assert v.stats["occupancy_vgpr"] == llvm
    assert 1 <= v.stats["occupancy"] <= TARGETS.archs[arch].max_waves
    if arch == "gfx1100" and which == "flash":
        # the CDNA config spills on RDNA wave32 (DESIGN.md, decision 3): rejected
        assert km.private_segment_fixed_size > 0
        assert any("scratch memory" in p for p in v.problems), v.problems
        waived = validate_kernel(code, rec, _limits(arch), allow={"spills": "measured: fine"})
        assert not validate_kernel(code, rec, _limits(arch), allow={"scratch": "x"}).ok  # spills need "spills"
        assert waived.ok and "allowed: measured: fine" in waived.allowed[0]
    else:
        assert v.ok, v.problems
    if which == "flash" and arch != "gfx1100":
        assert re.search(r"^\s*v_mfma", asm, re.M)


def test_wrong_arch_version_symbol_args_lds(compiled):
    k, rec = compiled[("gfx942", "tiny")]
    code = k.asm["hsaco"]
    lim = _limits("gfx942")

    def problems(**kw):
        r = dict(rec, **kw.pop("rec", {}))
        return "\n".join(validate_kernel(kw.pop("code", code), r, kw.pop("limits", lim), **kw).problems)

    assert problems(code_object_version=5) == ""
    assert "is for gfx942 (e_flags mach 0x04c), not gfx90a (0x03f)" in problems(limits=_limits("gfx90a"))
    assert "not gfx90a" in problems(limits=ArchLimits(name="gfx90a"))  # mach from the built-in table
    assert "code object version 5 (EI_ABIVERSION 3), expected 6" in problems(code_object_version=6)
    msg = problems(rec={"symbol": "nope"})
    assert "kernel symbol 'nope' missing" in msg and "'nope.kd' missing" in msg and "has: tiny" in msg
    assert "5 explicit kernel arguments" not in problems()
    assert "6 explicit kernel arguments in the code object, the record lists 5" in \
        problems(rec={"args": rec["args"][:-1]})
    assert "argument n: offset/size 16/4 in the code object, expected 16/8" in \
        problems(rec={"args": rec["args"][:2] + (("n", "i64"),) + rec["args"][3:]})
    assert "uses 70000 bytes of LDS (0 static + 70000 dynamic), gfx942 has 65536" in \
        problems(rec={"shared": 70000})
    assert "wavefront size 64, the record says 32" in problems(rec={"warp_size": 32})
    # the .kd symbol renamed in the string table
    bad = code.replace(b"tiny.kd\x00", b"tiny.kx\x00")
    assert bad != code
    assert "kernel descriptor symbol 'tiny.kd' missing" in problems(code=bad)


def test_corrupted_elf_rejected(compiled):
    code = compiled[("gfx908", "tiny")][0].asm["hsaco"]
    rec = compiled[("gfx908", "tiny")][1]
    lim = _limits("gfx908")

    def first(data):
        with pytest.raises(CodeObjectError) as ei:
            C.inspect_code_object(data)
        v = validate_kernel(data, rec, lim)
        assert not v.ok and v.problems[0].startswith("invalid code object: ")
        return str(ei.value)

    assert "not an ELF" in first(b"junk" + code[4:])
    assert "not an ELF" in first(code[:20])
    assert "truncated or corrupted" in first(code[: len(code) // 2])
    machine = bytearray(code)
    struct.pack_into("<H", machine, 18, 62)  # EM_X86_64
    assert "ELF machine is 62, not EM_AMDGPU (224)" in first(bytes(machine))
    cls32 = bytearray(code)
    cls32[4] = 1
    assert "not an ELF64" in first(bytes(cls32))
    # the metadata note's msgpack damaged: first map header becomes an invalid byte
    i = code.find(b"\x83\xaeamdhsa.kernels")
    assert i > 0
    broken = code[:i] + b"\xc1" + code[i + 1:]
    assert "msgpack: malformed data (FormatError)" in first(broken)
    # note type changed: no metadata
    nometa = code.replace(b"AMDGPU\x00\x00", b"XMDGPU\x00\x00")
    assert "no NT_AMDGPU_METADATA" in first(nometa)


def test_validate_command(compiled, tmp_path, capsys):
    from aotriton_rocm.tooling.builder.write import arch_limits_dict

    def archive(name, arch, pairs, limits=True):
        man = {"package_version": "0.1.0", "abi_version": "0.1", "rocm_profile": "6.4", "arch": arch,
               "backend": "hip", "warp_size": TARGETS.archs[arch].warp_size, "compiler": "triton",
               "compiler_version": "3.9.0", "build_inputs_hash": "0" * 64}
        if limits:
            man.update(code_object_version=5, arch_limits=arch_limits_dict(TARGETS.archs[arch]))
        path = tmp_path / name
        write_archive(path, man, pairs)
        return str(path)

    def krec(arch, which, key):
        k, r = compiled[(arch, which)]
        func = {"dtype": "fp16", "head_dim": 64, **({"pad_head": True} if which == "flash" else {})}
        rec = KernelRecord(key=key, kernel=which, functional=func, config={}, constexprs={},
                           symbol=r["symbol"], num_warps=r["num_warps"], num_stages=1,
                           warp_size=r["warp_size"], shared=r["shared"], global_scratch_size=0,
                           profile_scratch_size=0, args=r["args"], divisible_16=(), grid=("1", "1", "1"),
                           stats={"mfma": which == "flash"})
        return rec, k.asm["hsaco"]

    good = archive("gfx942.aotr", "gfx942", [krec("gfx942", "tiny", "a"), krec("gfx942", "flash", "b")])
    g908 = archive("gfx908.aotr", "gfx908", [krec("gfx908", "flash", "f")], limits=False)
    js = tmp_path / "v.json"
    assert cli_main(["validate", good, g908, "--json", str(js),
                     "--targets", str(ROOT / "ci" / "targets.toml")]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^gfx942\s+6\.4\s+2\s", text, re.M) and "1/2" in text
    assert re.search(r"^gfx908\s+6\.4\s+1\s.*1/1\s+ok$", text, re.M)
    assert "3 AMD kernels validated in 2 archive(s): 0 failure(s)" in text
    import json
    data = json.loads(js.read_text())
    assert data[0]["arch"] == "gfx942" and data[0]["min_occupancy"] >= 1 and data[0]["failures"] == []
    # the per-kernel report (MI100: MFMA and no spills per kernel, dtype, head dim)
    assert cli_main(["validate", g908, "--by-kernel"]) == 0
    ktext = capsys.readouterr().out
    assert re.search(r"^kernel\s+dtype\s+head_dim\s+variants\s+MFMA/WMMA\s+worst VGPR\s+worst AGPR\s+spills"
                     r"\s+scratch\s+min occ\s+verdict$", ktext, re.M), ktext
    assert re.search(r"^flash\s+fp16\s+64\s+1\s+1/1\s+\d+\s+\d+\s+0\s+0\s+\d+\s+ok$", ktext, re.M), ktext
    # a gfx942 code object shipped in the gfx90a archive, and a spilling RDNA kernel: exit 1
    bad = archive("gfx90a.aotr", "gfx90a", [krec("gfx942", "tiny", "wrong")])
    rdna = archive("gfx1100.aotr", "gfx1100", [krec("gfx1100", "flash", "spills")])
    assert cli_main(["validate", bad, rdna]) == 1
    text = capsys.readouterr().out
    assert "FAIL gfx90a wrong: code object is for gfx942" in text
    assert "FAIL gfx1100 spills: uses" in text and "scratch memory" in text
    assert re.search(r"^gfx1100 .*FAIL \(1\)$", text, re.M)
    assert cli_main(["validate", str(tmp_path / "missing.aotr")]) == 2


def test_build_table_and_chart(compiled, tmp_path, capsys, monkeypatch):
    from aotriton_rocm.tooling.builder import validate_archives as V
    from aotriton_rocm.tooling.builder.report import arch_chart_png, format_arch_table

    report = {"profile": "6.4", "compiler_version": "3.9.0", "package_version": "0.1.0", "per_arch": {
        "gfx942": {"kernels": 2, "candidates": 3, "compiled": 3, "cached": 0, "archive_bytes": 12345,
                   "seconds": 3.25, "compile_seconds_all": 4.5, "archive": "archives/gfx942.aotr",
                   "choices": {"measured": 0, "static": 2}, "exceptions": [{"key": "k", "kind": "spills"}],
                   "validation": {"kernels": 2, "max_vgpr": 220, "max_agpr": 0, "max_sgpr": 49,
                                  "vgpr_spills": 0, "max_scratch": 0, "min_occupancy": 2,
                                  "mfma_kernels": 1, "allowed": []}},
        "sm_90": {"kernels": 2, "candidates": 2, "compiled": 2, "cached": 0, "archive_bytes": 999, "seconds": 1.0,
                  "compile_seconds_all": 1.0, "archive": "archives/sm_90.aotr",
                  "choices": {"measured": 2, "static": 0}, "exceptions": [], "validation": None}}}
    table = format_arch_table(report)
    assert re.search(r"^gfx942\s+2\s+3\s+3\s+0\s+12\s+4\s+220/0/49\s+2\s+0\s+0\s+1/2\s+1\s+0/2\s+"
                     r"archives/gfx942.aotr$", table, re.M), table
    assert re.search(r"^sm_90\s+2\s+2\s+2\s+0\s+1\s+1\s+-\s+-", table, re.M), table
    assert "upstream AOTriton: ~19,000 code objects per arch (gfx942); this build: 2 at most (9500x fewer)" in table
    png = arch_chart_png(report)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == arch_chart_png(report)  # deterministic
    assert b"Software" not in png  # no matplotlib version stamp in the bytes

    rep = V.ArchReport(arch="gfx942", archive="x", backend="hip", profile="6.4", kernels=2,
                       archive_bytes=2048, max_vgpr=220, min_occupancy=2)
    V.draw_chart([rep], str(tmp_path / "c.png"), report)
    data = (tmp_path / "c.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 500 and height > 700  # three rows of two plots


def test_chart_plots_are_labelled():
    """What a reviewer reads: titles, units on the y axis, arch names on the x
    axis, the value on each bar ("n/a" where there is none), the legend."""
    pytest.importorskip("matplotlib")
    from aotriton_rocm.tooling.common.chart import BLUE, ORANGE, Panel, bar_chart_figure

    fig = bar_chart_figure("report", ["gfx942", "sm_90"],
                           [Panel("Archive size", [2048.0, 512.0], ylabel="KiB"),
                            Panel("Worst VGPR", [220, None], [ORANGE, BLUE], ylabel="VGPRs", counts=True)],
                           notes=["ROCm 6.4"], legend=[(BLUE, "clean"), (ORANGE, "waived")])
    size, vgpr = fig.axes[:2]
    assert size.get_title(loc="left") == "Archive size" and size.get_ylabel() == "KiB"
    assert [t.get_text() for t in size.get_xticklabels()] == ["gfx942", "sm_90"]
    assert [t.get_text() for t in size.texts] == ["2,048", "512"]
    assert [b.get_height() for b in size.patches] == [2048.0, 512.0]
    assert [t.get_text() for t in vgpr.texts] == ["220", "n/a"]
    assert [b.get_height() for b in vgpr.patches] == [220.0, 0.0]
    assert all(v == int(v) for v in vgpr.get_yticks())
    assert fig.get_suptitle() == "report\nROCm 6.4"
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["clean", "waived"]


def test_chart_png_pixels():
    """The PNG itself: decode it (Pillow, matplotlib's own dependency) and
    measure the bars in the pixels: heights 1 : 3."""
    pytest.importorskip("matplotlib")
    import io
    from collections import Counter

    from PIL import Image

    from aotriton_rocm.tooling.common.chart import BLUE, Panel, bar_chart_png
    png = bar_chart_png("t", ["a", "b"], [Panel("p", [1, 3])])
    img = Image.open(io.BytesIO(png)).convert("RGB")
    w, h = img.size
    blue = tuple(int(BLUE[i:i + 2], 16) for i in (1, 3, 5))
    px = img.load()
    per_col = [sum(1 for y in range(h) if px[x, y] == blue) for x in range(w)]
    # the two most common non-zero column heights: the inside of each bar
    (tall, _), (short, _) = sorted(Counter(c for c in per_col if c).most_common(2), reverse=True)
    assert abs(tall / short - 3) < 0.05, (tall, short)
