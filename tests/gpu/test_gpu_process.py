"""Concurrency and the process model on a real GPU (the H100 via the sm_90
target): many threads hitting a kernel's first use in a fresh process, several
CUDA streams at once, CUDA-graph capture and replay (with and without
dropout), DataLoader workers (spawned ones running attention on the GPU, forked
ones doing CPU work after the parent used the GPU), and torch.compile over both
routes (the C++ route torch >= 2.10 uses by default, and the Python route
forced with AOTRITON_ROCM_TORCH_NATIVE=0).

Fresh-process cases run ``sys.executable`` on code held in this file, with a
timeout (a hang fails the test instead of stalling the run); they report one
``RESULT <json>`` line that the test judges. Bit-exact comparisons where the
arithmetic is identical (same kernel, same inputs), PyTorch's tolerance model
(float32 math reference) otherwise. Skipped without a GPU or without an
installed image for its arch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import aotriton_rocm
from aotriton_rocm.core import backends, torch_native
from aotriton_rocm.integrations import torch_integration

pytestmark = pytest.mark.gpu


from support import attn_reference as ref  # noqa: E402
from support.gpu import ours as _ours  # noqa: E402

NATIVE_ENV = torch_native.NATIVE_ENV
ROUTES = ("default", "python")
TIMEOUT_S = 180  # a hang guard only: each case takes seconds


def _native_expected() -> bool:
    """Whether the default route is the C++ one here (torch >= 2.10 with the
    extension installed)."""
    return torch_integration.has_registry() and torch_native.available()


def _rand(*shape, dtype=torch.float16, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(dtype)


@pytest.fixture(params=ROUTES)
def route(request, monkeypatch):
    """Our implementation enabled on one route: the default (C++ where
    available) or the Python route (AOTRITON_ROCM_TORCH_NATIVE=0, read at
    activation)."""
    aotriton_rocm.disable()
    if request.param == "python":
        monkeypatch.setenv(NATIVE_ENV, "0")
    else:
        monkeypatch.delenv(NATIVE_ENV, raising=False)
    aotriton_rocm.enable()
    assert torch_native.is_active() == (request.param == "default" and _native_expected())
    backends.reset_launch_counts()
    yield request.param
    aotriton_rocm.disable()


def _env(route: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop(NATIVE_ENV, None)
    if route == "python":
        env[NATIVE_ENV] = "0"
    return env


def _run(args, route: str, cwd) -> dict:
    """Run a fresh interpreter; its ``RESULT <json>`` line, parsed."""
    try:
        proc = subprocess.run([sys.executable, *args], env=_env(route), cwd=str(cwd),
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child process hung (> {TIMEOUT_S} s): stdout={exc.stdout!r} "
                    f"stderr={exc.stderr!r}")
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT line:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


# Shared by the child programs: the route they run on and our launch counts.
_CHILD_PRELUDE = """
import hashlib, json, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import aotriton_rocm
from aotriton_rocm.core import backends, device, torch_native
from aotriton_rocm.integrations import torch_integration

def counts():
    arch = device.arch_of(torch.cuda.current_device())
    got = backends.launch_counts()
    return {k: got.get((f"aot:{arch}", k), 0) for k in backends.KERNELS}

def route_info():
    return {"native": torch_native.is_active(),
            "native_expected": torch_integration.has_registry() and torch_native.available()
                               and os.environ.get("AOTRITON_ROCM_TORCH_NATIVE", "") != "0"}

def digest(t):
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(bytes(t.view(torch.uint8).flatten().tolist())).hexdigest()

def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def _check_route(result: dict, route: str) -> None:
    assert result["native"] == result["native_expected"], result
    if route == "python":
        assert not result["native"]


# --- (1) many threads at a kernel's first use, in a fresh process -------------

