/* aotriton-rocm: the backend numbers of the 0.14 line's attn_options::
 * force_backend_index, with upstream's names and values (upstream generates
 * this header from its operator descriptions). This library has one
 * implementation per operator: it accepts every index and runs its own
 * kernels. X-macros list each struct's constants with the backend's name. */
#ifndef AOTRITON_V3_API_FLASH_BACKENDS_H
#define AOTRITON_V3_API_FLASH_BACKENDS_H

#include <aotriton/config.h>

#include <cstdint>

namespace AOTRITON_NS::v3::flash {

struct AOTRITON_API OpAttnFwdBackend {
  static constexpr int32_t kTriton = 0;
  static constexpr int32_t kAiter = 1;
  static constexpr int32_t kFlyc = 2;
  static constexpr int32_t Max = 3;
};

struct AOTRITON_API OpAttnBwdBackend {
  static constexpr int32_t kTritonSplit = 0;
  static constexpr int32_t kTritonFuse = 1;
  static constexpr int32_t kAiter = 2;
  static constexpr int32_t kFlyc = 3;
  static constexpr int32_t Max = 4;
};

}  // namespace AOTRITON_NS::v3::flash

#define AOTRITON_BACKENDS_OpAttnFwdBackend(X) \
  X(kTriton, "triton")                        \
  X(kAiter, "aiter")                          \
  X(kFlyc, "flyc")

#define AOTRITON_BACKENDS_OpAttnBwdBackend(X) \
  X(kTritonSplit, "triton_split")             \
  X(kTritonFuse, "triton_fuse")               \
  X(kAiter, "aiter")                          \
  X(kFlyc, "flyc")

#endif
