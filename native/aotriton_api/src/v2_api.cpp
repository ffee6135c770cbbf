/* AOTriton's v2 functions: check_gpu, debug_simulate_encoded_softmax, and
 * up to the 0.13 line the deprecated per-variant attention calls (through
 * the v3 path; upstream's 0.13b and 0.14 headers no longer declare them). */
#include "layer.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace aotriton::v2::flash {

using namespace aotriton_rocm_v2;

hipError_t check_gpu(aotriton::Stream /*stream: any, capturing included*/) {
  int32_t device = 0;
  aotr_status st = current_device(&device);
  if (st != AOTR_OK) return report(st, "check_gpu");
  return covers_admitted_calls(device) ? hipSuccess : hipErrorNoBinaryForGpu;
}

hipError_t debug_simulate_encoded_softmax(TensorView<4> r, float dropout_p,
                                          TensorView<0> philox_seed, TensorView<0> philox_offset1,
                                          uint64_t philox_offset2, aotriton::Stream stream) {
  int32_t device = 0;
  aotr_status st = current_device(&device);
  if (st != AOTR_OK) return report(st, "debug_simulate_encoded_softmax");
  Session s(device, stream.native());
  aotr_dropout_uniform_params d{};
  d.struct_size = sizeof d;
  d.device = device;
  d.stream = stream.native();
  d.out = core_tensor(r);
  d.philox_seed = int64_scalar(philox_seed.data_ptr());
  d.philox_offset = int64_scalar(philox_offset1.data_ptr());
  d.dropout_p = dropout_p;
  d.encode_keep = 1;
  st = philox_inputs(s, philox_offset2, {nullptr, nullptr}, &d.philox_seed, &d.philox_offset);
  if (st == AOTR_OK && d.out.dtype != AOTR_FP32)
    st = fail(AOTR_UNSUPPORTED, "the draws are written to an fp32 tensor only");
  if (st == AOTR_OK) st = s.output(&d.out, false, true);
  if (st == AOTR_OK) st = aotr_dropout_uniform(runtime(), &d);
  if (st == AOTR_OK) st = s.finish();
  return report(st, "debug_simulate_encoded_softmax");
}

#if AOTRITON_ROCM_API_LINE < 14
using v3::flash::CausalType;
using v3::flash::VarlenType;
using v3::flash::WindowValue;

namespace {

/* v2's is_causal meant top-left alignment (PyTorch's efficient op used it
 * for CausalFromTopLeft only). */
template <typename Params>
void set_causal(Params &p, bool is_causal) {
  p.causal_type = is_causal ? CausalType::WindowedAttention : CausalType::None;
  p.window_left = p.window_right = is_causal ? WindowValue::TopLeftAligned : 0;
}

template <int Rank>
LazyTensor<Rank> eager_lazy(const TensorView<Rank> &view) {
  /* the 0.11 LazyTensor has no `eager`: acquire hands the view back */
  LazyTensor<Rank> lazy;
#if AOTRITON_ROCM_API_LINE >= 12
  lazy.eager = view;
#else
  static thread_local TensorView<Rank> held;
  held = view;
  lazy.acquire = [](void *) { return held; };
  lazy.cookie = nullptr;
#endif
  return lazy;
}

hipError_t fwd(T4 q, T4 k, T4 v, T4 b, T1 cu_q, T1 cu_k, int32_t max_q, int32_t max_k,
               float sm_scale, T2 softmax_lse, T4 out, float dropout_p, T0 philox_seed,
               T0 philox_offset1, int64_t philox_offset2, T0 philox_seed_output,
               T0 philox_offset_output, T4 encoded_softmax, bool is_causal, T0 atomic,
               aotriton::Stream stream) {
  v3::flash::attn_fwd_params p;
  p.Q = q;
  p.K = k;
  p.V = v;
  p.B = b;
  p.Sm_scale = sm_scale;
  p.L = softmax_lse;
  p.Out = out;
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.Max_seqlen_q = max_q;
  p.Max_seqlen_k = max_k;
  p.dropout_p = dropout_p;
  p.philox_seed_ptr = philox_seed;
  p.philox_offset1 = philox_offset1;
  p.philox_offset2 = static_cast<uint64_t>(philox_offset2);
  p.philox_seed_output = philox_seed_output;
  p.philox_offset_output = philox_offset_output;
  p.encoded_softmax = encoded_softmax;
  p.persistent_atomic_counter = atomic;
  p.varlen_type = cu_q ? VarlenType::CompactVarlen : VarlenType::None;
  set_causal(p, is_causal);
  return forward(p, stream.native());
}

hipError_t bwd(T4 q, T4 k, T4 v, T1 cu_q, T1 cu_k, int32_t max_q, int32_t max_k, T4 b,
               float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv, T4 db, T2 softmax_lse,
               T2 delta, float dropout_p, T0 philox_seed, T0 philox_offset1, int64_t philox_offset2,
               bool is_causal, aotriton::Stream stream) {
  v3::flash::attn_bwd_params p;
  p.Q = q;
  p.K = k;
  p.V = v;
  p.B = b;
  p.Sm_scale = sm_scale;
  p.Out = out;
  p.DO = dout;
  p.DK = dk;
  p.DV = dv;
  p.DQ = dq;
  p.DB = db;
  p.L = softmax_lse;
  if (delta) p.D = eager_lazy(delta);
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  p.Max_seqlen_q = max_q;
  p.Max_seqlen_k = max_k;
  p.dropout_p = dropout_p;
  p.philox_seed_ptr = philox_seed;
  p.philox_offset1 = philox_offset1;
  p.philox_offset2 = static_cast<uint64_t>(philox_offset2);
  p.varlen_type = cu_q ? VarlenType::CompactVarlen : VarlenType::None;
  set_causal(p, is_causal);
  return backward(p, stream.native(), true);
}

}  // namespace