_THREADS_CHILD = _CHILD_PRELUDE + """
import threading, traceback
N = int(sys.argv[1])
aotriton_rocm.enable()
gen = torch.Generator("cuda").manual_seed(0)
inputs = [[torch.randn(2, 4, 384, 64, device="cuda", generator=gen, dtype=torch.float16)
           for _ in range(4)] for _ in range(N)]
torch.cuda.synchronize()
before = counts()  # launches since import: none, so no kernel of ours is loaded yet
backends.reset_launch_counts()

def step(q, k, v, g):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(g)
    return [out.detach(), q.grad, k.grad, v.grad]

barrier = threading.Barrier(N)
results, errors = [None] * N, []

def work(i):
    try:
        barrier.wait(timeout=60)  # all threads reach the first use together
        results[i] = step(*inputs[i])
    except BaseException:
        errors.append(traceback.format_exc())

# torch's SDPA backend flags are process-wide, not per thread: set once here
# (entering sdpa_kernel in each thread would race on restoring them).
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    hung = sum(t.is_alive() for t in threads)
    torch.cuda.synchronize()
    threaded = counts()
    backends.reset_launch_counts()
    serial = [step(*inputs[i]) for i in range(N)] if not errors and not hung else []
    torch.cuda.synchronize()
    serial_counts = counts()
mismatches = [[i, j] for i in range(len(serial)) for j in range(4)
              if not torch.equal(results[i][j], serial[i][j])]
report(before=before, threaded=threaded, serial=serial_counts, errors=errors, hung=hung,
       mismatches=mismatches, **route_info())
if hung:
    os._exit(1)  # hung threads would keep the interpreter from exiting
"""


@pytest.mark.parametrize("child_route", ROUTES)
def test_threads_at_first_use_in_fresh_process(child_route, tmp_path):
    """16 threads released by a barrier run SDPA forward + backward (fp16, one
    shape: one shared kernel per pass) in a fresh process, where no kernel of
    ours was loaded before. No thread fails or hangs; every output and
    gradient equals a single-threaded rerun bit for bit; the launch counts are
    exactly one per call for each kernel (forward, dK/dV, dQ)."""
    n = 16
    result = _run(["-c", _THREADS_CHILD, str(n)], child_route, tmp_path)
    _check_route(result, child_route)
    assert result["errors"] == [] and result["hung"] == 0, result["errors"]
    assert all(c == 0 for c in result["before"].values()), result["before"]
    for kernel in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"):
        assert result["threaded"][kernel] == n, result["threaded"]
        assert result["serial"][kernel] == n, result["serial"]
    assert result["mismatches"] == []


# --- (2) several CUDA streams at once -------------------------------------------

def _fwd_bwd(q, k, v, g):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(g)
    return [out.detach(), q.grad, k.grad, v.grad]


def test_concurrent_streams_equal_default_stream(route):
    """The same work (SDPA forward + backward) on 3 non-default streams at
    once equals the default stream's results bit for bit. Each stream first
    spins, then copies its inputs into zeroed buffers: a kernel launched on
    any stream but the current one would read the zeros (pool streams do not
    synchronise with the default stream), so equality also proves every launch
    went to the caller's stream."""
    n_streams, spin = 3, 50_000_000  # ~25 ms of GPU cycles before the copies
    inputs = [[_rand(2, 4, 512, 64, seed=10 * j + i) for i in range(4)] for j in range(n_streams)]
    want = [_fwd_bwd(*inp) for inp in inputs]
    staged = [[torch.zeros_like(t) for t in inp] for inp in inputs]
    torch.cuda.synchronize()
    backends.reset_launch_counts()
    streams = [torch.cuda.Stream() for _ in range(n_streams)]
    got = [None] * n_streams
    for j, stream in enumerate(streams):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(spin)
            for dst, src in zip(staged[j], inputs[j]):
                dst.copy_(src)
            got[j] = _fwd_bwd(*staged[j])
    for stream in streams:
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for kernel in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"):
        assert _ours(kernel) == n_streams, backends.launch_counts()
    for j in range(n_streams):
        for name, a, b in zip(("out", "dq", "dk", "dv"), got[j], want[j]):
            assert torch.equal(a, b), f"stream {j}: {name} differs from the default stream's"


