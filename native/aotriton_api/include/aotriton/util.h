/* aotriton-rocm: tensor views, GPU identifiers and device queries of
 * AOTriton's C++ API. Names, member order, values and sizes follow the ABI
 * of the AOTriton line in config.h (AOTRITON_ROCM_API_LINE); the
 * static_asserts below pin the sizes measured from upstream's headers. */
#ifndef AOTRITON_V2_API_UTIL_H
#define AOTRITON_V2_API_UTIL_H

#include <aotriton/config.h>
#include "dtypes.h"
#include "runtime.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

namespace AOTRITON_NS {

constexpr uint64_t CAT64(uint32_t high, uint32_t low) {
  return (static_cast<uint64_t>(high) << 32) | static_cast<uint64_t>(low);
}

constexpr uint32_t CAT32(uint16_t high, uint16_t low) {
  return (static_cast<uint32_t>(high) << 16) | static_cast<uint32_t>(low);
}

/* vendor << 32 | arch << 16 | variant */
constexpr uint64_t TRICAT(uint16_t high, uint16_t mid, uint16_t low) {
  return (static_cast<uint64_t>(high) << 32) | (static_cast<uint64_t>(mid) << 16) |
         static_cast<uint64_t>(low);
}

template <typename T>
T AOTRITON_API cdiv(T numerator, T denominator) {
  return (numerator + (denominator - 1)) / denominator;
}

/* PCI vendor ids. */
enum AOTRITON_API GpuVendor : uint16_t {
  kAMD = 0x1002,
  kNVIDIA = 0x10de,
  kINTEL = 0x8086,
};

/* A GPU model: TRICAT(vendor, arch number, variant). Archs without a name
 * here (gfx908, ...) are returned as their TRICAT value all the same. */
enum AOTRITON_API Gpu : uint64_t {
  GPU_ARCH_UNKNOWN = 0,
  GPU_AMD_ARCH_GFX90A_MOD0 = TRICAT(GpuVendor::kAMD, 0x90a, 0),
  GPU_AMD_ARCH_GFX942_MOD0 = TRICAT(GpuVendor::kAMD, 0x942, 0),
  GPU_AMD_ARCH_GFX942_MOD1 = TRICAT(GpuVendor::kAMD, 0x942, 1),
  GPU_AMD_ARCH_GFX942_MOD2 = TRICAT(GpuVendor::kAMD, 0x942, 2),
  GPU_AMD_ARCH_GFX1100_MOD0 = TRICAT(GpuVendor::kAMD, 0x1100, 0),
  GPU_AMD_ARCH_GFX1101_MOD0 = TRICAT(GpuVendor::kAMD, 0x1101, 0),
  GPU_AMD_ARCH_GFX1102_MOD0 = TRICAT(GpuVendor::kAMD, 0x1102, 0),
  GPU_AMD_ARCH_GFX1103_MOD0 = TRICAT(GpuVendor::kAMD, 0x1103, 0),
  GPU_AMD_ARCH_GFX1150_MOD0 = TRICAT(GpuVendor::kAMD, 0x1150, 0),
  GPU_AMD_ARCH_GFX1151_MOD0 = TRICAT(GpuVendor::kAMD, 0x1151, 0),
  GPU_AMD_ARCH_GFX1152_MOD0 = TRICAT(GpuVendor::kAMD, 0x1152, 0),
  GPU_AMD_ARCH_GFX1153_MOD0 = TRICAT(GpuVendor::kAMD, 0x1153, 0),
  GPU_AMD_ARCH_GFX950_MOD0 = TRICAT(GpuVendor::kAMD, 0x950, 0),
  GPU_AMD_ARCH_GFX1201_MOD0 = TRICAT(GpuVendor::kAMD, 0x1201, 0),
  GPU_AMD_ARCH_GFX1200_MOD0 = TRICAT(GpuVendor::kAMD, 0x1200, 0),
  GPU_AMD_ARCH_GFX1250_MOD0 = TRICAT(GpuVendor::kAMD, 0x1250, 0),
};

/* The vendor and arch number of a Gpu, as CAT32(vendor, arch). */
inline uint32_t Gpu2VendorArch(uint64_t gpu) {
  return static_cast<uint32_t>((gpu & 0xFFFF'FFFF'0000) >> 16);
}

/* A strided view of device memory: base address, sizes and strides (in
 * elements), element type. Layout: {void*, sizes[Rank], strides[Rank], DType}. */
template <int Rank>
class AOTRITON_API TensorView {
 public:
  TensorView() {}

  TensorView(intptr_t base, std::array<uint64_t, Rank> sizes, std::array<uint64_t, Rank> strides,
             DType dtype)
      : base_(reinterpret_cast<void *>(base)), sizes_(sizes), strides_(strides), dtype_(dtype) {}

  /* From any tensor type with data_ptr(), size(i) and stride(i). */
  template <typename Tensor>
  TensorView(const Tensor &tensor, std::function<DType(const Tensor &)> dtype_extractor) {
    base_ = tensor.data_ptr();
    for (int i = 0; i < Rank; i++) {
      sizes_[i] = tensor.size(i);
      strides_[i] = tensor.stride(i);
    }
    dtype_ = dtype_extractor(tensor);
  }

  operator bool() const { return base_ != nullptr; }
  uint64_t size(int i) const { return sizes_[i]; }
  uint64_t stride(int i) const { return strides_[i]; }
  std::array<uint64_t, Rank> sizes() const { return sizes_; }
  const uint64_t *size_ptr() const { return sizes_.data(); }
  std::array<uint64_t, Rank> strides() const { return strides_; }
  const uint64_t *stride_ptr() const { return strides_.data(); }
  void *data_ptr() const { return base_; }
  DType dtype() const { return dtype_; }
  /* Addresses of the fields, as kernel launch arguments take them. */
  void *kparam_data_ptr() const { return const_cast<void *>(static_cast<const void *>(&base_)); }
  void *kparam_stride(int i) const {
    return const_cast<void *>(static_cast<const void *>(&strides_[i]));
  }

