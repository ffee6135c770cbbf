"""One attention pass run for some seconds per backend while nvidia-smi
samples the board's power draw and SM clock: whether a ratio of
bench_attention.py's table is set by the kernels or by the power cap.

    python benchmarks/sustained_power.py [--dtype bf16] [--head-dim 128] [--seqlen 16384]
                                         [--causal] [--pass bwd] [--seconds 3] [--json FILE]

For each backend it prints the time per call, the mean and range of power
and SM clock (from half a second in, once the clocks have settled), and
nvidia-smi's clock-event reasons (0x4: the software power cap). A backend
whose clock sits below the others' at the same power spends more energy per
second of work; at the cap that decides its sustained speed. NVIDIA GPUs
only; on a machine with several, the samples are those of torch's current
device.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_attention import (add_one_shape_arguments, make_inputs, one_shape, pass_fns,  # noqa: E402
                             refusal_text, sdpa_call, sdpa_on, shape_text)

SAMPLE_MS = 100
FIELDS = "timestamp,uuid,power.draw,clocks.sm,clocks_event_reasons.active"


def run_for(fn, seconds: float) -> tuple[float, float]:
    """(epoch time the timed calls began, ms per call) of fn called in groups
    of four between synchronisations for ``seconds``, after one untimed call
    (which may plan or compile)."""
    fn()
    torch.cuda.synchronize()
    began, start, calls = time.time(), time.monotonic(), 0
    while time.monotonic() - start < seconds:
        for _ in range(4):
            fn()
        calls += 4
        torch.cuda.synchronize()
    return began, 1e3 * (time.monotonic() - start) / calls


def _gpu_id(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def read_samples(log: Path, uuid: str = "") -> list[tuple[float, float, float, str]]:
    """(epoch seconds, watts, MHz, reasons) of nvidia-smi's samples of the GPU
    of that uuid (every sample where the log has one GPU only), samples
    without a power reading left out."""
    lines = [[x.strip() for x in line.split(",")] for line in log.read_text().splitlines() if line.strip()]
    gpus = {_gpu_id(fields[1]) for fields in lines}
    samples = []
    for stamp, gpu, watts, mhz, reasons in lines:
        mine = len(gpus) == 1 or _gpu_id(gpu) == _gpu_id(uuid)
        if mine and watts.split()[0].replace(".", "").isdigit():
            when = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((when, float(watts.split()[0]), float(mhz.split()[0]), reasons))
    return samples


def samples_between(samples, t0: float, t1: float) -> list[tuple[float, float, str]]:
    """(watts, MHz, reasons) of the samples taken in [t0, t1]."""
    return [(watts, mhz, reasons) for when, watts, mhz, reasons in samples if t0 <= when <= t1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_one_shape_arguments(parser)
    parser.add_argument("--seconds", type=float, default=3.0, help="run time per backend (at least 2)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        print("sustained_power needs an NVIDIA GPU and nvidia-smi on PATH", file=sys.stderr)
        return 2
    seconds = max(args.seconds, 2.0)
    shape = one_shape(args)
    q, k, v, grad = make_inputs(shape)
    report = {"gpu": torch.cuda.get_device_name(), "shape": asdict(shape), "pass": args.pass_name,
              "seconds": seconds, "backends": {}}
    print(f"{report['gpu']}: {shape_text(report['shape'])}, {args.pass_name}, {seconds:g} s per backend")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "smi.csv"
        with log.open("w") as out:
            smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader",
                                    f"--loop-ms={SAMPLE_MS}"], stdout=out, stderr=subprocess.DEVNULL)
            try:
                spans = {}
                for peer in args.peers.split(","):
                    try:
                        with sdpa_on(peer):
                            fn = pass_fns(sdpa_call(shape), q, k, v, grad)[args.pass_name]
                            time.sleep(1.0)  # the same idle second before every backend
                            began, ms = run_for(fn, seconds)
                            spans[peer] = (began + 0.5, time.time(), ms)
                    except RuntimeError as exc:  # a backend that refuses the shape
                        print(f"{peer}: {refusal_text(exc)}")
                time.sleep(2 * SAMPLE_MS / 1e3)
            finally:
                smi.terminate()
                smi.wait()
        samples = read_samples(log, str(getattr(torch.cuda.get_device_properties(), "uuid", "")))
        for peer, (t0, t1, ms) in spans.items():
            rows = samples_between(samples, t0, t1)
            if not rows:
                print(f"{peer}: no nvidia-smi samples in its run")
                continue
            watts, mhz = [r[0] for r in rows], [r[1] for r in rows]
            entry = {"ms": ms, "watts_mean": statistics.fmean(watts),
                     "watts_range": [min(watts), max(watts)], "sm_mhz_mean": statistics.fmean(mhz),
                     "sm_mhz_range": [min(mhz), max(mhz)], "clock_event_reasons": sorted({r[2] for r in rows})}
            report["backends"][peer] = entry
            print(f"{peer:14s} {ms:8.3f} ms/call  "
                  f"{entry['watts_mean']:.0f} W ({min(watts):.0f}-{max(watts):.0f})  "
                  f"SM {entry['sm_mhz_mean']:.0f} MHz ({min(mhz):.0f}-{max(mhz):.0f})  "
                  f"reasons {' '.join(entry['clock_event_reasons'])}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
