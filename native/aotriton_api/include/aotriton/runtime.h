/* aotriton-rocm: the stream type of AOTriton's C++ API.
 *
 * hipStream_t and hipError_t come from the HIP runtime's header where the
 * compiler finds it (PyTorch's build: hipcc); elsewhere this header declares
 * the same two types itself (hipStream_t is `struct ihipStream_t *`, so the
 * mangled names agree; hipError_t's values below are HIP's), so that a
 * program can be built without ROCm. Define AOTRITON_ROCM_NO_HIP_RUNTIME_H
 * to always use the declarations below. */
#ifndef AOTRITON_V2_API_RUNTIME_H
#define AOTRITON_V2_API_RUNTIME_H

#include <aotriton/config.h>

#if !defined(AOTRITON_ROCM_NO_HIP_RUNTIME_H) && defined(__has_include)
#if __has_include(<hip/hip_runtime.h>)
#include <hip/hip_runtime.h>
#define AOTRITON_ROCM_HIP_RUNTIME_H 1
#endif
#endif

#ifndef AOTRITON_ROCM_HIP_RUNTIME_H
#define AOTRITON_ROCM_HIP_RUNTIME_H 0
typedef struct ihipStream_t *hipStream_t;
/* The subset of HIP's error codes this API returns (same values as HIP). */
typedef enum hipError_t {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorNotInitialized = 3,
  hipErrorInvalidSymbol = 13,
  hipErrorNoDevice = 100,
  hipErrorInvalidDevice = 101,
  hipErrorNoBinaryForGpu = 209,
  hipErrorNotFound = 500,
  hipErrorLaunchFailure = 719,
  hipErrorNotSupported = 801,
  hipErrorUnknown = 999
} hipError_t;
#endif

namespace AOTRITON_NS {

/* A device stream, wrapped so that the API's signatures stay the same
 * whatever the stream type (one pointer). */
template <typename DeviceStreamType>
class AOTRITON_API StreamTemplate {
 public:
  StreamTemplate() : stream_(nullptr) {}
  StreamTemplate(DeviceStreamType stream) : stream_(stream) {}
  DeviceStreamType native() const { return stream_; }

 private:
  DeviceStreamType stream_;
};

using Stream = StreamTemplate<hipStream_t>;

static_assert(sizeof(Stream) == sizeof(void *), "Stream is one pointer");

}  // namespace AOTRITON_NS

#endif