  static TensorView<Rank> get_null_tensor(DType dtype) {
    return TensorView<Rank>{0, std::array<uint64_t, Rank>{}, std::array<uint64_t, Rank>{}, dtype};
  }

 private:
  void *base_ = nullptr;
  std::array<uint64_t, Rank> sizes_;
  std::array<uint64_t, Rank> strides_;
  DType dtype_ = kUnknown;
};

/* A scalar in device memory: {void*, DType}. */
template <>
class AOTRITON_API TensorView<0> {
 public:
  TensorView() {}
  TensorView(intptr_t base, DType dtype) : base_(reinterpret_cast<void *>(base)), dtype_(dtype) {}

  operator bool() const { return base_ != nullptr; }
  uint64_t size(int i) const { return i == 0 ? 1 : 0; }
  uint64_t stride(int i) const { return i == 0 ? 1 : 0; }
  std::array<uint64_t, 0> sizes() const { return {}; }
  std::array<uint64_t, 0> strides() const { return {}; }
  void *data_ptr() const { return base_; }
  DType dtype() const { return dtype_; }
  static TensorView<0> get_null_tensor(DType dtype) { return TensorView<0>{0, dtype}; }
  void *kparam_data_ptr() const { return const_cast<void *>(static_cast<const void *>(&base_)); }

 private:
  void *base_ = nullptr;
  DType dtype_ = kUnknown;
};

/* Ranks 1-4 are instantiated once, in the library (exported there). The
 * library's own sources see these declarations too: an inline member they
 * instantiated themselves would be hidden (-fvisibility-inlines-hidden), and
 * the linker would then hide the exported copy as well (at -O0, where such
 * members are not inlined away). */
extern template class TensorView<1>;
extern template class TensorView<2>;
extern template class TensorView<3>;
extern template class TensorView<4>;

/* A tensor the library asks for only when a call needs it: acquire() is
 * called at most once per call and returns the view to use (its memory
 * stays the caller's); dispose() releases what acquire() set up, through
 * `cookie`. Plain function pointers keep the layout free of the C++
 * library's types. */
template <int Rank>
struct LazyTensor {
#if AOTRITON_ROCM_API_LINE >= 12
  void *cookie = nullptr;
  TensorView<Rank> (*acquire)(LazyTensor<Rank> *self) = nullptr;
  void (*dispose)(LazyTensor<Rank> *self) = nullptr;
  /* Used as is, without acquire(), when its base address is not null. */
  TensorView<Rank> eager;

  operator bool() const {
    return eager || cookie != nullptr || acquire != nullptr || dispose != nullptr;
  }

  void free() {
    if (dispose && cookie) {
      (*dispose)(this);
      cookie = nullptr;
    }
  }
#else
  void *cookie = nullptr;
  TensorView<Rank> (*acquire)(void *cookie) = nullptr;
  void (*dispose)(void *cookie) = nullptr;

  operator bool() const { return cookie != nullptr || acquire != nullptr || dispose != nullptr; }

  void free() {
    if (dispose && cookie) {
      (*dispose)(cookie);
      cookie = nullptr;
    }
  }
#endif
};

/* The GPU behind a stream's device (GPU_ARCH_UNKNOWN when the runtime
 * cannot say). */
Gpu AOTRITON_API getGpuFromStream(hipStream_t);
/* true: the arch is served, but PyTorch should ask the user to opt in
 * (TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL). */
bool AOTRITON_API isArchExperimentallySupported(hipStream_t);
int AOTRITON_API getMultiProcessorCount(hipStream_t stream);
#if AOTRITON_ROCM_API_LINE >= 13
bool AOTRITON_API isArchTechPreview(hipStream_t);
#endif

static_assert(sizeof(TensorView<0>) == 16 && alignof(TensorView<0>) == 8, "TensorView<0> ABI");
static_assert(sizeof(TensorView<1>) == 32 && alignof(TensorView<1>) == 8, "TensorView<1> ABI");
static_assert(sizeof(TensorView<2>) == 48 && alignof(TensorView<2>) == 8, "TensorView<2> ABI");
static_assert(sizeof(TensorView<3>) == 64 && alignof(TensorView<3>) == 8, "TensorView<3> ABI");
static_assert(sizeof(TensorView<4>) == 80 && alignof(TensorView<4>) == 8, "TensorView<4> ABI");
static_assert(offsetof(LazyTensor<2>, cookie) == 0 && offsetof(LazyTensor<2>, acquire) == 8 &&
                  offsetof(LazyTensor<2>, dispose) == 16,
              "LazyTensor<2> ABI");
static_assert(offsetof(LazyTensor<4>, cookie) == 0 && offsetof(LazyTensor<4>, acquire) == 8 &&
                  offsetof(LazyTensor<4>, dispose) == 16,
              "LazyTensor<4> ABI");
#if AOTRITON_ROCM_API_LINE >= 12
static_assert(offsetof(LazyTensor<2>, eager) == 24 && sizeof(LazyTensor<2>) == 72,
              "LazyTensor<2> ABI");
static_assert(offsetof(LazyTensor<4>, eager) == 24 && sizeof(LazyTensor<4>) == 104,
              "LazyTensor<4> ABI");
#else
static_assert(sizeof(LazyTensor<2>) == 24 && sizeof(LazyTensor<4>) == 24, "LazyTensor ABI");
#endif

}  // namespace AOTRITON_NS

#endif
