/* aotriton-rocm: element types of AOTriton's C++ API (values fixed by the ABI). */
#ifndef AOTRITON_V2_API_DTYPES_H
#define AOTRITON_V2_API_DTYPES_H

#include <aotriton/config.h>
#include <stdint.h>

namespace AOTRITON_NS {

enum AOTRITON_API DType : int32_t {
  kUnknown = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 10,
  kInt16 = 11,
  kInt32 = 12,
  kInt64 = 13,
  kUInt8 = 20,
  kUInt16 = 21,
  kUInt32 = 22,
  kUInt64 = 23,
};

static_assert(sizeof(DType) == 4, "DType is an int32_t");

}  // namespace AOTRITON_NS

#endif
