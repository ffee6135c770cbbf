// References every function libaotriton_v2 exports, the way C++ consumers
// name them (PyTorch's call sites, the TensorView members the header's
// `extern template` leaves to the library, util.h's device queries), so that
// `nm -u` of this object lists the mangled names a consumer needs. Compiled
// against our headers or upstream's (AOTRITON_VERSION_MINOR picks the line).
#include <aotriton/flash.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

template <int R>
void touch_view(aotriton::TensorView<R> *out) {
  aotriton::TensorView<R> a;
  aotriton::TensorView<R> b(0, std::array<uint64_t, R>{}, std::array<uint64_t, R>{},
                            aotriton::kFloat16);
  volatile uint64_t sink = a.size(0) + a.stride(0) + a.sizes()[0] + a.strides()[0] +
                           *a.size_ptr() + *a.stride_ptr() + (a ? 1 : 0) +
                           reinterpret_cast<uintptr_t>(a.data_ptr()) +
                           reinterpret_cast<uintptr_t>(a.kparam_data_ptr()) +
                           reinterpret_cast<uintptr_t>(a.kparam_stride(0)) +
                           static_cast<uint64_t>(a.dtype());
  (void)sink;
  *out = aotriton::TensorView<R>::get_null_tensor(aotriton::kFloat16);
  *out = b;
}

void *call_sites[] = {
    reinterpret_cast<void *>(&aotriton::v2::flash::check_gpu),
    reinterpret_cast<void *>(&aotriton::v2::flash::debug_simulate_encoded_softmax),
    reinterpret_cast<void *>(&aotriton::isArchExperimentallySupported),
    reinterpret_cast<void *>(&aotriton::getGpuFromStream),
    reinterpret_cast<void *>(&aotriton::getMultiProcessorCount),
#if AOTRITON_VERSION_MINOR >= 13
    reinterpret_cast<void *>(&aotriton::isArchTechPreview),
#endif
    reinterpret_cast<void *>(&aotriton::v3::flash::attn_fwd),
    reinterpret_cast<void *>(&aotriton::v3::flash::attn_bwd),
#if AOTRITON_VERSION_MINOR < 13 || (defined(AOTRITON_ROCM_API_LINE) && AOTRITON_ROCM_API_LINE < 14)
    reinterpret_cast<void *>(&aotriton::v2::flash::attn_fwd),
    reinterpret_cast<void *>(&aotriton::v2::flash::attn_fwd_compact_varlen),
    reinterpret_cast<void *>(&aotriton::v2::flash::attn_bwd),
    reinterpret_cast<void *>(&aotriton::v2::flash::attn_bwd_fused),
    reinterpret_cast<void *>(&aotriton::v2::flash::attn_bwd_compact_varlen),
#endif
};

int main() {
  aotriton::v3::flash::attn_fwd_params fwd;
  aotriton::v3::flash::attn_bwd_params bwd;
  aotriton::TensorView<1> t1;
  aotriton::TensorView<2> t2;
  aotriton::TensorView<3> t3;
  aotriton::TensorView<4> t4;
  touch_view(&t1);
  touch_view(&t2);
  touch_view(&t3);
  touch_view(&t4);
  (void)fwd;
  (void)bwd;
  return call_sites[0] != nullptr ? 0 : 1;
}
