#!/usr/bin/env bash
# CI job: lint and the whole test suite on the CPU, slow tests included (the
# README's test command; GPU tests skip without a GPU). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/test.sh "$@"
