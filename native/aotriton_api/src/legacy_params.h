/* The 0.14 line's library also serves callers built against the 0.12b/0.13b
 * headers (params versions 3 and 6), as upstream's 0.14 library does: their
 * params objects are read through the layouts below (those of our 0.13
 * line, pinned by the same offsets) and translated into the 0.14 structs,
 * varlen_type becoming varlen_bits. Only the 0.14 line compiles this. */
#ifndef AOTRITON_ROCM_V2_LEGACY_PARAMS_H
#define AOTRITON_ROCM_V2_LEGACY_PARAMS_H

#include "layer.h"

#if AOTRITON_ROCM_API_LINE >= 14

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace aotriton_rocm_v2 {

using aotriton::v3::flash::LT2;
using aotriton::v3::flash::LT4;
using aotriton::v3::flash::T0;
using aotriton::v3::flash::T1;
using aotriton::v3::flash::T2;
using aotriton::v3::flash::T4;

/* attn_fwd_params of params version 3 (0.12b, 0.13b). */
struct FwdParamsV3 {
  T4 Q, K, V, B;
  T2 A;
  float Sm_scale;
  T2 L;
  T4 Out;
  T1 cu_seqlens_q, cu_seqlens_k;
  int32_t Max_seqlen_q, Max_seqlen_k;
  T1 seq_strides_q, seq_strides_k;
  float dropout_p;
  T0 philox_seed_ptr, philox_offset1;
  uint64_t philox_offset2;
  T0 philox_seed_output, philox_offset_output;
  T4 encoded_softmax;
  T0 persistent_atomic_counter;
  int8_t causal_type;
  int8_t varlen_type;
  int32_t window_left, window_right;
};

/* attn_bwd_params of params version 6 (0.12b, 0.13b). */
struct BwdParamsV6 {
  T4 Q, K, V, B;
  float Sm_scale;
  T4 Out, DO, DK, DV, DQ, DB;
  T2 L;
  LT2 D;
  T1 cu_seqlens_q, cu_seqlens_k;
  int32_t Max_seqlen_q, Max_seqlen_k;
  T1 seq_strides_q, seq_strides_k;
  float dropout_p;
  T0 philox_seed_ptr, philox_offset1;
  uint64_t philox_offset2;
  int8_t causal_type;
  int8_t varlen_type;
  int32_t window_left, window_right;
  LT4 DQ_ACC;
};

static_assert(std::is_trivially_copyable<FwdParamsV3>::value &&
                  std::is_trivially_copyable<BwdParamsV6>::value,
              "read from the caller's bytes by memcpy");
static_assert(sizeof(FwdParamsV3) == 832 && offsetof(FwdParamsV3, cu_seqlens_q) == 504 &&
                  offsetof(FwdParamsV3, seq_strides_q) == 576 &&
                  offsetof(FwdParamsV3, varlen_type) == 817 &&
                  offsetof(FwdParamsV3, window_right) == 824,
              "attn_fwd_params version 3 layout");
static_assert(sizeof(BwdParamsV6) == 1232 && offsetof(BwdParamsV6, cu_seqlens_q) == 928 &&
                  offsetof(BwdParamsV6, seq_strides_q) == 1000 &&
                  offsetof(BwdParamsV6, varlen_type) == 1113 &&
                  offsetof(BwdParamsV6, DQ_ACC) == 1128,
              "attn_bwd_params version 6 layout");

/* The caller's object (`raw`, laid out as version 3 / 6) as the current
 * struct. Read by memcpy: the caller's type is not ours. */
inline aotriton::v3::flash::attn_fwd_params translate(const FwdParamsV3 &o) {
  aotriton::v3::flash::attn_fwd_params p;
  p.Q = o.Q, p.K = o.K, p.V = o.V, p.B = o.B, p.A = o.A;
  p.Sm_scale = o.Sm_scale;
  p.L = o.L;
  p.Out = o.Out;
  p.seqinfo_q0 = o.cu_seqlens_q, p.seqinfo_k0 = o.cu_seqlens_k;
  p.Max_seqlen_q = o.Max_seqlen_q, p.Max_seqlen_k = o.Max_seqlen_k;
  p.seqinfo_q1 = o.seq_strides_q, p.seqinfo_k1 = o.seq_strides_k;
  p.dropout_p = o.dropout_p;
  p.philox_seed_ptr = o.philox_seed_ptr, p.philox_offset1 = o.philox_offset1;
  p.philox_offset2 = o.philox_offset2;
  p.philox_seed_output = o.philox_seed_output, p.philox_offset_output = o.philox_offset_output;
  p.encoded_softmax = o.encoded_softmax;
  p.persistent_atomic_counter = o.persistent_atomic_counter;
  p.causal_type = o.causal_type;
  p.window_left = o.window_left, p.window_right = o.window_right;
  const uint32_t bits = legacy_varlen_bits(o.varlen_type, static_cast<bool>(o.cu_seqlens_q),
                                           static_cast<bool>(o.seq_strides_q));
  std::memcpy(&p.varlen_bits, &bits, sizeof bits);
  return p;
}

inline aotriton::v3::flash::attn_bwd_params translate(const BwdParamsV6 &o) {
  aotriton::v3::flash::attn_bwd_params p;
  p.Q = o.Q, p.K = o.K, p.V = o.V, p.B = o.B;
  p.Sm_scale = o.Sm_scale;
  p.Out = o.Out, p.DO = o.DO, p.DK = o.DK, p.DV = o.DV, p.DQ = o.DQ, p.DB = o.DB;
  p.L = o.L;
  p.D = o.D;
  p.seqinfo_q0 = o.cu_seqlens_q, p.seqinfo_k0 = o.cu_seqlens_k;
  p.Max_seqlen_q = o.Max_seqlen_q, p.Max_seqlen_k = o.Max_seqlen_k;
  p.seqinfo_q1 = o.seq_strides_q, p.seqinfo_k1 = o.seq_strides_k;
  p.dropout_p = o.dropout_p;
  p.philox_seed_ptr = o.philox_seed_ptr, p.philox_offset1 = o.philox_offset1;
  p.philox_offset2 = o.philox_offset2;
  p.causal_type = o.causal_type;
  p.window_left = o.window_left, p.window_right = o.window_right;
  p.DQ_ACC = o.DQ_ACC;
  const uint32_t bits = legacy_varlen_bits(o.varlen_type, static_cast<bool>(o.cu_seqlens_q),
                                           static_cast<bool>(o.seq_strides_q));
  std::memcpy(&p.varlen_bits, &bits, sizeof bits);
  return p;
}

}  // namespace aotriton_rocm_v2

#endif
#endif
