# The native libraries' sources and warnings, in one place: native/CMakeLists.txt
# includes this file and setup.py reads it (so: set() lists of plain words).
# -Werror is added where AOTR_WERROR is on (always in setup.py).

# The C core: libaotriton_rocm, and compiled into libaotriton_v2 too.
set(AOTR_CORE_SOURCES
  src/error.c
  src/json.c
  src/sha256.c
  src/xz.c
  src/archive.c
  src/archive_index.c
  src/find.c
  src/driver.c
  src/driver_open.c
  src/driver_memory.c
  src/driver_cuda.c
  src/driver_hip.c
  src/driver_host.c
  src/slots.c
  src/runtime.c
  src/kernel_tables.c
  src/launch.c
  src/attention_check.c
  src/attention_values.c
  src/attention.c
  src/dropout.c
  src/stage.c
  src/kvcache.c
  src/varlen.c
  src/varlen_rows.c
  src/device_ops.c
)
set(AOTR_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes
    -Wmissing-prototypes -Wconversion -Wno-sign-conversion -Wformat=2)

# libaotriton_v2's C++ layer (native/aotriton_api/).
set(AOTR_API_SOURCES
  src/attention.cpp
  src/runtime.cpp
  src/staging.cpp
  src/v2_api.cpp
)
set(AOTR_API_CXX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    -Wformat=2)

# libaotriton_rocm_torch (native/torch/); aotriton_rocm_torch.cpp registers the
# kernels (torch's dispatch dump names it).
set(AOTR_TORCH_SOURCES
  aotriton_rocm_torch.cpp
  tensors.cpp
  aten_kernels.cpp
  flash_attn_kernels.cpp
)
