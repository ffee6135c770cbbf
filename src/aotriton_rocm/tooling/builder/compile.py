"""Build stage 2, compile: every task of a plan to a code object, from the
content-addressed cache (``OUT/cache``) or compiled there: on a local pool
of fresh worker processes, or on a Dask cluster (dask_executor.py).
Build-time only.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection as mp_connection
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, TextIO, Tuple

from .plan import BuildError, BuildPlan
from .cache import CompileCache
from .triton_compile import CompileOutput, CompileTask, compile_variant, pool_worker_init, scrubbed_env_names
from .dask_executor import EXECUTORS, ExecutorError
from ..common.progress import Progress

__all__ = ["Executor", "Compiled", "load_cached", "compile_plan", "require_cached",
           "TRITON_CACHE_PREFIX", "stop_children"]


@dataclass(frozen=True)
class Executor:
    """Where compiles run: ``local`` (a process pool, ``jobs`` workers; None:
    one per core), ``dask`` (a running scheduler, ``scheduler``) or
    ``dask-local`` (a LocalCluster on 127.0.0.1)."""
    kind: str = "local"
    scheduler: Optional[str] = None
    jobs: Optional[int] = None

    def check(self) -> None:
        """Refuse a bad combination before anything is compiled."""
        if self.kind not in EXECUTORS:
            raise ExecutorError(f"unknown executor {self.kind!r}; valid: {', '.join(EXECUTORS)}")
        if self.kind == "dask" and not self.scheduler:
            raise ExecutorError("--executor dask needs --scheduler tcp://HOST:PORT "
                                "(or use --executor dask-local for a cluster on this machine)")
        if self.kind != "dask" and self.scheduler:
            raise ExecutorError(f"--scheduler is only used with --executor dask (got --executor {self.kind})")
        if self.jobs is not None and int(self.jobs) < 1:
            raise ValueError(f"jobs={self.jobs}: need 1 or more compile processes (None: one per core)")
        if self.kind.startswith("dask"):
            from .dask_executor import require_distributed
            require_distributed()

    @property
    def workers(self) -> int:
        return int(self.jobs) if self.jobs else _default_jobs()


@dataclass
class Compiled:
    """Code objects by cache key (``(meta, code)``), which were compiled now
    (the rest came from the cache), compile seconds per arch, and one line
    per compile that failed."""
    results: Dict[str, Tuple[Dict[str, Any], bytes]] = field(default_factory=dict)
    compiled_keys: Set[str] = field(default_factory=set)
    seconds: Dict[str, float] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)


def load_cached(plan: BuildPlan, cache: CompileCache) -> Tuple[Compiled, List[CompileTask]]:
    """What the cache already holds, and the tasks it does not (the misses)."""
    compiled = Compiled(seconds={a.name: 0.0 for a in plan.archs})
    misses: List[CompileTask] = []
    for task in plan.unique_tasks():
        hit = cache.get(task.cache_key)
        if hit is not None:
            compiled.results[task.cache_key] = hit
        else:
            misses.append(task)
    return compiled, misses


def require_cached(plan: BuildPlan, cache: CompileCache) -> Compiled:
    """The stage merge uses instead of compiling: every code object must be
    in ``cache`` already (BuildError otherwise)."""
    compiled, misses = load_cached(plan, cache)
    if misses:
        raise BuildError(f"{len(misses)} code object(s) are in none of the shard outputs, e.g. "
                         f"{misses[0].arch} {misses[0].variant_key}; no archive written")
    return compiled


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _compile_in_child(conn, task: CompileTask, triton_cache: str) -> None:
    """A compile worker: one task, its result sent back, then the process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends its workers on Ctrl-C
    pool_worker_init(triton_cache)
    try:
        res = compile_variant(task)
    except BaseException as e:  # noqa: BLE001 - reported as the task's failure
        res = CompileOutput(task.cache_key, task.variant_key, task.arch, error=f"worker failed: {e!r}")
    conn.send(res)
    conn.close()


def _start_child(ctx, task: CompileTask, triton_cache: str):
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_compile_in_child, args=(send, task, triton_cache), daemon=True)
    # SIGINT blocked while the child starts: it begins life with SIGINT
    # blocked (the mask survives exec), so a Ctrl-C sent to the whole process
    # group cannot kill it half-started with a traceback; the parent gets the
    # signal once it is unblocked and ends its workers itself.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    send.close()
    return proc, recv


