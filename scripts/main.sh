#!/usr/bin/env bash
# The main job: build the kernel archives for the default target set, package
# them as wheels and conda packages under dist/, install those into a fresh
# venv and a fresh conda prefix, and run the smoke test in each.
#   ROCM=6.4 ARCHS=gfx942,sm_90 bash scripts/main.sh   (defaults: ci/targets.toml)
set -euo pipefail
source "$(dirname "$0")/dev-env.sh"
cd "$root"
args=()
[ -n "${ROCM:-}" ] && args+=(--rocm "$ROCM")
[ -n "${ARCHS:-}" ] && args+=(--arch "$ARCHS")
start=$(date +%s)
echo "== build";   aotriton-rocm build "${args[@]}" --out build
echo "== package"; aotriton-rocm package --archives build/archives --out dist --clean
echo "== install + smoke"; aotriton-rocm install-check --dist dist --work build/install-check
echo "== main job done in $(( $(date +%s) - start )) s; artifacts in dist/"
