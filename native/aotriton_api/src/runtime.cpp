/* The process's runtime, device preparation (finding the kernel image),
 * error reporting, and the device queries of util.h and check_gpu. */
#include "layer.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace aotriton_rocm_v2 {
namespace {

constexpr int kMaxDevices = 64;

struct State {
  std::once_flag created;
  aotr_runtime *rt = nullptr;
  std::mutex lock;
  std::array<bool, kMaxDevices> prepared{};
  std::array<std::string, kMaxDevices> arch;
  std::array<int, kMaxDevices> coverage{}; /* 0 unknown, 1 yes, -1 no */
};

State &state() {
  static State *s = new State; /* never destroyed: API calls may come during exit */
  return *s;
}

/* statx (glibc 2.28), not stat: glibc >= 2.33 binds stat to a symbol
 * version manylinux_2_28 does not have. */
bool is_file(const std::string &path) {
  struct statx st;
  return statx(AT_FDCWD, path.c_str(), 0, STATX_TYPE, &st) == 0 && S_ISREG(st.stx_mode);
}

/* The directory this library was loaded from. */
std::string library_dir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&library_dir), &info) == 0 || !info.dli_fname) return "";
  char resolved[PATH_MAX];
  std::string path = realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

/* The kernel image of `arch` beside this library: the layout PyTorch's build
 * copies (lib/aotriton.images/amd-<arch>/, or the archive itself in
 * aotriton.images/), then an aotriton-rocm image wheel or conda package
 * found from up to six directories up (a conda env's torch/lib is
 * $PREFIX/lib/python3.X/site-packages/torch/lib, its images are in
 * $PREFIX/share/aotriton-rocm/). "" if none: the core's own
 * search (AOTRITON_ROCM_ARCHIVE_DIR, beside libaotriton_rocm) then applies. */
std::string find_image(const std::string &arch) {
  const std::string dir = library_dir();
  if (dir.empty() || arch.empty()) return "";
  const std::string file = arch + ".aotr";
  const std::string vendor = arch.compare(0, 3, "sm_") == 0 ? "nvidia-" : "amd-";
  for (const std::string &c :
       {dir + "/aotriton.images/" + vendor + arch + "/" + file, dir + "/aotriton.images/" + file})
    if (is_file(c)) return c;
  std::string package = "aotriton_rocm_";
  for (char ch : arch)
    if (ch != '_') package += ch;
  std::string up = dir;
  for (int level = 0; level <= 5 && !up.empty(); level++) {
    for (const std::string &c :
         {up + "/" + package + "/" + file, up + "/share/aotriton-rocm/" + file})
      if (is_file(c)) return c;
    size_t slash = up.rfind('/');
    up = slash == std::string::npos || slash == 0 ? "" : up.substr(0, slash);
  }
  return "";
}

}  // namespace

aotr_runtime *runtime() {
  State &s = state();
  std::call_once(s.created, [&s] {
    aotr_runtime_options o{};
    o.struct_size = sizeof o;
    /* For tests and unusual installs: the driver library, and the backend. */
    o.driver_library = std::getenv("AOTRITON_ROCM_DRIVER_LIBRARY");
    const char *backend = std::getenv("AOTRITON_ROCM_BACKEND");
    o.backend = backend && !std::strcmp(backend, "cuda")  ? AOTR_BACKEND_CUDA
                : backend && !std::strcmp(backend, "hip") ? AOTR_BACKEND_HIP
                                                          : AOTR_BACKEND_AUTO;
    if (aotr_runtime_create(&o, &s.rt) != AOTR_OK) {
      std::fprintf(stderr, "[aotriton-rocm libaotriton_v2] no runtime: %s\n", aotr_last_error());
      s.rt = nullptr;
    }
  });
  return s.rt;
}

aotr_status current_device(int32_t *device) {
  aotr_runtime *rt = runtime();
  if (!rt) return AOTR_DRIVER_UNAVAILABLE;
  aotr_status st = aotr_current_device(rt, device);
  if (st != AOTR_OK) return st;
  if (*device < 0 || *device >= kMaxDevices) return AOTR_INVALID_ARGUMENT;
  State &s = state();
  std::lock_guard<std::mutex> guard(s.lock);
  if (s.prepared[static_cast<size_t>(*device)]) return AOTR_OK;
  char arch[64] = "";
  st = aotr_runtime_device_arch(rt, *device, arch, sizeof arch);
  if (st != AOTR_OK) return st;
  s.arch[static_cast<size_t>(*device)] = arch;
  const std::string image = std::getenv("AOTRITON_ROCM_ARCHIVE_DIR") ? "" : find_image(arch);
  /* a failure here is kept: the core's own search still runs at first use */
  if (!image.empty() && aotr_runtime_add_archive(rt, image.c_str()) != AOTR_OK)
    std::fprintf(stderr, "[aotriton-rocm libaotriton_v2] %s: %s\n", image.c_str(),
                 aotr_last_error());
  s.prepared[static_cast<size_t>(*device)] = true;
  return AOTR_OK;
}

const char *device_arch(int32_t device) {
  if (device < 0 || device >= kMaxDevices) return "";
  State &s = state();
  std::lock_guard<std::mutex> guard(s.lock);
  return s.arch[static_cast<size_t>(device)].c_str();
}

namespace {
thread_local const char *layer_message = nullptr;
}

aotr_status fail(aotr_status status, const char *message) {
  layer_message = message;
  return status;
}

