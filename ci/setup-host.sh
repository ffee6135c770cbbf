#!/usr/bin/env bash
# The CI host's system packages, installed where missing (apt): what the CPU
# jobs need beside the dev venv that scripts/dev-env.sh makes.
set -euo pipefail
missing=()
# the C and C++ consumers of tests/native_library/test_consumers.py need g++ and pkg-config
if ! command -v cmake >/dev/null || ! command -v cc >/dev/null || ! command -v c++ >/dev/null \
    || ! command -v pkg-config >/dev/null; then
  missing+=(cmake gcc g++ pkg-config)
fi
# the suite builds the same native sources many times (runtime wheels of its
# test releases, CMake consumers): ccache answers the repeats (scripts/test.sh)
command -v ccache >/dev/null || missing+=(ccache)
# abi-check compares the C library with libabigail too (docs/ABI.md, "C library")
command -v abidiff >/dev/null || missing+=(abigail-tools)
# tests/test_native_format.py checks the native sources against .clang-format
command -v clang-format >/dev/null || missing+=(clang-format)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
