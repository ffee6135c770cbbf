"""The upload gates of ``aotriton-rocm release``: credentials, then (with
``--publish``) ``twine upload`` per target and the conda packages into the
channel; a dry run says what it would upload."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

from ...common.files import atomic_copy
from .credentials import Credentials, find_credentials
from .gates import Context, GateFailed, GateSkipped
from .matrix import Target

__all__ = ["gate_credentials", "gate_publish", "gate_publish_conda", "twine_upload", "copy_to_channel"]


def gate_credentials(ctx: Context) -> str:
    if not any(_uploads(t) for t in ctx.targets):
        raise GateSkipped("no wheels to upload")
    creds, why_not = find_credentials(ctx.args.index_url or ctx.args.rocm_index_url)
    if creds is None:
        raise GateFailed(f"no upload credentials: {why_not}")
    ctx.credentials = creds
    return creds.source  # where they came from, never what they are


def _uploads(t: Target) -> List[Path]:
    return sorted(t.dist.glob("*.whl")) + sorted(t.dist.glob("*.tar.gz"))


def twine_upload(files: List[Path], index_url: str, credentials: Credentials) -> Tuple[int, str]:
    """``twine upload``, the credentials in its environment (never on its
    command line), no keyring lookups of its own."""
    env = dict(os.environ)
    env.update(credentials.env())
    env["PYTHON_KEYRING_BACKEND"] = "keyring.backends.null.Keyring"
    proc = subprocess.run([sys.executable, "-m", "twine", "upload", "--non-interactive",
                           "--disable-progress-bar", "--repository-url", index_url,
                           *map(str, files)], capture_output=True, text=True, timeout=1800, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def copy_to_channel(condas: List[Path], channel: Path) -> List[Path]:
    from ..package.conda import index_channel

    for src in condas:
        dst = channel / src.parent.name / src.name
        if dst.exists():
            raise GateFailed(f"{dst} already exists in the channel: a published package is never "
                             "replaced (release a new version)")
    copied = [atomic_copy(src, channel / src.parent.name / src.name) for src in condas]
    index_channel(channel)
    return copied


def gate_publish(ctx: Context, t: Target) -> str:
    files = _uploads(t)
    if not files:
        raise GateSkipped("nothing to upload")
    where = t.index_url or "(no --index-url)"
    if not ctx.args.publish:
        raise GateSkipped(f"dry run: would upload {len(files)} file(s) to {where}")
    if not t.index_url:
        raise GateFailed(f"--publish needs --index-url for the {t.name} wheels")
    assert ctx.credentials is not None
    rc, out = twine_upload(files, t.index_url, ctx.credentials)
    if rc != 0:
        raise GateFailed(f"twine upload to {t.index_url} failed:\n"
                         + "\n".join(out.strip().splitlines()[-10:]))
    ctx.uploaded.append(f"{len(files)} file(s) to {t.index_url}")
    return f"uploaded {len(files)} file(s) to {t.index_url}"


def gate_publish_conda(ctx: Context) -> str:
    condas = [c for t in ctx.targets if t.conda for c in sorted(t.dist.glob("conda/*/*.conda"))]
    if not condas:
        raise GateSkipped("no conda packages")
    channel = ctx.args.channel
    if not ctx.args.publish:
        raise GateSkipped(f"dry run: would add {len(condas)} conda package(s) to "
                          f"{channel or '(no --channel)'}")
    if not channel:
        raise GateFailed("--publish needs --channel for the conda packages")
    copied = copy_to_channel(condas, channel)
    ctx.uploaded.append(f"{len(copied)} conda package(s) to {channel}")
    return f"{len(copied)} conda package(s) into {channel} (indexed)"
