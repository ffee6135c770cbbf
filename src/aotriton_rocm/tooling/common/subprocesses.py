"""Running a tool as a child whose whole process group ends with the caller's
interest in it.

``subprocess.run`` kills only the child on Ctrl-C or SIGTERM. A build tool's
own children (the build backend, its compilers, pip) then keep writing into
the scratch folder the caller is removing, and the folder survives the
interrupt. Here the child leads a process group of its own, and every way
out of the wait ends and reaps that group first.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

__all__ = ["run_captured"]

#: How long the group gets to exit on SIGTERM before SIGKILL.
GRACE_S = 3.0


def run_captured(cmd: Sequence[Union[str, os.PathLike]], *, cwd: Optional[Path] = None,
                 env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                 text: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` with stdout and stderr merged into ``.stdout``. Raises
    ``OSError`` if it cannot start and ``subprocess.TimeoutExpired`` past
    ``timeout``; its return code is the caller's to judge."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=text, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        _end_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _live_members(pgid: int) -> int:
    """Processes of group ``pgid`` that are not zombies (grandchildren that
    init has not reaped yet still answer signals, so ``killpg`` cannot tell)."""
    n = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            n += 1
    return n


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the group, SIGKILL to whatever is left after the grace
    period, then wait for the leader and (briefly) for the group to empty."""
    pgid = proc.pid
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        deadline = time.monotonic() + GRACE_S
        while _live_members(pgid) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGKILL)
            time.sleep(0.02)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