# --- (3) CUDA-graph capture and replay ----------------------------------------

def _frac_equal(a, b) -> float:
    return (a == b).float().mean().item()


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
                         ids=["flash", "efficient"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_cuda_graph_capture_and_replay(route, backend, p):
    """SDPA forward captured into a CUDA graph after a warm-up on a side stream.
    The capture goes through our library once (one attn_fwd launch) and
    replays add none (they run the recorded kernel). p=0: replays equal each
    other and eager bit for bit, and after new values are copied into the
    static inputs a replay equals eager on them. p>0: every replay draws a
    fresh mask: under 5 % of the elements equal the first replay's (or the
    previous replay's), and the mean of K replays approaches the eager p=0
    output as independent masks do (its mean squared error is about 1/K of
    a single replay's; replays sharing one mask would keep the two equal)."""
    q, k, v = (_rand(2, 4, 256, 64, seed=i) for i in range(3))
    static_out = torch.empty_like(q)

    def step():
        with sdpa_kernel(backend):
            static_out.copy_(F.scaled_dot_product_attention(q, k, v, dropout_p=p))

    def eager():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    want = eager()
    torch.cuda.synchronize()
    backends.reset_launch_counts()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    assert _ours() == 1, backends.launch_counts()

    replays = []
    for _ in range(24):
        graph.replay()
        replays.append(static_out.clone())
    torch.cuda.synchronize()
    assert _ours() == 1, "a replay must not call into the library"
    assert all(torch.isfinite(r).all() for r in replays)

    if not p:
        for r in replays:
            assert torch.equal(r, replays[0]), "replays without dropout must be bit-identical"
        assert torch.equal(replays[0], want), "a replay must equal eager bit for bit"
        q.copy_(_rand(2, 4, 256, 64, seed=7))  # new values in the static input
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager()), "the replay must read the static inputs"
        return

    for prev, r in zip(replays, replays[1:]):
        assert _frac_equal(r, replays[0]) < 0.05, "a replay reused the first replay's mask"
        assert _frac_equal(r, prev) < 0.05, "consecutive replays share a mask"
    stack = torch.stack([r.float() for r in replays])
    single = ((stack - want.float()) ** 2).mean().item()
    mean = ((stack.mean(0) - want.float()) ** 2).mean().item()
    assert mean < 3.0 * single / len(replays), (mean, single)


# --- (4) DataLoader workers: spawned on the GPU, forked on the CPU -------------

_SPAWN_SCRIPT = _CHILD_PRELUDE + """
SHAPE, ITEMS = (1, 4, 200, 64), 6

def gpu_attention(i):
    gen = torch.Generator().manual_seed(1000 + i)
    q, k, v = (torch.randn(SHAPE, generator=gen).half().cuda() for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

def init_worker(_):
    aotriton_rocm.enable()
    backends.reset_launch_counts()

class GpuAttention(torch.utils.data.Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        before = counts()["attn_fwd"]
        out = gpu_attention(i)
        torch.cuda.synchronize()
        return {"index": i, "worker": torch.utils.data.get_worker_info().id, "pid": os.getpid(),
                "enabled": aotriton_rocm.is_enabled(), "native": torch_native.is_active(),
                "launches": counts()["attn_fwd"] - before, "sha": digest(out)}

if __name__ == "__main__":
    aotriton_rocm.enable()
    backends.reset_launch_counts()
    want = {i: digest(gpu_attention(i)) for i in range(ITEMS)}
    parent_launches = counts()["attn_fwd"]
    loader = torch.utils.data.DataLoader(GpuAttention(), batch_size=None, num_workers=2,
                                         multiprocessing_context="spawn",
                                         worker_init_fn=init_worker, timeout=120)
    items = list(loader)
    again = {i: digest(gpu_attention(i)) for i in range(ITEMS)}
    report(pid=os.getpid(), want=want, again=again, items=items,
           parent_launches=parent_launches, **route_info())
"""


