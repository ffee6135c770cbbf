/* aotriton-rocm: the v2 tuning hook of the 0.12/0.13 line (deprecated
 * upstream with the v2 attention functions). See ../cpp_tune.h. */
#ifndef AOTRITON_ROCM_API_V2_CPP_TUNE_H
#define AOTRITON_ROCM_API_V2_CPP_TUNE_H

#include <aotriton/config.h>

#if AOTRITON_ROCM_API_LINE >= 12
#include <cstddef>

namespace AOTRITON_NS::v2 {

struct [[deprecated("V2 API is deprecated, use V3 API instead"),
         gnu::visibility("default")]] CppTune {
#if AOTRITON_BUILD_FOR_TUNING
  bool peek_kernel_numbers = false;
  int force_kernel_index = -1;
  int total_number_of_kernels = -1;
  const char *selected_kernel_psels = nullptr;
  const char *selected_kernel_copts = nullptr;
  bool peek_kernel_image = false;
  const void *kernel_image = nullptr;
  size_t image_size = 0;
#endif
};

enum [[deprecated("V2 API is deprecated, use V3 API instead")]] CppTuneSpecialKernelIndex : int{
    kDefault = -1,
    kSkipGPUCall = -2,
};

}  // namespace AOTRITON_NS::v2
#else
#include <aotriton/cpp_tune.h>
#endif

#endif
