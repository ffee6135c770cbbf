#!/usr/bin/env bash
# Usage: scripts/test-torch-compat.sh TORCH_VERSION [VENV_DIR]
#
# The CPU route tests against one torch release, as a user installs it: a venv
# of its own (VENV_DIR, default .cache/torch-compat/<version>; made once) with
# torch==TORCH_VERSION and its dependencies from the package index (the Linux
# wheels pull CUDA's libraries: several GB, and `import torch` needs them),
# this checkout installed as a wheel built there, with its native libraries and
# the torch extension compiled against the dev venv's torch headers as a
# release is (TORCH_COMPAT_HEADERS=<torch>/include overrides), then the tests
# of enable(), the aten overrides, the registry route, the C++ extension and
# the flash-attn API, and a summary. Minutes and gigabytes: not part of
# the CI jobs (ci/jobs/); record its results in src/aotriton_rocm/torch_compat.json ("tested").
set -euo pipefail
version="${1:?usage: scripts/test-torch-compat.sh TORCH_VERSION [VENV_DIR]}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${2:-$root/.cache/torch-compat/$version}"
py="${PYTHON:-python3}"
tests=(tests/core/test_torch_compat.py tests/tooling/release/test_torch_schemas.py
       tests/integrations/test_torch_integration.py tests/integrations/test_flash_attention_op.py
       tests/integrations/test_torch_fallback.py tests/integrations/test_attention_mode.py
       tests/core/test_dropout_generator.py tests/integrations/test_flash_attn_api.py
       tests/core/test_kvcache_interpreter.py tests/test_import_cost.py
       tests/native_library/test_torch_stable.py)

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  "$py" -m venv "$venv"
fi
echo "== torch==$version and the test tools in $venv"
# PIP_CONSTRAINT=/dev/null: a machine-wide constraints file that caps torch
# must not stop the very version asked for.
PIP_CONSTRAINT=/dev/null "$venv/bin/python" -m pip install -q "torch==$version" numpy pytest hypothesis \
  "setuptools>=74"  # the wheel is built without build isolation

headers="${TORCH_COMPAT_HEADERS:-}"
if [ -z "$headers" ] && [ -x "$root/.venv/bin/python" ]; then
  headers="$("$root/.venv/bin/python" -c '
from pathlib import Path
from torch.utils.cpp_extension import include_paths
print(next((p for p in include_paths() if Path(p, "torch/csrc/stable/library.h").is_file()), ""))
' 2>/dev/null || true)"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/torch-compat.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# The working tree (tracked and untracked files, not the ignored build
# outputs), built outside it: an in-place build would replace the dev venv's
# libraries.
"$py" - "$root" "$work" <<'EOF'
import os, shutil, subprocess, sys
root, dest = sys.argv[1:]
listed = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"],
                        check=True, stdout=subprocess.PIPE).stdout
for rel in filter(None, map(os.fsdecode, listed.split(b"\0"))):
    src, dst = os.path.join(root, rel), os.path.join(dest, rel)
    if os.path.lexists(src) and not os.path.isdir(src):  # not deleted, not a submodule
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
EOF
mkdir -p "$work/dist"
echo "== building the wheel (torch extension headers: ${headers:-those of torch $version})"
AOTRITON_ROCM_TORCH_INCLUDE="$headers" "$venv/bin/python" -m pip wheel -q --no-deps \
  --no-build-isolation -w "$work/dist" "$work" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; exit 1; }
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$work"/dist/aotriton_rocm-*.whl

cd "$work"
status=0
"$venv/bin/python" -m aotriton_rocm.tooling.release.torch_schemas --check || status=1
# The installed extension (built as a release is) on this torch: loaded (every
# libtorch symbol resolved), its kernels put on the CPU key, where with no
# kernel image they hand each call through torch's dispatcher to the Python
# route (the Triton interpreter); the results must be torch's.
"$venv/bin/python" - <<'EOF' || status=1
import torch
import torch.nn.functional as F
from aotriton_rocm.core import torch_native
from aotriton_rocm.integrations import torch_integration

if not torch_native.available():
    raise SystemExit(f"torch {torch.__version__}: the torch extension is not installed "
                     f"({torch_native.library_path()})")
route = torch_integration._Overrides(cpu=False)
kernels = {op.split("::")[1]: fn for op, fn in route.cuda_kernels().items()}
torch_native.activate(kernels, rng_layout=torch_integration._rng_layout(), efficient_lse_align=32,
                      dispatch_key="CPU", python_keys=("CPU",))
try:
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 16, 32, generator=g, dtype=torch.float16) for _ in range(4))
    aten = torch.ops.aten
    out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, True)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, seed, offset)
    eff = aten._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0, True)[0]
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
    ref.backward(do.float())
    for got, want in ((out, ref), (eff, ref), (dq, qf.grad), (dk, kf.grad), (dv, vf.grad)):
        torch.testing.assert_close(got.float(), want.detach(), atol=4e-3, rtol=0)
    assert (mq, mk) == (16, 16), (mq, mk)
    served = {op: n for op, n in torch_native.fallback_calls.items() if n}
    assert len(served) == 3, served
finally:
    torch_native.deactivate()
    route.remove()
print(f"torch {torch.__version__}: the torch extension loads, and its kernels hand calls to the "
      f"Python route correctly ({served})")
EOF
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider -p no:xdist -rfE "${tests[@]}" \
  | tee "$work/pytest.log"
pytest_status=${PIPESTATUS[0]}
set -e
[ "$pytest_status" -eq 0 ] || status=1
echo "== torch $version: $(tail -1 "$work/pytest.log")"
echo "== torch compat $([ "$status" -eq 0 ] && echo passed || echo FAILED) for torch $version"
exit "$status"