def test_spawned_dataloader_workers_run_attention_on_gpu(tmp_path):
    """The parent runs attention on the GPU, then a DataLoader with 2 'spawn'
    workers: each worker imports torch and aotriton_rocm, enables it (in
    worker_init_fn) and runs the same attention on the GPU. Every item's
    SHA-256 over the output's bytes equals the parent's for the same inputs;
    each item was one launch of our forward kernel in a worker process (both
    workers served items, neither is the parent, both on the parent's route);
    the parent still gets identical results afterwards."""
    script = tmp_path / "spawn_loader.py"
    script.write_text(textwrap.dedent(_SPAWN_SCRIPT))
    result = _run([str(script)], "default", tmp_path)
    _check_route(result, "default")
    assert result["parent_launches"] == 6
    assert result["again"] == result["want"]
    items = result["items"]
    assert sorted(it["index"] for it in items) == list(range(6))
    assert {it["worker"] for it in items} == {0, 1}
    pids = {it["pid"] for it in items}
    assert len(pids) == 2 and result["pid"] not in pids
    for it in items:
        assert it["enabled"] and it["native"] == result["native"], it
        assert it["launches"] == 1, it
        assert it["sha"] == result["want"][str(it["index"])], f"item {it['index']} differs"


_FORK_SCRIPT = _CHILD_PRELUDE + """
import importlib
ITEMS = 8

def cpu_attention(i):
    gen = torch.Generator().manual_seed(100 + i)
    q, k, v = (torch.randn(1, 4, 96, 32, generator=gen) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

def gpu_attention():
    gen = torch.Generator("cuda").manual_seed(5)
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", generator=gen, dtype=torch.float16)
               for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

class CpuMath(torch.utils.data.Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        lib = importlib.import_module("aotriton_rocm")  # the library, in a forked child
        return {"index": i, "worker": torch.utils.data.get_worker_info().id, "pid": os.getpid(),
                "enabled": lib.is_enabled(), "out": cpu_attention(i)}

if __name__ == "__main__":
    aotriton_rocm.enable()
    backends.reset_launch_counts()
    first = digest(gpu_attention())
    torch.cuda.synchronize()
    torch.set_num_threads(1)  # as in DataLoader workers: the same CPU arithmetic
    want = {i: cpu_attention(i) for i in range(ITEMS)}
    loader = torch.utils.data.DataLoader(CpuMath(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", timeout=60)
    items = list(loader)
    mismatched = [it["index"] for it in items if not torch.equal(it["out"], want[it["index"]])]
    after = digest(gpu_attention())
    torch.cuda.synchronize()
    report(pid=os.getpid(), first=first, after=after, launches=counts()["attn_fwd"],
           indices=sorted(it["index"] for it in items),
           workers=sorted({it["worker"] for it in items}),
           pids=sorted({it["pid"] for it in items}),
           enabled=[it["enabled"] for it in items], mismatched=mismatched, **route_info())
"""


@pytest.mark.parametrize("child_route", ROUTES)
def test_forked_dataloader_workers_after_gpu_use(child_route, tmp_path):
    """The parent enables our implementation and runs attention on the GPU,
    then forks 2 DataLoader workers (the 'fork' context) that import
    aotriton_rocm and run CPU math-path attention. Nothing hangs (DataLoader
    and process timeouts) or crashes; the workers see the library enabled
    (inherited state) and return the parent's CPU results bit for bit; the
    parent's GPU attention afterwards is unchanged and ran on our kernel."""
    script = tmp_path / "fork_loader.py"
    script.write_text(textwrap.dedent(_FORK_SCRIPT))
    result = _run([str(script)], child_route, tmp_path)
    _check_route(result, child_route)
    assert result["indices"] == list(range(8))
    assert result["workers"] == [0, 1]
    assert len(result["pids"]) == 2 and result["pid"] not in result["pids"]
    assert all(result["enabled"])
    assert result["mismatched"] == []
    assert result["after"] == result["first"]
    assert result["launches"] == 2


