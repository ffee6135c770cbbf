/* aotriton-rocm: AOTriton's v2 attention functions (one call per variant).
 * Deprecated upstream since 0.12 and gone in 0.13: kept because PyTorch
 * 2.9-2.12 (and the 0.12 headers of torch 2.13) name them in branches that
 * `if constexpr` discards, which still leaves them undefined symbols of
 * libtorch_hip.so. Each runs through the v3 implementation. */
#ifndef AOTRITON_V2_API_FLASH_ATTN_H
#define AOTRITON_V2_API_FLASH_ATTN_H

#include <aotriton/config.h>
#include <aotriton/runtime.h>
#include <aotriton/util.h>
#include <aotriton/v2/cpp_tune.h>

/* GCC takes no __attribute__ between a class's [[...]] and its name: the
 * deprecated classes spell visibility as a standard attribute. */
#if AOTRITON_ROCM_API_LINE >= 12
#define AOTRITON_ROCM_V2_DEPRECATED [[deprecated("V2 API is deprecated, use V3 API instead")]]
#define AOTRITON_ROCM_V2_TYPE \
  [[deprecated("V2 API is deprecated, use V3 API instead"), gnu::visibility("default")]]
#else
#define AOTRITON_ROCM_V2_DEPRECATED
#define AOTRITON_ROCM_V2_TYPE AOTRITON_API
#endif

namespace AOTRITON_NS::v2::flash {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

using T4 = AOTRITON_NS::TensorView<4>;
using T2 = AOTRITON_NS::TensorView<2>;
using T1 = AOTRITON_NS::TensorView<1>;
using T0 = AOTRITON_NS::TensorView<0>;

#if AOTRITON_ROCM_API_LINE < 12
/* hipSuccess if this library serves the stream's GPU (see flash.h). */
hipError_t AOTRITON_API check_gpu(AOTRITON_NS::Stream stream);
#endif

struct AOTRITON_ROCM_V2_TYPE FwdExtraArguments : public CppTune {};

struct AOTRITON_ROCM_V2_TYPE BwdExtraArguments {
#if AOTRITON_BUILD_FOR_TUNING
  FwdExtraArguments dkdv, dqdb;
#endif
};

struct AOTRITON_ROCM_V2_TYPE FusedBwdExtraArguments : public CppTune {};

/* q, k, v, out: (batch, heads, seqlen, head_dim) views; b: bias or a null view. */
AOTRITON_ROCM_V2_DEPRECATED hipError_t AOTRITON_API
attn_fwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T2 softmax_lse, T4 Out, float dropout_p,
         T0 philox_seed, T0 philox_offset1, int64_t philox_offset2, T0 philox_seed_output,
         T0 philox_offset_output, T4 encoded_softmax, bool is_causal, T0 atomic_for_causal,
         AOTRITON_NS::Stream stream, FwdExtraArguments *extargs = nullptr);

/* q, k, v, out: (1, heads, total, head_dim) views of packed sequences. */
AOTRITON_ROCM_V2_DEPRECATED hipError_t AOTRITON_API attn_fwd_compact_varlen(
    T4 q, T4 k, T4 v, T4 b, T1 cu_seqlens_q, T1 cu_seqlens_k, int32_t max_seqlen_q,
    int32_t max_seqlen_k, float sm_scale, T2 softmax_lse, T4 Out, float dropout_p, T0 philox_seed,
    T0 philox_offset1, int64_t philox_offset2, T0 philox_seed_output, T0 philox_offset_output,
    T4 encoded_softmax, bool is_causal, T0 atomic_for_causal, AOTRITON_NS::Stream stream,
    FwdExtraArguments *extargs = nullptr);

/* delta: fp32 workspace shaped like softmax_lse. */
AOTRITON_ROCM_V2_DEPRECATED hipError_t AOTRITON_API
attn_bwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv, T4 db,
         T2 softmax_lse, T2 delta, float dropout_p, T0 philox_seed, T0 philox_offset1,
         int64_t philox_offset2, bool is_causal, AOTRITON_NS::Stream stream,
         BwdExtraArguments *extargs = nullptr);

AOTRITON_ROCM_V2_DEPRECATED hipError_t AOTRITON_API attn_bwd_fused(
    T4 q, T4 k, T4 v, T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv, T4 db,
    T2 softmax_lse, float dropout_p, T0 philox_seed, T0 philox_offset1, int64_t philox_offset2,
    bool is_causal, AOTRITON_NS::Stream stream, FusedBwdExtraArguments *extargs = nullptr);

AOTRITON_ROCM_V2_DEPRECATED hipError_t AOTRITON_API attn_bwd_compact_varlen(
    T4 q, T4 k, T4 v, T1 cu_seqlens_q, T1 cu_seqlens_k, int32_t max_seqlen_q, int32_t max_seqlen_k,
    T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv, T4 db, T2 softmax_lse, T2 delta,
    float dropout_p, T0 philox_seed, T0 philox_offset1, int64_t philox_offset2, bool is_causal,
    AOTRITON_NS::Stream stream, BwdExtraArguments *extargs = nullptr);

#if AOTRITON_ROCM_API_LINE < 12
/* r: fp32 (batch, heads, seqlen_q, seqlen_k); see flash.h. */
hipError_t AOTRITON_API debug_simulate_encoded_softmax(T4 r, float dropout_p, T0 philox_seed,
                                                       T0 philox_offset1, uint64_t philox_offset2,
                                                       AOTRITON_NS::Stream stream);
#endif

#pragma GCC diagnostic pop

}  // namespace AOTRITON_NS::v2::flash

#undef AOTRITON_ROCM_V2_DEPRECATED
#undef AOTRITON_ROCM_V2_TYPE

#endif
