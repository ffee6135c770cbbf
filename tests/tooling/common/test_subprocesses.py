"""run_captured ends the child's whole process group, grandchildren too,
before an interrupt or a timeout goes on (the scratch folder the caller then
removes must not be written to any more)."""
import subprocess
import sys
import time

import pytest

from aotriton_rocm.tooling.common.subprocesses import _live_members, run_captured

WRITER = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c",
    "import time, sys\\nwhile True:\\n    open(sys.argv[1], 'a').write('x')\\n    time.sleep(0.01)",
    sys.argv[1]])
print(os.getpgrp(), flush=True)
time.sleep(60)
"""


def test_timeout_ends_the_grandchildren(tmp_path):
    mark = tmp_path / "written"
    with pytest.raises(subprocess.TimeoutExpired):
        run_captured([sys.executable, "-c", WRITER, mark], timeout=2)
    size = mark.stat().st_size
    time.sleep(0.3)
    assert mark.stat().st_size == size, "a grandchild still writes after run_captured returned"


def test_output_and_code_come_back(tmp_path):
    p = run_captured([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert p.returncode == 3 and p.stdout.split() == ["out", "err"]


def test_child_leads_its_own_group():
    import os
    p = run_captured([sys.executable, "-c", "import os; print(os.getpgrp(), os.getpid())"])
    pgrp, pid = p.stdout.split()
    assert pgrp == pid and int(pgrp) != os.getpgrp()
    assert _live_members(int(pgrp)) == 0
