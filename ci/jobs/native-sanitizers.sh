#!/usr/bin/env bash
# CI job: the native library's CPU paths again, under AddressSanitizer and
# UBSan (tests/native_library on a sanitizer build of native/).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/test-native-sanitizers.sh "$@"
