# Sourced by the other scripts: creates (once) and activates the project's
# development environment .venv with the pinned compiler, torch (CPU) and the
# test and packaging tools, and installs this checkout into it (editable).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  "$py" -m venv "$venv"
fi
# Reinstall when the dependencies or the native sources (libaotriton_rocm, libaotriton_v2,
# the torch extension, and variants.toml, which the argument-slot tables come from) change.
stamp="$venv/.deps-$(cat "$root/pyproject.toml" "$root/scripts/dev-env.sh" \
  "$root"/setup.py "$root"/native/src/* "$root"/native/*.py "$root"/native/*.cmake \
  "$root"/kernels/variants.toml \
  "$root"/native/include/aotriton_rocm/* "$root"/native/cmake/* "$root"/native/pkgconfig/* \
  $(find "$root/native/aotriton_api" "$root/native/torch" -type f 2>/dev/null | sort) 2>/dev/null \
  | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "== installing dependencies into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # cyclonedx-python-lib[json-validation]: tests/tooling/package/test_sbom.py checks the SBOM against the CycloneDX schema
  "$venv/bin/python" -m pip install -q "torch==2.13.0" numpy pytest pytest-xdist hypothesis "pypiserver[passlib]" \
    "cyclonedx-python-lib[json-validation]" "ruff==0.17.6"
  "$venv/bin/python" -m pip install -q -e "$root[build]"
  rm -f "$venv"/.deps-*
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
export TRITON_DEFAULT_FP_FUSION=1
