"""The standard attention benchmark: aotriton-rocm's precompiled kernels beside
torch's FLASH, CUDNN and EFFICIENT SDPA backends (and our kernel sources
through the Triton JIT where triton is importable), measured side by side in
one run on whatever GPU runs it.

    python benchmarks/bench_attention.py [--quick] [--passes fwd] [--json FILE] [--plot FILE.png]

Grid (FlashAttention's standard shapes): B*S = 16k tokens, H*D = 2048, head
dims 64/128/256, S in 512..16k, causal and not, fp16 and bf16; forward,
backward and forward+backward. Extra rows: decode-like (Sq = 1, Sk = 8k) and
a Llama-style GQA shape (32 query heads, 8 key/value heads, D = 128).
FLOP counts are the standard ones: forward 4*B*H*Sq*Sk*D (halved when
causal), backward 2.5x the forward, forward+backward 3.5x.

Every timing is the median over repetitions of CUDA-event time around a few
back-to-back calls (the host runs ahead, as in training), after warm-up.
The peers of a shape are timed in interleaved rounds, so that the GPU's
clocks drifting during a shape reach every peer alike, not the first one.
Our cells count our kernels' launches: a cell where torch's kernel ran
instead is reported as "fallback", never as ours. Numbers are measured, not
asserted: this is a benchmark, not a test. `--plot` needs matplotlib (or run
benchmarks/plot_attention.py on the JSON elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm

OURS = "aotriton-rocm"
TORCH_PEERS = {"FLASH": SDPBackend.FLASH_ATTENTION, "CUDNN": SDPBackend.CUDNN_ATTENTION,
               "EFFICIENT": SDPBackend.EFFICIENT_ATTENTION}
TRITON_JIT = "triton JIT"
PASSES = ("fwd", "bwd", "fwd+bwd")
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
QUEUED_CALLS = 4  # back-to-back calls per timed repetition
ROUNDS = 5  # interleaved rounds over the peers per shape (see measure_shape)


@dataclass(frozen=True)
class Shape:
    label: str
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: str

    def forward_flops(self) -> float:
        flops = 4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        return flops / 2 if self.causal else flops


def standard_shape(dtype: str, head_dim: int, seqlen: int, causal: bool) -> Shape:
    """FlashAttention's standard shape: B*S = 16k tokens, H*D = 2048."""
    return Shape("standard", max(1, 16384 // seqlen), 2048 // head_dim, 2048 // head_dim,
                 seqlen, seqlen, head_dim, causal, dtype)


def decode_shape(dtype: str) -> Shape:
    """A decoding step's shape: one query row per sequence against 8k keys."""
    return Shape("decode", 16, 32, 32, 1, 8192, 128, False, dtype)


def add_one_shape_arguments(parser) -> None:
    """The options naming one shape, one pass and the backends to run it on
    (kernel_times.py, sustained_power.py); ``one_shape`` of the parsed
    arguments gives the shape."""
    parser.add_argument("--dtype", default="bf16", choices=("fp16", "bf16"))
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--decode", action="store_true",
                        help="the decode shape (Sq = 1, Sk = 8k, D = 128) instead of a standard one")
    parser.add_argument("--pass", dest="pass_name", default="bwd", choices=PASSES)
    parser.add_argument("--peers", default=f"{OURS},FLASH,CUDNN")


def one_shape(args) -> Shape:
    """The shape ``add_one_shape_arguments``'s options name."""
    if args.decode:
        return decode_shape(args.dtype)
    return standard_shape(args.dtype, args.head_dim, args.seqlen, args.causal)


def standard_shapes(quick: bool, dtypes=("fp16", "bf16")) -> list[Shape]:
    dtypes = ("bf16",) if quick else dtypes
    seqlens = (1024, 4096, 16384) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    shapes = []
    for dtype in dtypes:
        for d in (64, 128, 256):
            for causal in (False, True):
                for s in seqlens:
                    shapes.append(standard_shape(dtype, d, s, causal))
        shapes.append(decode_shape(dtype))
        for causal in (False, True):
            shapes.append(Shape("llama-gqa", 4, 32, 8, 4096, 4096, 128, causal, dtype))
    return shapes


def _dtype(name: str) -> torch.dtype:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def make_inputs(shape: Shape):
    """(B, H, S, D) tensors as SDPA takes them, requiring grad."""
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = _dtype(shape.dtype)

    def rand(h, s):
        return torch.randn(shape.batch, h, s, shape.head_dim, device="cuda", dtype=dt,
                           generator=g).requires_grad_(True)

    q = rand(shape.heads_q, shape.seqlen_q)
    k = rand(shape.heads_kv, shape.seqlen_k)
    v = rand(shape.heads_kv, shape.seqlen_k)
    grad = torch.randn(q.shape, device="cuda", dtype=dt, generator=g)
    return q, k, v, grad


