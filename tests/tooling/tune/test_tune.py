"""`aotriton-rocm tune`: the search space, the tuning file it writes, and the
whole flow (compile or interpret, launch through the runtime's op code,
time, check against float64 math, write) on the CPU interpreter and, where
there is one, on the GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from aotriton_rocm.core import device  # noqa: E402
from aotriton_rocm.common.errors import UsageError  # noqa: E402
from aotriton_rocm.core.kernel_spec import VariantSpecError, load_variants  # noqa: E402
from aotriton_rocm.tooling.builder import tuning as T  # noqa: E402
from aotriton_rocm.tooling.common.targets import load_targets  # noqa: E402
from aotriton_rocm.tooling.tune.command import TuneOptions, run_tune  # noqa: E402
from aotriton_rocm.tooling.tune.space import load_space  # noqa: E402
from aotriton_rocm.tooling.tune.workloads import NOT_TUNED  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _sm90():
    return load_targets(ROOT / "ci" / "targets.toml").resolve(None, ["sm_90"])[1][0]


def test_space_adds_candidates_to_every_shipped_sm90_point():
    spec = load_variants(ROOT / "kernels")
    arch = _sm90()
    declared = [v for v in spec.variants_for(arch) if v.kernel not in NOT_TUNED]
    every = [v for v in spec.variants_for(arch, load_space(spec)) if v.kernel not in NOT_TUNED]
    points = {(v.kernel, tuple(v.functional.items())) for v in declared}
    assert points == {(v.kernel, tuple(v.functional.items())) for v in every}
    per_point = {}
    for v in every:
        per_point.setdefault((v.kernel, tuple(v.functional.items())), []).append(v)
    # every shipped point has something to choose from; declared configs come first
    assert min(len(vs) for vs in per_point.values()) >= 3
    assert len({v.key for v in every}) == len(every)


def test_space_rejects_unknown_names(tmp_path):
    spec = load_variants(ROOT / "kernels")
    bad = tmp_path / "space.toml"
    bad.write_text('[[attn_fwd]]\narchs = ["cuda"]\nconfigs = [{ BLOCK_Q = 64, num_warps = 4, '
                   'num_stages = 2 }]\n')
    with pytest.raises(VariantSpecError, match="BLOCK_Q.*neither a constexpr"):
        load_space(spec, bad)
    bad.write_text('[[no_such_kernel]]\narchs = ["cuda"]\nconfigs = []\n')
    with pytest.raises(VariantSpecError, match="no such kernel"):
        load_space(spec, bad)


def test_dump_is_one_choice_per_line_and_loads_back(tmp_path):
    doc = {"schema": 1, "arch": "sm_90", "how": "h", "device": {"name": "x"},
           "choices": [{"kernel": "attn_fwd", "functional": {"dtype": ["fp16"]}, "seqlen_max": 512,
                        "config": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}},
                       {"kernel": "attn_fwd", "functional": {"dtype": ["fp16"]}, "seqlen_max": None,
                        "config": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}}]}
    text = T.dump_measured(doc)
    assert json.loads(text) == doc
    lines = text.splitlines()
    assert sum(1 for line in lines if line.strip().startswith('{"kernel"')) == 2
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "sm_90.json").write_text(text)
    m = T.load_measured(tmp_path, "sm_90")
    assert [e.seqlen_max for e in m.entries] == [512, None]
    configs = T.measured_configs(m, load_variants(ROOT / "kernels"))
    assert [dict(c.values) for c in configs["attn_fwd"]] == [c["config"] for c in doc["choices"]]


def test_with_choice_ships_one_config_at_every_length_for_matched_points():
    from aotriton_rocm.tooling.builder.plan import Subset

    def entry(dtype, head_dim, smax, block_m):
        return {"kernel": "attn_fwd", "functional": {"dtype": [dtype], "head_dim": [head_dim]},
                "seqlen_max": smax, "config": {"BLOCK_M": block_m, "BLOCK_N": 64},
                "measured": [{"seqlen": 512, "us": 1.0}]}
    doc = {"schema": 1, "arch": "sm_90",
           "choices": [entry("bf16", 64, 512, 32), entry("bf16", 64, None, 64),
                       entry("bf16", 128, None, 128), entry("fp16", 64, None, 16)]}
    subset = Subset.parse(["kernel=attn_fwd,head_dim=64"])
    new = T.with_choice(doc, subset.accepts_point, {"BLOCK_M": 64, "BLOCK_N": 128}, "why")
    picked = {"BLOCK_M": 64, "BLOCK_N": 128}
    assert new["choices"] == [
        {"kernel": "attn_fwd", "functional": {"dtype": ["bf16"], "head_dim": [64]},
         "seqlen_max": None, "config": picked, "note": "why"},
        entry("bf16", 128, None, 128),
        {"kernel": "attn_fwd", "functional": {"dtype": ["fp16"], "head_dim": [64]},
         "seqlen_max": None, "config": picked, "note": "why"}]
    assert doc["choices"][0]["config"]["BLOCK_M"] == 32  # the input is left alone
    m = T.load_measured_text(T.dump_measured(new), "sm_90", "x")
    for bound in (16, 512, None):  # every bucket, the open one included
        assert dict(m.entry_for("attn_fwd", {"dtype": "bf16", "head_dim": 64}, bound).config) == picked
    with pytest.raises(T.TuningError, match="no choice"):
        T.with_choice(doc, Subset.parse(["head_dim=256"]).accepts_point, picked, "why")
    both = dict(doc, choices=[{"kernel": "attn_fwd", "functional": {"dtype": ["bf16", "fp16"],
                                                                     "head_dim": [64]},
                               "seqlen_max": None, "config": {"BLOCK_M": 16}}])
    with pytest.raises(T.TuningError, match="split that entry"):
        T.with_choice(both, Subset.parse(["dtype=fp16"]).accepts_point, picked, "why")


def test_shortest_bucket_is_timed_as_decoding():
    """The kernels chosen by seqlen_q are timed at their 16-row bucket with
    a few query rows against 8k keys (what that bucket serves); dK/dV,
    chosen by seqlen_k, too, for its decoding tile (not a bucket)."""
    from aotriton_rocm.tooling.tune.workloads import workload_for

    point = {"dtype": "bf16", "head_dim": 128, "pad_head": False, "has_bias": False,
             "enable_dropout": False}
    cpu = torch.device("cpu")

    def shape(kernel, s):
        return workload_for(kernel, point, cpu, tokens=16384, hidden=2048, open_seqlen=16384).shape(s)

    for kernel in ("attn_fwd", "attn_bwd_preprocess", "attn_bwd_dq", "attn_bwd_dkdv"):
        assert shape(kernel, 16) == "B=32 H=16 Sq=16 Sk=8192 D=128, causal and not"
        assert shape(kernel, 32) == "B=512 H=16 S=32 D=128, causal and not"
        w = workload_for(kernel, point, cpu, tokens=16384, hidden=2048, open_seqlen=16384)
        assert w.decode_rows == (16 if kernel == "attn_bwd_dkdv" else None)


def test_seqlens_must_be_bucket_bounds():
    with pytest.raises(UsageError, match="not a bucket bound"):
        run_tune(TuneOptions(device="cpu", seqlens=(1000,), only=("kernel=attn_fwd",)))


def _tuned_root(tmp_path) -> Path:
    root = tmp_path / "root"
    for part in ("kernels", "ci"):
        shutil.copytree(ROOT / part, root / part)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("earlier", [True, False], ids=["earlier-entries", "first-tuning"])
def test_cpu_flow_writes_checked_choices_and_keeps_other_entries(tmp_path, monkeypatch, earlier):
    """Timed at buckets 16 and 32 only: the point's earlier entries still
    decide the buckets above 32; without any, the 32 winner covers them."""
    root = _tuned_root(tmp_path)
    out = root / "kernels" / "tuning" / "sm_90.json"
    point = {"dtype": ["fp16"], "head_dim": [16], "pad_head": [True], "has_bias": [False],
             "enable_dropout": [True]}

    def of_point(c):
        return c["kernel"] == "attn_fwd" and all(c["functional"].get(k) == v for k, v in point.items())

    if not earlier:
        doc = json.loads(out.read_text())
        doc["choices"] = [c for c in doc["choices"] if not of_point(c)]
        out.write_text(json.dumps(doc))
    before = T.load_measured(root / "kernels", "sm_90")
    func = {k: v[0] for k, v in point.items()}
    old_open = before.entry_for("attn_fwd", func, None)
    assert (old_open is not None) == earlier
    monkeypatch.chdir(root)
    only = ("kernel=attn_fwd,dtype=fp16,head_dim=16,has_bias=false,enable_dropout=true",)
    rc = run_tune(TuneOptions(device="cpu", only=only, seqlens=(16, 32), tokens=64, hidden=32,
                              work=tmp_path / "work"))
    assert rc == 0
    doc = json.loads(out.read_text())
    n = next(i for i, c in enumerate(doc["choices"]) if c["functional"] != point)
    mine = doc["choices"][:n]
    assert mine and all(c["kernel"] == "attn_fwd" and "measured" in c for c in mine)
    assert mine[-1]["seqlen_max"] == (32 if earlier else None)
    for c in mine:
        # dropout is checked against float64 math with the kernels' own keep mask
        assert c["check"].startswith("S=") and " > " not in c["check"]
        for row in c["measured"]:
            assert 0 < row["us"] <= row["fallback_us"]
    after = T.load_measured(root / "kernels", "sm_90")
    for bound in (16, 32):
        assert dict(after.entry_for("attn_fwd", func, bound).config) == next(
            c["config"] for c in mine if c["seqlen_max"] is None or c["seqlen_max"] >= bound)
    if earlier:  # the open bucket: still what was measured before
        assert after.entry_for("attn_fwd", func, None).config == old_open.config
    # the entries of the other points stay, after the new ones, in their order
    assert [(c["kernel"], tuple((k, tuple(v)) for k, v in c["functional"].items()),
             c.get("seqlen_max"), tuple(c["config"].items()))
            for c in doc["choices"][n:] if not of_point(c)] \
        == [(e.kernel, e.functional, e.seqlen_max, e.config) for e in before.entries
            if not (e.kernel == "attn_fwd" and dict(e.functional) == {k: tuple(v) for k, v in point.items()})]
    assert doc["device"]["name"].startswith("CPU") and "--device cpu" in doc["commands"][-1]
    # each choice names the GPU that measured it: this run's, or the one before's
    assert all(c["device"] == doc["device"]["name"] for c in mine)
    assert all(c["device"] and not c["device"].startswith("CPU") for c in doc["choices"][n:])
    # and the build reads it: every choice names a compilable config
    configs = T.measured_configs(T.load_measured(root / "kernels", "sm_90"),
                                 load_variants(root / "kernels"))
    assert len(configs["attn_fwd"]) == sum(1 for c in doc["choices"] if c["kernel"] == "attn_fwd"
                                           and {"num_warps", "num_stages"} <= c["config"].keys())


def test_cpu_flow_times_the_decoding_tile_of_dkdv(tmp_path, monkeypatch):
    """dK/dV timed at the 16-row bucket only: the winner is the point's
    decoding entry (seqlen_q_max), first in the file; it replaces the
    point's earlier one (twice over), and the entries that decide its
    key-length buckets stay as they were."""
    root = _tuned_root(tmp_path)
    out = root / "kernels" / "tuning" / "sm_90.json"
    func = {"dtype": "fp16", "head_dim": 16, "pad_head": True, "has_bias": False,
            "enable_dropout": False}
    before = T.load_measured(root / "kernels", "sm_90")
    decoding_before = sum(e.seqlen_q_max is not None for e in before.entries)
    assert before.decode_entry_for("attn_bwd_dkdv", func) is not None  # the tree's, replaced below
    buckets = [before.entry_for("attn_bwd_dkdv", func, b) for b in (*T.SEQLEN_BUCKETS, None)]
    monkeypatch.chdir(root)
    only = ("kernel=attn_bwd_dkdv,dtype=fp16,head_dim=16,pad_head=true,has_bias=false,"
            "enable_dropout=false",)
    for _ in range(2):
        assert run_tune(TuneOptions(device="cpu", only=only, seqlens=(16,), tokens=64, hidden=32,
                                    work=tmp_path / "work")) == 0
    doc = json.loads(out.read_text())
    mine = [c for c in doc["choices"] if c["kernel"] == "attn_bwd_dkdv"
            and c["functional"] == {k: [v] for k, v in func.items()}]
    decoding = [c for c in mine if "seqlen_q_max" in c]
    assert len(decoding) == 1 and decoding[0] == doc["choices"][0]
    (row,) = decoding[0]["measured"]
    assert decoding[0]["seqlen_q_max"] == 16 and decoding[0]["seqlen_max"] is None
    assert row["at"].startswith("B=1 H=2 Sq=16 Sk=32 ") and 0 < row["us"] <= row["fallback_us"]
    after = T.load_measured(root / "kernels", "sm_90")
    assert dict(after.decode_entry_for("attn_bwd_dkdv", func).config) == decoding[0]["config"]
    assert sum(e.seqlen_q_max is not None for e in after.entries) == decoding_before
    assert [after.entry_for("attn_bwd_dkdv", func, b).config for b in (*T.SEQLEN_BUCKETS, None)] \
        == [e.config for e in buckets]


@pytest.mark.gpu
@pytest.mark.skipif(not device.gpu_available(), reason="no GPU visible to torch")
def test_gpu_flow(tmp_path, monkeypatch):
    """On the GPU: the point's candidates compiled as the build compiles
    them, timed in CUDA graphs, the winner checked; the winner is the
    fastest of the candidates timed and no slower than the fallback."""
    root = _tuned_root(tmp_path)
    monkeypatch.chdir(root)
    arch = device.arch_of(torch.cuda.current_device())
    out = tmp_path / "t.json"
    only = ("kernel=attn_fwd,dtype=bf16,head_dim=128,pad_head=false,has_bias=false,"
            "enable_dropout=false",)
    assert run_tune(TuneOptions(only=only, seqlens=(1024, 16384), out=out,
                                work=tmp_path / "work")) == 0
    doc = json.loads(out.read_text())
    assert doc["arch"] == arch and doc["device"]["name"] == torch.cuda.get_device_name()
    assert doc["choices"] and doc["choices"][-1]["seqlen_max"] is None
    for c in doc["choices"]:
        assert c["candidates"] >= 3 and " > " not in c["check"]
        for row in c["measured"]:
            assert 0 < row["us"] <= row["fallback_us"]
            if "runner_up_us" in row:
                assert row["us"] <= row["runner_up_us"]


def test_amd_candidates_are_compiled_and_validated_before_timing(tmp_path, monkeypatch):
    """On a ROCm GPU tune compiles for its arch and drops candidates the AMD
    validator rejects before timing any: the toy kernel's 32-row tile
    spills on gfx1100 (a real compile here; nothing is launched)."""
    from support.select_toy import HOG, HOG_SMALL, SCALE_ADD, make_root

    root = make_root(tmp_path / "root", SCALE_ADD + HOG.replace("{allow}", "") + HOG_SMALL,
                     measured=None)
    from aotriton_rocm.tooling.builder.plan import Sources
    from aotriton_rocm.tooling.tune.measure import Launchers

    sources = Sources.find(root)
    spec = load_variants(sources.kernels_dir)
    arch = load_targets(sources.targets_path).resolve(None, ["gfx1100"])[1][0]
    hogs = [v for v in spec.variants_for(arch) if v.kernel == "hog"]
    launchers = Launchers(hogs, arch, spec, sources, spec.check_sources(),
                          TuneOptions(work=tmp_path / "work", jobs=2), torch.device("cuda"),
                          stream=open(tmp_path / "log", "w"))
    (spilled,) = launchers.rejected
    assert "BLOCK_M=32" in spilled and "scratch memory per lane" in launchers.rejected[spilled]
    assert len(hogs) == 2
    # a config that waives the finding stays a candidate, as the build would ship it
    allow = 'allow = { spills = true, reason = "toy" }'
    (root / "kernels" / "variants.toml").write_text(SCALE_ADD + HOG.replace("{allow}", allow)
                                                    + HOG_SMALL)
    spec = load_variants(sources.kernels_dir)
    hogs = [v for v in spec.variants_for(arch) if v.kernel == "hog"]
    launchers = Launchers(hogs, arch, spec, sources, spec.check_sources(),
                          TuneOptions(work=tmp_path / "work", jobs=2), torch.device("cuda"),
                          stream=open(tmp_path / "log", "w"))
    assert launchers.rejected == {}