# --- (5) torch.compile(fullgraph=True) on each route ----------------------------

_COMPILE_CHILD = _CHILD_PRELUDE + """
aotriton_rocm.enable()
gen = torch.Generator("cuda").manual_seed(21)
q, k, v, g = (torch.randn(2, 4, 256, 64, device="cuda", generator=gen, dtype=torch.float16)
              for _ in range(4))

def attn(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

def run(fn):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    backends.reset_launch_counts()
    out = fn(*leaves)
    out.backward(g)
    torch.cuda.synchronize()
    return [out.detach(), *(t.grad for t in leaves)], counts()

eager, eager_counts = run(attn)
compiled_fn = torch.compile(attn, fullgraph=True)
compiled, compiled_counts = run(compiled_fn)
compiled2, compiled2_counts = run(compiled_fn)
torch.save({"inputs": [q, k, v, g], "eager": eager, "compiled": compiled}, sys.argv[1])
report(eager=eager_counts, compiled=compiled_counts, compiled2=compiled2_counts,
       repeat_equal=all(torch.equal(a, b) for a, b in zip(compiled, compiled2)),
       native_launches=torch_native.launch_count("attn_fwd") if torch_native.is_active() else 0,
       **route_info())
"""


@pytest.mark.parametrize("child_route", ROUTES)
def test_torch_compile_fullgraph_on_each_route(child_route, tmp_path):
    """torch.compile(fullgraph=True) over a function calling SDPA (flash,
    causal, fp16), forward and backward, in a fresh process on each route: the
    default (the C++ extension where installed) and the Python route
    (AOTRITON_ROCM_TORCH_NATIVE=0). Eager and compiled each launch our
    forward, dK/dV and dQ kernels exactly once per call (the C++ route's
    extension counted them there); compiled outputs and gradients pass
    PyTorch's tolerance rule against the float32 math reference and are within
    that fp16 tolerance of eager; a second compiled call repeats the first bit
    for bit."""
    saved = tmp_path / "compile.pt"
    result = _run(["-c", _COMPILE_CHILD, str(saved)], child_route, tmp_path)
    _check_route(result, child_route)
    for phase in ("eager", "compiled", "compiled2"):
        for kernel in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"):
            assert result[phase][kernel] == 1, (phase, result[phase])
    if result["native"]:
        assert result["native_launches"] >= 3
    assert result["repeat_equal"]
    data = torch.load(saved, map_location="cuda")
    q, k, v, g = data["inputs"]
    golden = ref.attention(q, k, v, g, causal=True, dtype=torch.float32)
    lp = ref.attention(q, k, v, g, causal=True, dtype=torch.float16)
    for name, c, e in zip(("out", "dq", "dk", "dv"), data["compiled"], data["eager"]):
        ref.check(name, e, golden[name], lp[name], torch.float16)
        _, ref_err = ref.check(name, c, golden[name], lp[name], torch.float16)
        # PyTorch's fp16 tolerance (as ref.check computes it), applied to compiled - eager
        floor = 1e-5
        if name in ref.GRADS:
            floor = max(floor, ref.GRAD_FLOOR[torch.float16]
                        * max(1.0, golden[name].abs().max().item()) / 8)
        tol = max(floor, ref.FUDGE[name] * ref_err)
        diff = (c.double() - e.double()).abs().max().item()
        assert diff <= tol, f"{name}: compiled vs eager {diff:.3e} > {tol:.3e}"
