#!/usr/bin/env bash
# The native library's tests (tests/native_library) on an ASan + UBSan build of
# native/. The sanitizer runtimes are preloaded because the tests load the
# library into Python with ctypes.
set -euo pipefail
source "$(dirname "$0")/dev-env.sh"
cd "$root"
build="$root/build/native-sanitize"
cc=${CC:-cc}
export AOTR_NATIVE_BUILD_DIR="$build"
export AOTR_NATIVE_CMAKE_ARGS="-DAOTR_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"
export ASAN_OPTIONS=detect_leaks=0   # the interpreter's own allocations
LD_PRELOAD="$($cc -print-file-name=libasan.so):$($cc -print-file-name=libubsan.so)" \
  python -m pytest -q -ra tests/native_library "$@"