hipError_t attn_fwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T2 softmax_lse, T4 Out, float dropout_p,
                    T0 philox_seed, T0 philox_offset1, int64_t philox_offset2,
                    T0 philox_seed_output, T0 philox_offset_output, T4 encoded_softmax,
                    bool is_causal, T0 atomic_for_causal, aotriton::Stream stream,
                    FwdExtraArguments *) {
  return fwd(q, k, v, b, T1(), T1(), 0, 0, sm_scale, softmax_lse, Out, dropout_p, philox_seed,
             philox_offset1, philox_offset2, philox_seed_output, philox_offset_output,
             encoded_softmax, is_causal, atomic_for_causal, stream);
}

hipError_t attn_fwd_compact_varlen(T4 q, T4 k, T4 v, T4 b, T1 cu_seqlens_q, T1 cu_seqlens_k,
                                   int32_t max_seqlen_q, int32_t max_seqlen_k, float sm_scale,
                                   T2 softmax_lse, T4 Out, float dropout_p, T0 philox_seed,
                                   T0 philox_offset1, int64_t philox_offset2, T0 philox_seed_output,
                                   T0 philox_offset_output, T4 encoded_softmax, bool is_causal,
                                   T0 atomic_for_causal, aotriton::Stream stream,
                                   FwdExtraArguments *) {
  return fwd(q, k, v, b, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale,
             softmax_lse, Out, dropout_p, philox_seed, philox_offset1, philox_offset2,
             philox_seed_output, philox_offset_output, encoded_softmax, is_causal,
             atomic_for_causal, stream);
}

hipError_t attn_bwd(T4 q, T4 k, T4 v, T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk, T4 dv,
                    T4 db, T2 softmax_lse, T2 delta, float dropout_p, T0 philox_seed,
                    T0 philox_offset1, int64_t philox_offset2, bool is_causal,
                    aotriton::Stream stream, BwdExtraArguments *) {
  return bwd(q, k, v, T1(), T1(), 0, 0, b, sm_scale, out, dout, dq, dk, dv, db, softmax_lse, delta,
             dropout_p, philox_seed, philox_offset1, philox_offset2, is_causal, stream);
}

hipError_t attn_bwd_fused(T4 q, T4 k, T4 v, T4 b, float sm_scale, T4 out, T4 dout, T4 dq, T4 dk,
                          T4 dv, T4 db, T2 softmax_lse, float dropout_p, T0 philox_seed,
                          T0 philox_offset1, int64_t philox_offset2, bool is_causal,
                          aotriton::Stream stream, FusedBwdExtraArguments *) {
  return bwd(q, k, v, T1(), T1(), 0, 0, b, sm_scale, out, dout, dq, dk, dv, db, softmax_lse, T2(),
             dropout_p, philox_seed, philox_offset1, philox_offset2, is_causal, stream);
}

hipError_t attn_bwd_compact_varlen(T4 q, T4 k, T4 v, T1 cu_seqlens_q, T1 cu_seqlens_k,
                                   int32_t max_seqlen_q, int32_t max_seqlen_k, T4 b, float sm_scale,
                                   T4 out, T4 dout, T4 dq, T4 dk, T4 dv, T4 db, T2 softmax_lse,
                                   T2 delta, float dropout_p, T0 philox_seed, T0 philox_offset1,
                                   int64_t philox_offset2, bool is_causal, aotriton::Stream stream,
                                   BwdExtraArguments *) {
  return bwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, b, sm_scale, out,
             dout, dq, dk, dv, db, softmax_lse, delta, dropout_p, philox_seed, philox_offset1,
             philox_offset2, is_causal, stream);
}

#endif

}  // namespace aotriton::v2::flash
