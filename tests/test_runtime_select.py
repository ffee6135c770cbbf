"""The AOT backend picks the config the build chose for the call's seqlen
bucket (manifest "tuning"), with no GPU: a hand-written archive, the device
and the launcher stubbed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aotriton_rocm import backends  # noqa: E402
from aotriton_rocm.archive import KernelRecord, write_archive  # noqa: E402

ARGS = (("Q", "*fp16"), ("seqlen_q", "i32"), ("global_scratch", "*i8"), ("profile_scratch", "*i8"))


def _rec(kernel: str, block_m: int, block_n: int = 64, **functional) -> KernelRecord:
    f = {"dtype": "fp16", "head_dim": 64, "pad_head": False, "has_bias": False, "enable_dropout": False}
    f.update(functional)
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 1}
    key = "|".join([kernel] + [f"{k}={v}" for k, v in f.items()] + [",".join(f"{k}={v}" for k, v in cfg.items())])
    return KernelRecord(key=key, kernel=kernel, functional=f, config=cfg, constexprs={}, symbol=kernel,
                        num_warps=4, num_stages=1, warp_size=64, shared=0, global_scratch_size=0,
                        profile_scratch_size=0, args=ARGS, divisible_16=(), grid=("1", "1", "1"))


def _archive(path, records, tuning):
    from aotriton_rocm._version import ABI_VERSION
    man = {"package_version": "0", "abi_version": ABI_VERSION, "rocm_profile": "6.4", "arch": "gfx942",
           "backend": "hip", "warp_size": 64, "compiler": "triton", "compiler_version": "3.9.0",
           "build_inputs_hash": "0" * 64}
    if tuning is not None:
        man["tuning"] = tuning
    write_archive(path, man, [(r, f"code of {r.key}".encode()) for r in records])


@pytest.fixture
def backend_for(monkeypatch, tmp_path):
    import aotriton_rocm.driver.launcher as launcher
    from aotriton_rocm import device, images

    loaded = []

    class FakeKernel:
        def __init__(self, backend, code, symbol, *a):
            loaded.append(code)

    monkeypatch.setattr(launcher, "Kernel", FakeKernel)
    monkeypatch.setattr(device, "arch_of", lambda i: "gfx942")

    def make(records, tuning):
        path = tmp_path / "gfx942.aotr"
        _archive(path, records, tuning)
        monkeypatch.setattr(images, "find_archives", lambda refresh=False: {"gfx942": path})
        b = backends.AOTBackend(0)
        assert b.problem is None
        return b, loaded
    return make


def test_seqlen_buckets_pick_the_chosen_config(backend_for):
    f64, f128 = _rec("attn_fwd", 64), _rec("attn_fwd", 128)
    k16, k32 = _rec("attn_bwd_dkdv", 16, 16), _rec("attn_bwd_dkdv", 16, 32)
    tuning = {"schema": 1, "axes": {"attn_fwd": "seqlen_q", "attn_bwd_dkdv": "seqlen_k"}, "choices": [
        {"kernel": "attn_fwd", "functional": f64.functional,
         "select": [[64, f64.key, "static"], [None, f128.key, "static"]]},
        {"kernel": "attn_bwd_dkdv", "functional": k16.functional,
         "select": [[16, k16.key, "static"], [None, k32.key, "static"]]}]}
    b, loaded = backend_for([f64, f128, k16, k32], tuning)

    def fwd(sq, sk=4096):
        return b.kernel("attn_fwd", dtype="fp16", head_dim=64, seqlen_q=sq, seqlen_k=sk)
    assert fwd(1).config["BLOCK_M"] == 64 and fwd(64).config["BLOCK_M"] == 64
    assert fwd(65).config["BLOCK_M"] == 128 and fwd(100000).config["BLOCK_M"] == 128
    assert fwd(65) is fwd(4096)  # one handle per chosen record, made once
    assert len(loaded) == 2
    # dK/dV tiles the key axis: its bucket follows seqlen_k
    dkdv = [b.kernel("attn_bwd_dkdv", dtype="fp16", head_dim=64, seqlen_q=sq, seqlen_k=sk).config["BLOCK_N"]
            for sq, sk in ((4096, 16), (1, 17), (16, 4096))]
    assert dkdv == [16, 32, 32]


def test_archive_without_tuning_uses_the_first_record(backend_for):
    f64, f128 = _rec("attn_fwd", 64), _rec("attn_fwd", 128)
    b, _ = backend_for([f128, f64], None)
    for sq in (1, 100, 10000):
        assert b.kernel("attn_fwd", dtype="fp16", head_dim=64, seqlen_q=sq, seqlen_k=sq).config["BLOCK_M"] == 128