def stop_children(procs, grace: float = 3.0) -> None:
    """End worker processes now: SIGTERM, then SIGKILL for any still there
    after ``grace`` seconds; every one is reaped."""
    # a second Ctrl-C (or SIGTERM) waits until every worker is gone
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        procs = [p for p in procs if p.is_alive()]
        for p in procs:
            p.terminate()
        deadline = time.monotonic() + grace
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _iter_compile_local(misses: Sequence[CompileTask], n_jobs: int, triton_cache: str):
    """Compile on local worker processes; yields (task, output) as they finish.

    One compile per worker process, each a fresh ``spawn``: a code object
    depends on what the process compiled before it (LLVM/Triton state
    carried across compiles gave the same gfx942 dK/dV kernel 3 register
    allocations; in a fresh process it is the same every time), so reused
    workers made cold builds differ with the order tasks reached them. The
    workers are plain processes with a pipe each (no executor, no queue
    threads, no resource tracker): on Ctrl-C, SIGTERM or any error they are
    terminated and reaped at once (a ProcessPoolExecutor with
    max_tasks_per_child=1 hung in its shutdown instead on Python 3.11, likely
    CPython gh-119592)."""
    ctx = multiprocessing.get_context("spawn")
    # Workers never need torch, the bulk of a fresh worker's start-up time.
    no_torch = os.environ.get("AOTRITON_ROCM_NO_TORCH")
    os.environ["AOTRITON_ROCM_NO_TORCH"] = "1"
    pending = list(misses)
    running: Dict[Any, Tuple[Any, CompileTask]] = {}
    try:
        while pending or running:
            while pending and len(running) < n_jobs:
                task = pending.pop(0)
                proc, conn = _start_child(ctx, task, triton_cache)
                running[conn] = (proc, task)
            for conn in mp_connection.wait(list(running)):
                proc, task = running.pop(conn)
                try:
                    res: CompileOutput = conn.recv()
                except (EOFError, OSError):  # died before answering (e.g. killed for memory)
                    proc.join()
                    res = CompileOutput(task.cache_key, task.variant_key, task.arch,
                                        error=f"worker failed: exit code {proc.exitcode}")
                conn.close()
                proc.join()
                yield task, res
    finally:
        stop_children([proc for proc, _ in running.values()])
        for conn in running:
            conn.close()
        if no_torch is None:
            os.environ.pop("AOTRITON_ROCM_NO_TORCH", None)
        else:
            os.environ["AOTRITON_ROCM_NO_TORCH"] = no_torch


TRITON_CACHE_PREFIX = "triton-cache-"


def compile_plan(plan: BuildPlan, cache: CompileCache, out: Path, executor: Executor, *,
                 progress: bool = True, stream: Optional[TextIO] = None,
                 triton_cache: Optional[Path] = None) -> Compiled:
    """Compile the cache misses of ``plan`` into ``cache`` (scratch under
    ``OUT/.tmp``), reporting on ``stream`` (default: stderr). Triton's own
    cache is scratch too, unless ``triton_cache`` names one to keep (the
    tuner loads the compiled kernels from it to launch them)."""
    compiled, misses = load_cached(plan, cache)
    progress = Progress(len(misses), desc="compile", stream=stream if stream is not None else sys.stderr,
                        enabled=progress)
    for arch, items in plan.items.items():
        n_miss = sum(1 for _, t in items if t.cache_key not in compiled.results)
        progress.write(f"{arch}: {len(items)} variants, {len(items) - n_miss} cached, {n_miss} to compile")
    ignored = scrubbed_env_names()
    if ignored and misses:
        progress.write(f"note: ignoring {', '.join(ignored)} while compiling (they change code generation)")
    if not misses:
        progress.close()
        return compiled
    tmp_root = out / ".tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    # the pid in the name lets the next run remove it if this one is killed
    keep_triton_cache = triton_cache is not None
    if keep_triton_cache:
        Path(triton_cache).mkdir(parents=True, exist_ok=True)
        triton_cache = str(triton_cache)
    else:
        triton_cache = tempfile.mkdtemp(prefix=f"{TRITON_CACHE_PREFIX}{os.getpid()}-", dir=tmp_root)
    n_jobs = executor.workers
    if executor.kind == "local":
        outputs = _iter_compile_local(misses, n_jobs, triton_cache)
    else:
        from .dask_executor import iter_compile_dask
        outputs = iter_compile_dask(misses, kernels_dir=plan.sources.kernels_dir,
                                    sources_hash=plan.sources_hash,
                                    scheduler=executor.scheduler if executor.kind == "dask" else None,
                                    local_workers=min(n_jobs, len(misses)), log=progress.write)
    try:
        for t, res in outputs:
            compiled.seconds[t.arch] += res.seconds
            if res.error:
                first = res.error.strip().splitlines()[0]
                compiled.errors.append(f"{t.arch} {t.variant_key}: compile failed: {first}")
                progress.write(f"error: {t.arch} {t.variant_key}: compile failed:\n{res.error.rstrip()}")
            else:
                # Same key order as a cache hit, so archives are byte-identical
                # whether their kernels were compiled or cached.
                meta = json.loads(json.dumps(dict(res.meta, compile_seconds=round(res.seconds, 3)),
                                             sort_keys=True))
                cache.put(t.cache_key, meta, res.code)
                compiled.results[t.cache_key] = (meta, res.code)
                compiled.compiled_keys.add(t.cache_key)
            progress.update(1, label=f"{t.arch} {t.variant_key}")
    finally:
        close = getattr(outputs, "close", None)
        if close is not None:
            close()
        progress.close()
        if not keep_triton_cache:
            shutil.rmtree(triton_cache, ignore_errors=True)
        try:
            tmp_root.rmdir()
        except OSError:
            pass
    return compiled