def _times_ms(fn, reps: int, warmup: int = 2) -> list:
    """``reps`` timings (ms per call) of ``QUEUED_CALLS`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(QUEUED_CALLS):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / QUEUED_CALLS)
    return times


def pass_fns(attend, q, k, v, grad, passes=PASSES):
    """Callables of the requested passes (of fwd / bwd / fwd+bwd); bwd reuses
    one retained graph, built only when bwd is requested."""
    def fwd():
        with torch.no_grad():
            attend(q, k, v)

    def fwd_bwd():
        torch.autograd.grad(attend(q, k, v), (q, k, v), grad)

    fns = {"fwd": fwd, "fwd+bwd": fwd_bwd}
    if "bwd" in passes:
        out = attend(q, k, v)
        fns["bwd"] = lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    return {name: fns[name] for name in PASSES if name in passes}


def sdpa_call(shape: Shape):
    gqa = shape.heads_q != shape.heads_kv

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, enable_gqa=gqa)

    return attend


def _our_launches() -> int:
    return sum(n for (backend, _), n in aotriton_rocm.launch_counts().items()
               if not backend.startswith("interp"))


@contextlib.contextmanager
def sdpa_on(peer: str):
    """SDPA calls in the block run on ``peer``: ours (in torch's FLASH slot)
    or one of torch's backends; the Triton JIT peer calls no SDPA."""
    if peer == TRITON_JIT:
        yield
        return
    if peer != OURS:
        with sdpa_kernel(TORCH_PEERS[peer]):
            yield
        return
    aotriton_rocm.enable()
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            yield
    finally:
        aotriton_rocm.disable()


def refusal_text(exc: RuntimeError) -> str:
    """The first line of a backend's refusal, for a table cell or a report."""
    return str(exc).strip().splitlines()[0][:160]


def _refusal(exc: RuntimeError) -> dict:
    return {"error": refusal_text(exc)}


def _peer_fns(peer: str, shape: Shape, attend, inputs, passes) -> dict:
    """{pass: callable} of one peer, each run once (our launch count is
    checked there), or {"error": why not}."""
    q, k, v, grad = inputs
    try:
        if peer == TRITON_JIT:
            jit = _triton_jit_forward(shape, q, k, v)
            if isinstance(jit, str):
                return {"error": jit}
            jit()
            return {"fwd": jit}
        with sdpa_on(peer):
            aotriton_rocm.reset_launch_counts()
            fns = pass_fns(attend, q, k, v, grad, passes)
            for fn in fns.values():
                fn()
            if peer == OURS and _our_launches() == 0:
                return {"error": "fallback: torch's kernel ran, not ours"}
    except RuntimeError as exc:  # a backend that refuses this shape or dtype
        return _refusal(exc)
    return fns


def measure_shape(shape: Shape, peers: list[str], reps: int, passes=PASSES) -> dict:
    """{peer: {pass: ms} or {"error": why}}. The peers are timed in ROUNDS
    interleaved rounds (each round times every peer in turn), so a drift of
    the GPU's clocks over the shape's run reaches every peer alike; each
    pass's figure is the median of its ``reps`` timings."""
    inputs = make_inputs(shape)
    attend = sdpa_call(shape)
    fns, result = {}, {}
    for peer in peers:
        got = _peer_fns(peer, shape, attend, inputs, passes)
        if "error" in got:
            result[peer] = got
        else:
            fns[peer] = got
    times = {peer: {name: [] for name in got} for peer, got in fns.items()}
    for round_ in range(ROUNDS):
        n = reps // ROUNDS + (round_ < reps % ROUNDS)  # the remainder in the first rounds
        if n == 0:
            continue
        for peer in list(fns):  # a copy: a peer that refuses mid-way leaves fns
            try:
                with sdpa_on(peer):
                    for name, fn in fns[peer].items():
                        times[peer][name] += _times_ms(fn, n)
            except RuntimeError as exc:
                result[peer] = _refusal(exc)
                del fns[peer]
    for peer in fns:
        result[peer] = {name: statistics.median(t) for name, t in times[peer].items() if t}
    return result


def _triton_jit_forward(shape: Shape, q, k, v):
    """Our forward kernel's source through the Triton JIT, its arguments bound
    by name from variants.toml, or why not (a string). Arguments this
    benchmark does not set are off: null-like pointers, zero scalars."""
    try:
        from aotriton_rocm.core import attention, kernel_sources, kernel_spec
        spec = kernel_spec.load_variants(kernel_spec.kernels_dir())
        kernel = spec.kernels["attn_fwd"]
        fn = kernel_sources.jit_function(kernel)
    except (ImportError, OSError) as exc:
        return f"our kernel sources through the Triton JIT: {type(exc).__name__}: {exc}"
    # the variant the runtime would run: the unmasked one where the head dim is a tile width
    tile = max(16, 1 << (shape.head_dim - 1).bit_length())
    variant = next((v for masked in (tile != shape.head_dim, True)
                    for v in spec.variants_for(kernel_spec.INTERPRETER_ARCH)
                    if v.kernel == "attn_fwd" and v.functional == {
                        "dtype": shape.dtype, "head_dim": tile, "pad_head": masked,
                        "has_bias": False, "enable_dropout": False}), None)
    if variant is None:
        return "no attn_fwd variant for this dtype and head dim"
    qd, kd, vd = (t.detach() for t in (q, k, v))
    b, h, s, d = qd.shape
    o = torch.empty_like(qd)
    lse = torch.empty((b, h, s), dtype=torch.float32, device="cuda")
    unused_i32 = torch.zeros(2, dtype=torch.int32, device="cuda")
    unused_i64 = torch.zeros(2, dtype=torch.int64, device="cuda")
    bottom_right, left, right = attention.mask_args(shape.causal, shape.seqlen_q, shape.seqlen_k)
    values = {
        "Q": qd, "K": kd, "V": vd, "O": o, "LSE": lse, "CU_Q": unused_i32, "CU_K": unused_i32,
        "RNG_SEED": unused_i64, "RNG_OFFSET": unused_i64,
        "stride_lz": h * s, "stride_lh": s, "batch": b, "num_heads": h,
        "gqa_group": shape.heads_q // shape.heads_kv, "max_seqlen_q": shape.seqlen_q,
        "max_seqlen_k": shape.seqlen_k, "head_dim": d, "bottom_right": bottom_right,
        "window_left": left, "window_right": right, "sm_scale": attention.default_scale(d),
    }
    for prefix, t in (("q", qd), ("k", kd), ("v", vd), ("o", o)):
        for axis, stride in zip("zh" + ("m" if prefix in "qo" else "n"), t.stride()[:3]):
            values[f"stride_{prefix}{axis}"] = stride
    kwargs = {}
    for name, type_ in kernel.args:
        if name in values:
            kwargs[name] = values[name]
        else:
            kwargs[name] = qd if type_.startswith("*") else (0.0 if type_.startswith("fp") else 0)
    grid = (-(-shape.seqlen_q // variant.config["BLOCK_M"]), b * h, 1)

    def forward():
        fn[grid](**kwargs, **variant.options, **variant.constexprs)

    return forward


def _peers() -> list[str]:
    peers = [OURS, *TORCH_PEERS]
    if importlib.util.find_spec("triton") is not None:
        peers.append(TRITON_JIT)
    return peers


def run(shapes: list[Shape], reps: int, peers: list[str], passes=PASSES) -> list[dict]:
    rows = []
    for i, shape in enumerate(shapes, 1):
        row = {"shape": asdict(shape), "tflops": {}, "ms": {}, "errors": {}}
        for peer, ms in measure_shape(shape, peers, reps, passes).items():
            if "error" in ms:
                row["errors"][peer] = ms.pop("error")
            for name, value in ms.items():
                flops = shape.forward_flops() * PASS_FLOP_FACTOR[name]
                row["tflops"].setdefault(name, {})[peer] = flops / value / 1e9
                row["ms"].setdefault(name, {})[peer] = value
        torch.cuda.empty_cache()
        rows.append(row)
        print(f"[{i}/{len(shapes)}] {format_row(row)}", flush=True)
    return rows


def shape_text(s: dict) -> str:
    heads = f"H{s['heads_q']}" + (f"/{s['heads_kv']}" if s["heads_kv"] != s["heads_q"] else "")
    seq = f"S{s['seqlen_q']}" if s["seqlen_q"] == s["seqlen_k"] else \
        f"Sq{s['seqlen_q']} Sk{s['seqlen_k']}"
    return (f"{s['dtype']} {s['label']:<9} D{s['head_dim']:<3} {heads:<6} B{s['batch']:<3} "
            f"{seq:<12} {'causal' if s['causal'] else 'full'}")


def format_row(row: dict) -> str:
    cells = [shape_text(row["shape"])]
    for name in PASSES:
        by_peer = row["tflops"].get(name, {})
        ours = by_peer.get(OURS)
        parts = [f"{p}={by_peer[p]:.0f}" for p in by_peer]
        for peer in ("FLASH", "CUDNN"):
            if ours and by_peer.get(peer):
                parts.append(f"x{peer}={ours / by_peer[peer]:.2f}")
        if parts:
            cells.append(f"{name}: " + " ".join(parts))
    return " | ".join(cells)


def markdown_table(rows: list[dict], pass_name: str) -> str:
    """TFLOP/s per peer (microseconds for decoding rows) and our ratios
    against FLASH and CUDNN, one pass."""
    peers = [p for p in _peers_in(rows)]
    head = ["shape", *peers, "ours/FLASH", "ours/CUDNN"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        by_peer = row["tflops"].get(pass_name, {})
        if not by_peer:
            continue
        ours = by_peer.get(OURS)
        cells = [shape_text(row["shape"]).replace("  ", " ")]
        if row["shape"]["seqlen_q"] == 1 and row.get("ms", {}).get(pass_name):
            # decoding is memory-bound: its time says more than its FLOP rate
            times = row["ms"][pass_name]
            cells += [f"{times[p] * 1000:.0f} us" if p in times else "-" for p in peers]
        else:
            cells += [f"{by_peer[p]:.0f}" if p in by_peer else "-" for p in peers]
        for peer in ("FLASH", "CUDNN"):
            cells.append(f"{ours / by_peer[peer]:.2f}" if ours and by_peer.get(peer) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _peers_in(rows: list[dict]) -> list[str]:
    seen = []
    for row in rows:
        for by_peer in row["tflops"].values():
            for peer in by_peer:
                if peer not in seen:
                    seen.append(peer)
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="bf16 only, S in {1k, 4k, 16k} (about a sixth of the grid)")
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions per cell")
    parser.add_argument("--head-dims", default="", help="only these head dims, e.g. 64,128")
    parser.add_argument("--dtypes", default="fp16,bf16", help="fp16, bf16 or both (default)")
    parser.add_argument("--peers", default="",
                        help=f"only these, comma-separated (default: all of {', '.join(_peers())})")
    parser.add_argument("--label", default="", help="only these shape labels, e.g. standard")
    parser.add_argument("--passes", default=",".join(PASSES),
                        help="only these of fwd, bwd, fwd+bwd (fwd alone: an A/B of forward kernels "
                             "in about a third of the time)")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--plot", type=Path, help="write a PNG chart here (needs matplotlib)")
    args = parser.parse_args(argv)
    wanted_passes = set(args.passes.split(","))
    passes = tuple(p for p in PASSES if p in wanted_passes)
    if wanted_passes - set(PASSES) or not passes:
        parser.error(f"--passes: unknown {sorted(wanted_passes - set(PASSES))}; choose from {', '.join(PASSES)}")
    if not torch.cuda.is_available():
        print("bench_attention needs a GPU", file=sys.stderr)
        return 2
    shapes = standard_shapes(args.quick, tuple(args.dtypes.split(",")))
    if args.head_dims:
        wanted = {int(x) for x in args.head_dims.split(",")}
        shapes = [s for s in shapes if s.head_dim in wanted]
    if args.label:
        shapes = [s for s in shapes if s.label in args.label.split(",")]
    peers = _peers()
    if args.peers:
        unknown = set(args.peers.split(",")) - set(peers)
        if unknown:
            parser.error(f"--peers: unknown {sorted(unknown)}; known here: {', '.join(peers)}")
        peers = [p for p in peers if p in args.peers.split(",")]
    if "fwd" not in passes:
        peers = [p for p in peers if p != TRITON_JIT]  # it times the forward only
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "aotriton_rocm": aotriton_rocm.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "timing": f"median of {args.reps} x {QUEUED_CALLS} queued calls, CUDA events, the peers "
                      f"interleaved over {ROUNDS} rounds per shape",
            "flops": "fwd 4*B*H*Sq*Sk*D (causal: half); bwd 2.5x fwd; fwd+bwd 3.5x fwd"}
    print(f"{meta['gpu']}, torch {meta['torch']}, aotriton-rocm {meta['aotriton_rocm']}; "
          f"TFLOP/s, {meta['timing']}", flush=True)
    rows = run(shapes, args.reps, peers, passes)
    for name in passes:
        print(f"\n### {name} (TFLOP/s)\n\n{markdown_table(rows, name)}")
    report = {"meta": meta, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        sys.path.insert(0, str(Path(__file__).parent))
        from plot_attention import plot
        plot(report, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
