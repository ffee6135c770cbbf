"""Post-install smoke test: ``aotriton-rocm smoke`` / ``python -m aotriton_rocm smoke``.

1. Checks every installed kernel archive (file hash against its manifest, every
   kernel's sha256) and that the GPU's arch is covered.
2. Runs ``F.scaled_dot_product_attention`` forward and backward with our
   implementation active, and judges it the way PyTorch judges a flash kernel:
   golden = math backend in float32, lp_ref = math backend in the input dtype,
   fail if max|golden - ours| > max(1e-5, fudge * max|golden - lp_ref|).
3. Proves our kernels ran by their launch counters (not torch's).

On a GPU it runs the precompiled kernels; without one it runs the same kernel
sources through Triton's interpreter on small shapes and says so. Exits
non-zero on any failure.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..core import backends, device
from ..common import gpus_present, images
from .._version import __version__
from ..common.errors import CommandError, UsageError
from ..common.files import describe_os_error
from .install_checks import check_archives, installation_rows  # noqa: F401 (smoke.check_archives)
from .torch_lib_state import DROPIN_PREFIX, loaded_aotriton

# Fudge factors of PyTorch's test_transformers for ROCm's AOTriton flash kernels.
FUDGE = {"out": 6.0, "dq": 360.0, "dk": 45.0, "dv": 6.0}
ABS_FLOOR = 1e-5


def tolerance(name: str, reference_error: float) -> float:
    """PyTorch's tolerance model: the error allowed on output ``name`` given
    the error of the same math in the input dtype against the golden."""
    return max(ABS_FLOOR, FUDGE[name] * reference_error)


@dataclasses.dataclass
class Case:
    dtype: torch.dtype
    head_dim: int
    causal: bool
    seqlen: int
    batch: int = 2
    heads: int = 4
    scale: float | None = None

    def label(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return (f"{dt} d{self.head_dim} {'causal' if self.causal else 'full'} "
                f"B{self.batch} H{self.heads} S{self.seqlen}")


@dataclasses.dataclass
class Result:
    case: str
    backend: str
    errors: dict
    tolerances: dict
    our_launches: int
    passed: bool
    note: str = ""


def _sdpa(q, k, v, causal, scale, backend):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def _forward_backward(q, k, v, grad, causal, scale, backend):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = _sdpa(q, k, v, causal, scale, backend)
    out.backward(grad)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def run_case(case: Case, dev: torch.device, generator: torch.Generator,
             through: str | None = None) -> Result:
    """One case on torch's flash backend with ours enabled, or, with
    ``through`` (the name of what torch runs, e.g. our libaotriton_v2 in place
    of torch's own), before enabling ours: then launches are not counted."""
    shape = (case.batch, case.heads, case.seqlen, case.head_dim)

    def rand():
        return torch.randn(shape, generator=generator, device=dev, dtype=torch.float32)

    q, k, v, grad = rand(), rand(), rand(), rand()
    low = [t.to(case.dtype) for t in (q, k, v, grad)]
    golden = _forward_backward(*(t.to(case.dtype).float() for t in (q, k, v, grad)),
                               case.causal, case.scale, SDPBackend.MATH)
    lp_ref = _forward_backward(*low, case.causal, case.scale, SDPBackend.MATH)
    backends.reset_launch_counts()
    ours = _forward_backward(*low, case.causal, case.scale, SDPBackend.FLASH_ATTENTION)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    counts = backends.launch_counts()
    ran = {kernel for (_, kernel), n in counts.items() if n > 0}
    backend_names = sorted({name for (name, _), n in counts.items() if n > 0})

    errors, tols, passed = {}, {}, True
    for name in ("out", "dq", "dk", "dv"):
        g = golden[name]
        test = ours[name].float()
        ref_err = (g - lp_ref[name].float()).abs().max().item()
        err = (g - test).abs().max().item()
        tol = tolerance(name, ref_err)
        nan_bad = bool(torch.isnan(test).any() and not torch.isnan(g).any())
        errors[name], tols[name] = err, tol
        passed &= (err <= tol) and not nan_bad
    note = ""
    if through:
        return Result(case.label(), through, errors, tols, 0, passed, note)
    missing = kernels_not_launched(ran)
    if missing:
        passed = False
        note = f"torch's kernel ran, not ours (no launches of {', '.join(sorted(missing))})"
    return Result(case.label(), ",".join(backend_names) or "torch", errors, tols,
                  sum(counts.values()), passed, note)


def kernels_not_launched(ran: set) -> set:
    """Our kernels a forward + backward needs that did not launch: the
    forward, the backward's preprocess and one of its routes (dK/dV + dQ, or
    the fused one where the image has it)."""
    split = set(backends.KERNELS) - ran
    fused = {"attn_fwd", "attn_bwd_preprocess", *backends.FUSED_BACKWARD_KERNELS} - ran
    return min(split, fused, key=len)


def gpu_cases(quick: bool = False) -> list[Case]:
    seqlens = (1, 127, 1024) if quick else (1, 127, 1024, 4096)
    return [Case(dtype, d, causal, s)
            for dtype in (torch.float16, torch.bfloat16)
            for d in (64, 128)
            for causal in (False, True)
            for s in seqlens]


def cpu_cases(quick: bool = False) -> list[Case]:
    cases = [Case(torch.float16, 64, False, 17, batch=1, heads=2),
             Case(torch.bfloat16, 64, True, 33, batch=1, heads=2),
             Case(torch.float16, 128, True, 1, batch=1, heads=1),
             Case(torch.bfloat16, 128, False, 70, batch=1, heads=1, scale=0.05)]
    return cases[:2] if quick else cases


def _print_row(cols, widths):
    print("  ".join(str(c).ljust(w) for c, w in zip(cols, widths)), flush=True)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One option of the ``smoke`` command (its parser is built from these;
    the runtime wheel's abi.json records them as public API)."""
    name: str
    help: str
    takes_value: bool = True
    choices: tuple | None = None
    default: object = None
    metavar: str | None = None


SMOKE_FLAGS = (
    Flag("--device", "gpu: precompiled kernels; cpu: kernel sources in Triton's interpreter; "
         "auto: gpu if one is visible", choices=("auto", "gpu", "cpu"), default="auto"),
    Flag("--quick", "fewer, smaller cases", takes_value=False),
    Flag("--json", "also write the results as JSON", metavar="FILE"),
    Flag("--no-images-ok", "on the CPU, pass although no kernel image is installed (only the "
         "kernel sources are then checked); without it that is a failure", takes_value=False),
)


@dataclasses.dataclass(frozen=True)
class SmokeOptions:
    device: str = "auto"
    quick: bool = False
    json: str | None = None
    no_images_ok: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SmokeOptions":
        return cls(device=args.device, quick=args.quick, json=args.json,
                   no_images_ok=args.no_images_ok)


def add_smoke_arguments(parser: argparse.ArgumentParser) -> None:
    for f in SMOKE_FLAGS:
        if f.takes_value:
            parser.add_argument(f.name, choices=f.choices, default=f.default, metavar=f.metavar,
                                help=f.help)
        else:
            parser.add_argument(f.name, action="store_true", help=f.help)


def _gpu_route() -> str:
    """Which code serves GPU calls: every GPU launch goes through
    libaotriton_rocm, whose launch counters the cases read."""
    from ..core import native, torch_native

    try:
        lib = native.library()
    except OSError as e:
        return f"libaotriton_rocm unavailable ({e}): every case will fall back to torch"
    caller = ("C++ overrides (libaotriton_rocm_torch, torch's stable ABI)"
              if torch_native.is_active() else "Python overrides")
    return f"{caller} -> libaotriton_rocm {lib.aotr_version().decode()} ({native.library_path()})"


def run_smoke(args: SmokeOptions) -> int:
    """Run the checks and cases; 0 when all passed, 1 otherwise."""
    from ..integrations import torch_integration

    if args.json:
        _check_json_target(args.json)
    use_gpu = args.device == "gpu" or (args.device == "auto" and device.gpu_available())
    if use_gpu and not device.gpu_available():
        raise UsageError("--device gpu but torch sees no GPU")
    arch = device.arch_of(torch.cuda.current_device()) if use_gpu else None
    print(f"aotriton-rocm {__version__} smoke | torch {torch.__version__} | "
          + (f"GPU {torch.cuda.get_device_name()} ({arch}): precompiled kernels" if use_gpu else
             "no GPU: kernel sources run by Triton's interpreter on the CPU "
             "(no code object is executed)"), flush=True)
    print("\n".join(gpus_present.report_lines(images.find_archives())), flush=True)

    archive_rows = installation_rows(arch)
    if not images.find_archives() and not images.missing_images() and not use_gpu:
        where = "; ".join(images.search_notes()) or "no archive directory, image wheel or conda share"
        if args.no_images_ok:
            archive_rows.append(("kernel images", True,
                                 "none installed: no precompiled archive was checked, only the "
                                 "kernel sources (--no-images-ok)"))
        else:
            archive_rows.append(("kernel images", False,
                                 f"none installed, so no precompiled archive was checked (looked "
                                 f"at: {where}). Install one (pip install 'aotriton-rocm[gfx942]', "
                                 f"for example), or pass --no-images-ok to check the kernel sources "
                                 f"only"))
    archive_failures = 0
    for what, ok, detail in archive_rows:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {detail}", flush=True)
        archive_failures += not ok
    if use_gpu and archive_failures:
        print(f"0 passed, {archive_failures} failed: smoke FAILED before running attention (fix "
              f"the installation first)")
        return 1
    failures = archive_failures

    aotriton = loaded_aotriton()
    print(f"AOTriton library of torch: {aotriton}", flush=True)
    dropin_results = []
    if use_gpu and aotriton.startswith(DROPIN_PREFIX):
        # torch's own flash backend, ours not enabled: it calls the drop-in
        dropin_results = [run_case(c, torch.device("cuda"), torch.Generator(device="cuda").manual_seed(1),
                                   through="torch -> libaotriton_v2 (ours)")
                          for c in gpu_cases(quick=True)]

    torch_integration.enable(cpu_interpreter=not use_gpu)
    if use_gpu:
        print(f"route: {_gpu_route()}", flush=True)
    dev = torch.device("cuda" if use_gpu else "cpu")
    cases = gpu_cases(args.quick) if use_gpu else cpu_cases(args.quick)
    gen = torch.Generator(device=dev).manual_seed(0)
    widths = (34, 16, 22, 22, 22, 22, 7)
    _print_row(("case", "backend", "out err/tol", "dq err/tol", "dk err/tol", "dv err/tol",
                "verdict"), widths)
    results = []
    start = time.time()

    def report(r: Result) -> None:
        results.append(r)
        cols = [r.case, r.backend]
        for name in ("out", "dq", "dk", "dv"):
            cols.append(f"{r.errors[name]:.2e}/{r.tolerances[name]:.2e}"
                        if name in r.errors else "-")
        cols.append("PASS" if r.passed else "FAIL")
        _print_row(cols, widths)
        if r.note:
            print(f"    {r.note}", flush=True)

    for r in dropin_results:
        report(r)
        failures += not r.passed
    try:
        for case in cases:
            try:
                r = run_case(case, dev, gen)
            except Exception as exc:  # noqa: BLE001 - a crash is a failed case, reported
                r = Result(case.label(), "?", {}, {}, 0, False, f"error: {exc!r}")
            report(r)
            failures += not r.passed
    finally:
        torch_integration.disable()
    n_failed = sum(not r.passed for r in results) + archive_failures
    n_passed = len(results) - sum(not r.passed for r in results)
    print(f"{n_passed} passed, {n_failed} failed "
          + (f"({archive_failures} of them installation checks) " if archive_failures else "")
          + f"({time.time() - start:.1f} s, {'gpu' if use_gpu else 'cpu interpreter'})")
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump({"version": __version__, "arch": arch, "gpu": use_gpu,
                           "archives": archive_rows,
                           "cases": [dataclasses.asdict(r) for r in results]}, f, indent=1)
        except OSError as e:
            raise CommandError(f"cannot write --json {args.json} ({describe_os_error(e)}); the "
                               f"results are printed above") from None
    return 1 if failures else 0


def _check_json_target(path: str) -> None:
    """Refuse a --json file that cannot be written before anything runs."""
    import os

    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    if os.path.isdir(target):
        raise UsageError(f"--json {path} is a directory: name a file, e.g. {path}/smoke.json")
    if not os.path.isdir(parent):
        raise UsageError(f"--json {path}: the directory {parent} does not exist: create it or "
                         f"name a file in an existing directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(target)
                                                    and not os.access(target, os.W_OK)):
        where = target if os.path.exists(target) else parent
        raise UsageError(f"--json {path}: cannot write {where} (permission denied or a read-only "
                         f"file system): name a writable file")


if __name__ == "__main__":  # python -m aotriton_rocm.commands.smoke: the same as `aotriton-rocm smoke`
    sys.exit(importlib.import_module("aotriton_rocm.commands.cli").main(["smoke", *sys.argv[1:]]))
