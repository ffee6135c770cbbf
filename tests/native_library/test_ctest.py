"""The C unit tests of native/ (json, sha256, driver) through ctest."""
import shutil
import subprocess


def test_ctest_passes(native_build, native_env):
    ctest = shutil.which("ctest")
    assert ctest, "ctest comes with cmake"
    r = subprocess.run([ctest, "--output-on-failure"], cwd=native_build, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "100% tests passed" in r.stdout
