"""The native sources meet their .clang-format (native/.clang-format, and
native/aotriton_api/'s own): `clang-format --dry-run --Werror` finds nothing
to change. Skipped where clang-format is not installed (CI installs it:
ci/setup-host.sh)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_native_sources_meet_their_clang_format():
    tool = shutil.which("clang-format")
    if tool is None:
        pytest.skip("clang-format is not installed (apt-get install clang-format)")
    files = subprocess.run(["git", "ls-files", "native/*.c", "native/*.h", "native/*.cpp"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert len(files) > 30
    run = subprocess.run([tool, "--dry-run", "--Werror", *files], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, ("run `clang-format -i` on the native files it names:\n"
                                 + run.stderr[-4000:])
