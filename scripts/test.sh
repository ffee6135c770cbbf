#!/usr/bin/env bash
# The test suite (CPU only; GPU tests skip without a GPU). Extra args go to pytest.
set -euo pipefail
source "$(dirname "$0")/dev-env.sh"
cd "$root"
# Repeated native builds (runtime wheels, CMake consumers) through ccache
# when it is installed (CI's ci/setup-host.sh installs it): its compiler links come first.
if [ -d /usr/lib/ccache ] && command -v ccache >/dev/null; then
  export PATH="/usr/lib/ccache:$PATH" CCACHE_DIR="${CCACHE_DIR:-$root/.cache/ccache}" \
    CCACHE_NOHASHDIR=1 CCACHE_BASEDIR=/
fi
# The lint the tree keeps (pyproject.toml's [tool.ruff]), then the tests:
# one worker per core; each test file stays in one worker (its fixtures are
# built once).
ruff check --quiet "$root"
python -m pytest -q -ra -n auto --dist loadfile --durations=25 "$@"
