"""Distributed compile executor on Dask ``distributed``. Build-time only.

Why Dask and not Ray: a compile is one plain function call on picklable
arguments that returns bytes, so all the build needs is "run this function on
some worker and give me the result as it finishes" -- Dask futures exactly.
``distributed`` is pure Python (a few MB with its dependencies, no compiled
core, wheels for every Python triton supports), a cluster is one
``dask scheduler`` plus ``dask worker`` processes, and ``LocalCluster`` binds
to 127.0.0.1, which is how it is tested here. Ray brings a large native
runtime (raylet, GCS, object store) and actor machinery the build has no use
for.

Workers need no checkout: the client ships the kernel sources (every
``*.py`` under ``kernels/``, the same files the cache key hashes) once to
every worker, which writes them to a temp directory named by their hash.
Code objects do not depend on that path (compiles run without line info, see
``compile.COMPILE_ENV``), so a distributed build equals a local one byte for
byte. Each worker process scrubs the codegen-affecting environment once, like
the local pool's workers. Start workers with one thread each
(``dask worker tcp://HOST:8786 --nthreads 1 --nworkers N``): triton compiles
are CPU bound and not meant to share a process.

``distributed`` is optional (the ``build`` extra installs it); without it
``--executor dask`` fails with a message saying what to install.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence, Tuple

from ...common.errors import UsageError
from .triton_compile import CompileOutput, CompileTask, compile_variant, worker_init

__all__ = ["ExecutorError", "EXECUTORS", "iter_compile_dask", "kernel_sources", "require_distributed"]

EXECUTORS = ("local", "dask", "dask-local")


class ExecutorError(UsageError, RuntimeError):
    """The requested executor cannot be used (not installed, bad arguments)."""


def require_distributed():
    try:
        import distributed  # noqa: F401
    except ImportError as e:
        raise ExecutorError(
            f"--executor dask needs Dask's distributed package, which is not importable ({e}); "
            f"install it with: pip install 'aotriton-rocm[build]' (or pip install distributed), "
            f"or use --executor local") from None
    return distributed


def kernel_sources(kernels_dir) -> Dict[str, bytes]:
    """Every ``*.py`` under ``kernels_dir`` by relative POSIX path (what the
    sources hash covers)."""
    kd = Path(kernels_dir)
    return {p.relative_to(kd).as_posix(): p.read_bytes()
            for p in sorted(kd.rglob("*.py")) if "__pycache__" not in p.parts}


# -- worker side -----------------------------------------------------------

_worker_state: Dict[str, str] = {}


def _materialize(sources_hash: str, sources: Dict[str, bytes]) -> str:
    """The kernel sources in a per-hash directory on this worker (once)."""
    base = Path(tempfile.gettempdir()) / f"aotriton-rocm-kernels-{os.getuid()}"
    final = base / sources_hash[:16]
    if not final.is_dir():
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=base))
        for rel, data in sources.items():
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        try:
            os.rename(tmp, final)
        except OSError:  # another process on this host got there first
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    return str(final)


def compile_on_worker(task: CompileTask, sources_hash: str, sources: Dict[str, bytes]) -> CompileOutput:
    """Run one compile on a Dask worker (called through ``client.submit``)."""
    import dataclasses

    if "triton_cache" not in _worker_state:
        cache_dir = tempfile.mkdtemp(prefix="aotriton-rocm-triton-cache-")
        worker_init(cache_dir)  # scrub codegen env vars, pin COMPILE_ENV
        _worker_state["triton_cache"] = cache_dir
    kd = _worker_state.get(sources_hash)
    if kd is None:
        kd = _worker_state[sources_hash] = _materialize(sources_hash, sources)
    return compile_variant(dataclasses.replace(task, kernels_dir=kd))


# -- client side -----------------------------------------------------------

def iter_compile_dask(tasks: Sequence[CompileTask], *, kernels_dir, sources_hash: str,
                      scheduler: Optional[str] = None, local_workers: int = 2,
                      log=None) -> Iterator[Tuple[CompileTask, CompileOutput]]:
    """Compile ``tasks`` on a Dask cluster; yields (task, output) as they finish.

    ``scheduler``: ``tcp://HOST:PORT`` of a running scheduler; None starts a
    ``LocalCluster`` on 127.0.0.1 with ``local_workers`` single-threaded
    worker processes (torn down afterwards).
    """
    distributed = require_distributed()
    cluster = None
    if scheduler is None:
        cluster = distributed.LocalCluster(n_workers=max(1, local_workers), threads_per_worker=1,
                                           processes=True, host="127.0.0.1", dashboard_address=None)
        address = cluster.scheduler_address
    else:
        address = scheduler
    if log:
        log(f"dask: {len(tasks)} compile(s) on {address}" + (" (local cluster)" if cluster else ""))
    try:
        client = distributed.Client(address, timeout="30s")
    except (OSError, TimeoutError) as e:
        if cluster is not None:
            cluster.close()
        raise ExecutorError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    try:
        [sources] = client.scatter([kernel_sources(kernels_dir)], broadcast=True, hash=False)
        futs = {client.submit(compile_on_worker, t, sources_hash, sources, key=f"aotr-compile-{t.cache_key}",
                              pure=False): t for t in tasks}
        for fut in distributed.as_completed(list(futs)):
            t = futs[fut]
            try:
                res = fut.result()
            except Exception as e:  # worker lost, (de)serialization failure, ...
                res = CompileOutput(t.cache_key, t.variant_key, t.arch, error=f"dask worker failed: {e!r}")
            yield t, res
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