hipError_t report(aotr_status status, const char *what) {
  if (status == AOTR_OK) return hipSuccess;
  std::fprintf(stderr, "[aotriton-rocm libaotriton_v2] %s: %s (%s)\n", what,
               layer_message ? layer_message : aotr_last_error(), aotr_status_name(status));
  layer_message = nullptr;
  switch (status) {
    case AOTR_INVALID_ARGUMENT: return hipErrorInvalidValue;
    case AOTR_UNSUPPORTED:
    case AOTR_NEEDS_LAYOUT: return hipErrorNotSupported;
    case AOTR_NOT_FOUND:
    case AOTR_ARCHIVE_INVALID:
    case AOTR_IDENTITY_MISMATCH: return hipErrorNoBinaryForGpu;
    case AOTR_DRIVER_UNAVAILABLE: return hipErrorNoDevice;
    case AOTR_OUT_OF_MEMORY: return hipErrorOutOfMemory;
    default: return hipErrorLaunchFailure;
  }
}

int32_t core_dtype(aotriton::DType dtype) {
  switch (dtype) {
    case aotriton::kFloat16: return AOTR_FP16;
    case aotriton::kBFloat16: return AOTR_BF16;
    case aotriton::kFloat32: return AOTR_FP32;
    case aotriton::kInt32:
    case aotriton::kUInt32: return AOTR_INT32;
    case aotriton::kInt64:
    case aotriton::kUInt64: return AOTR_INT64;
    default: return AOTR_DTYPE_INVALID;
  }
}

size_t element_size(int32_t dtype) {
  switch (dtype) {
    case AOTR_FP16:
    case AOTR_BF16: return 2;
    case AOTR_FP32:
    case AOTR_INT32: return 4;
    case AOTR_INT64: return 8;
    default: return 1;
  }
}

/* ---------------------------------------------------------- coverage */

/* THE place that decides which calls check_gpu vouches for: every problem
 * PyTorch's sdp_utils admits on ROCm must be covered by the device's image.
 * Tighten (or widen) the admitted set here, nowhere else. */
namespace admitted {
constexpr int kMaxHeadDim = 512; /* aotriton_max_hdim() */
constexpr int32_t kDtypes[] = {AOTR_FP16, AOTR_BF16, AOTR_FP32};
constexpr int64_t kSeqlens[] = {1, 128, 8192}; /* short, middle and long buckets */
}  // namespace admitted

bool covers_admitted_calls(int32_t device) {
  State &s = state();
  {
    std::lock_guard<std::mutex> guard(s.lock);
    int known = s.coverage[static_cast<size_t>(device)];
    if (known) return known > 0;
  }
  aotr_runtime *rt = runtime();
  bool ok = rt != nullptr;
  /* Addresses are never read: a probe only consults the image's tables. */
  static char probe alignas(256)[256];
  for (int32_t dtype : admitted::kDtypes)
    for (int d = 1; ok && d <= admitted::kMaxHeadDim; d++)
      for (int64_t sq : admitted::kSeqlens)
        for (int64_t sk : admitted::kSeqlens)
          for (int bias = 0; ok && bias < 2; bias++)
            for (int dropout = 0; ok && dropout < 2; dropout++) {
              aotr_attn_problem p{};
              const int64_t shape_q[4] = {1, 2, sq, d}, shape_k[4] = {1, 1, sk, d};
              for (aotr_tensor *t : {&p.q, &p.k, &p.v}) {
                const int64_t *shape = t == &p.q ? shape_q : shape_k;
                t->data = probe;
                t->dtype = dtype;
                t->rank = 4;
                int64_t stride = 1;
                for (int i = 3; i >= 0; i--) {
                  t->sizes[i] = shape[i];
                  t->strides[i] = stride;
                  stride *= i == 3 ? (d + 15) / 16 * 16 : shape[i];
                }
              }
              if (bias) {
                p.bias = p.q;
                p.bias.sizes[3] = sk;
                p.bias.strides[2] = (sk + 15) / 16 * 16;
                p.bias.strides[1] = p.bias.strides[0] = 0;
              }
              p.scale = 1.0f;
              p.dropout_p = dropout ? 0.5f : 0.0f;
              p.window_left = p.window_right = -1;
              /* dropout under graph capture runs the philox_state kernel too */
              const uint32_t needs =
                  dropout ? AOTR_NEED_BACKWARD | AOTR_NEED_PHILOX_STATE : AOTR_NEED_BACKWARD;
              ok = aotr_attn_supported(rt, device, &p, needs) == AOTR_OK;
            }
  std::lock_guard<std::mutex> guard(s.lock);
  s.coverage[static_cast<size_t>(device)] = ok ? 1 : -1;
  return ok;
}

}  // namespace aotriton_rocm_v2

/* ------------------------------------------------------------ util.h */

namespace aotriton {

using namespace aotriton_rocm_v2;

Gpu getGpuFromStream(hipStream_t) {
  int32_t device = 0;
  if (current_device(&device) != AOTR_OK) return GPU_ARCH_UNKNOWN;
  const char *arch = device_arch(device);
  if (std::strncmp(arch, "gfx", 3) != 0) return GPU_ARCH_UNKNOWN;
  char *end = nullptr;
  unsigned long number = std::strtoul(arch + 3, &end, 16);
  if (end == arch + 3 || *end || number > 0xffff) return GPU_ARCH_UNKNOWN;
  return static_cast<Gpu>(TRICAT(GpuVendor::kAMD, static_cast<uint16_t>(number), 0));
}

/* Archs this library serves are served fully (check_gpu), none on trial. */
bool isArchExperimentallySupported(hipStream_t) { return false; }

#if AOTRITON_ROCM_API_LINE >= 13
bool isArchTechPreview(hipStream_t) { return false; }
#endif

int getMultiProcessorCount(hipStream_t) {
  int32_t device = 0;
  if (current_device(&device) != AOTR_OK) return 0;
  int32_t count = 0;
  return aotr_compute_units(runtime(), device, &count) == AOTR_OK ? count : 0;
}

}  // namespace aotriton
