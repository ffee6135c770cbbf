#!/usr/bin/env bash
# The test suite (CPU only; GPU tests skip without a GPU). Extra args go to pytest.
set -euo pipefail
source "$(dirname "$0")/dev-env.sh"
cd "$root"
# One worker per core; each test file stays in one worker (its fixtures are
# built once).
python -m pytest -q -ra -n auto --dist loadfile --durations=25 "$@"
