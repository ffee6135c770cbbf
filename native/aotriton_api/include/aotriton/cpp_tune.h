/* aotriton-rocm: AOTriton's kernel-tuning hooks. They only exist in
 * upstream's tuning builds (AOTRITON_BUILD_FOR_TUNING), which this library is
 * not: the types are declared for source compatibility and are unused. */
#ifndef AOTRITON_ROCM_API_CPP_TUNE_H
#define AOTRITON_ROCM_API_CPP_TUNE_H

#include <aotriton/config.h>

#if AOTRITON_ROCM_API_LINE >= 12
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <stdint.h>
#include <vector>

namespace AOTRITON_NS::v3 {

struct AOTRITON_API KernelControl {
  enum KernelControlBits {
    IgnoreBit = 0,
    ManualBit = 1,
    SkipBit = 2,
    QueryBit = 3,
    ExtractImageBit = 4
  };
  static constexpr uint16_t Default = 0;
  static constexpr uint16_t Ignore = 1 << IgnoreBit;
  static constexpr uint16_t Manual = 1 << ManualBit;
  static constexpr uint16_t Skip = 1 << SkipBit;
  static constexpr uint16_t Query = 1 << QueryBit;
  static constexpr uint16_t ExtractImage = 1 << ExtractImageBit;

  uint16_t control_bits = 0;
  uint16_t hsaco_index = 0;
  mutable int32_t total_hsacos = -1;
  mutable const char *kernel_psels = nullptr;
  mutable const char *kernel_copts = nullptr;
  mutable const void *kernel_image = nullptr;
  mutable size_t image_size = 0;
};

/* Tuning builds only; not implemented by this library. */
class AOTRITON_API KernelFineControl {
 private:
  mutable std::vector<std::shared_ptr<KernelControl>> controls_;
  void ensure_initialized(size_t index) const;

 public:
  explicit KernelFineControl(size_t size);
  std::shared_ptr<KernelControl> operator[](size_t index) const;
  std::shared_ptr<KernelControl> at(size_t index) const;
  size_t size() const;
};

}  // namespace AOTRITON_NS::v3

#else /* the 0.11 line: the v2 hook */

#include <cstddef>

namespace AOTRITON_NS::v2 {

struct AOTRITON_API CppTune {
#if AOTRITON_BUILD_FOR_TUNING
  int force_kernel_index = -1;
  int total_number_of_kernels = -1;
  const char *selected_kernel_psels = nullptr;
  const char *selected_kernel_copts = nullptr;
  bool peek_kernel_image = false;
  const void *kernel_image = nullptr;
  size_t image_size = 0;
#endif
};

enum AOTRITON_API CppTuneSpecialKernelIndex : int {
  kDefault = -1,
  kSkipGPUCall = -2,
};

}  // namespace AOTRITON_NS::v2

#endif

#endif
