// Prints "name value" lines: sizes, alignments and field offsets of the
// AOTriton API types, for whichever include/aotriton/ it is compiled against
// (ours or upstream's). The params' kVersion tells the API line.
#include <aotriton/flash.h>
#include <cstddef>
#include <cstdio>

namespace fl = aotriton::v3::flash;

#define SIZE(T) std::printf("sizeof %s %zu\nalignof %s %zu\n", #T, sizeof(T), #T, alignof(T))
#define OFF(T, f) std::printf("offsetof %s.%s %zu\n", #T, #f, offsetof(T, f))

#pragma GCC diagnostic ignored "-Winvalid-offsetof"

int main() {
  SIZE(aotriton::DType);
  SIZE(aotriton::Stream);
  SIZE(aotriton::TensorView<0>);
  SIZE(aotriton::TensorView<1>);
  SIZE(aotriton::TensorView<2>);
  SIZE(aotriton::TensorView<3>);
  SIZE(aotriton::TensorView<4>);
  SIZE(aotriton::LazyTensor<2>);
  SIZE(aotriton::LazyTensor<4>);
  OFF(aotriton::LazyTensor<2>, cookie);
  OFF(aotriton::LazyTensor<2>, acquire);
  OFF(aotriton::LazyTensor<2>, dispose);
  OFF(aotriton::LazyTensor<4>, cookie);
  OFF(aotriton::LazyTensor<4>, acquire);
  OFF(aotriton::LazyTensor<4>, dispose);
  SIZE(fl::attn_options);
  OFF(fl::attn_options, force_backend_index);
  SIZE(fl::attn_fwd_params);
  SIZE(fl::attn_bwd_params);
  std::printf("kVersion attn_fwd_params %d\nkVersion attn_bwd_params %d\n",
              (int)fl::attn_fwd_params::kVersion, (int)fl::attn_bwd_params::kVersion);
#define F(f) OFF(fl::attn_fwd_params, f)
  F(Q); F(K); F(V); F(B); F(A); F(Sm_scale); F(L); F(Out); F(cu_seqlens_q); F(cu_seqlens_k);
  F(Max_seqlen_q); F(Max_seqlen_k); F(dropout_p); F(philox_seed_ptr); F(philox_offset1);
  F(philox_offset2); F(philox_seed_output); F(philox_offset_output); F(encoded_softmax);
  F(persistent_atomic_counter); F(causal_type); F(varlen_type); F(window_left); F(window_right);
#undef F
#define F(f) OFF(fl::attn_bwd_params, f)
  F(Q); F(K); F(V); F(B); F(Sm_scale); F(Out); F(DO); F(DK); F(DV); F(DQ); F(DB); F(L); F(D);
  F(cu_seqlens_q); F(cu_seqlens_k); F(Max_seqlen_q); F(Max_seqlen_k); F(dropout_p);
  F(philox_seed_ptr); F(philox_offset1); F(philox_offset2); F(causal_type); F(varlen_type);
  F(window_left); F(window_right); F(DQ_ACC);
#undef F
#if defined(LAYOUT_V3_FIELDS)
  OFF(aotriton::LazyTensor<2>, eager);
  OFF(aotriton::LazyTensor<4>, eager);
  OFF(fl::attn_options, deterministic);
  OFF(fl::attn_fwd_params, seq_strides_q);
  OFF(fl::attn_fwd_params, seq_strides_k);
  OFF(fl::attn_bwd_params, seq_strides_q);
  OFF(fl::attn_bwd_params, seq_strides_k);
#endif
  return 0;
}
