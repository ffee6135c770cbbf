// Prints "name value" lines: sizes, alignments and field offsets of the
// AOTriton API types, for whichever include/aotriton/ it is compiled against
// (ours or upstream's). The params' kVersion tells the API line; the 0.14
// line (VarlenBits) is compiled with -DLAYOUT_VARLEN_BITS and also prints
// the 32-bit words PyTorch's adapter builds (bit positions as stored).
#include <aotriton/flash.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

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
#if defined(LAYOUT_VARLEN_BITS)
#define VARLEN_FIELDS F(seqinfo_q0); F(seqinfo_k0); F(seqinfo_q1); F(seqinfo_k1); F(varlen_bits)
#else
#define VARLEN_FIELDS F(cu_seqlens_q); F(cu_seqlens_k); F(varlen_type)
#endif
#define F(f) OFF(fl::attn_fwd_params, f)
  F(Q); F(K); F(V); F(B); F(A); F(Sm_scale); F(L); F(Out); VARLEN_FIELDS;
  F(Max_seqlen_q); F(Max_seqlen_k); F(dropout_p); F(philox_seed_ptr); F(philox_offset1);
  F(philox_offset2); F(philox_seed_output); F(philox_offset_output); F(encoded_softmax);
  F(persistent_atomic_counter); F(causal_type); F(window_left); F(window_right);
#undef F
#define F(f) OFF(fl::attn_bwd_params, f)
  F(Q); F(K); F(V); F(B); F(Sm_scale); F(Out); F(DO); F(DK); F(DV); F(DQ); F(DB); F(L); F(D);
  VARLEN_FIELDS; F(Max_seqlen_q); F(Max_seqlen_k); F(dropout_p);
  F(philox_seed_ptr); F(philox_offset1); F(philox_offset2); F(causal_type);
  F(window_left); F(window_right); F(DQ_ACC);
#undef F
#if defined(LAYOUT_VARLEN_BITS)
  SIZE(fl::VarlenMode);
  SIZE(fl::VarlenBits);
  // packed, seqused_k and strided as PyTorch's adapter and TE spell them, TH logsumexp
  const uint32_t modes[][7] = {{1, 1, 1, 1, 1, 1, 0}, {1, 1, 1, 1, 2, 2, 0}, {1, 1, 2, 1, 1, 2, 0},
                               {1, 1, 1, 1, 2, 2, 1}, {0, 1, 0, 0, 1, 0, 0}};
  const char *names[] = {"packed", "seqused_k", "strided", "seqused_k_th", "padded"};
  for (int i = 0; i < 5; i++) {
    fl::VarlenBits b{};
    b.qmode.stacked = modes[i][0] & 1u;
    b.qmode.length = modes[i][1] & 3u;
    b.qmode.position = modes[i][2] & 3u;
    b.kmode.stacked = modes[i][3] & 1u;
    b.kmode.length = modes[i][4] & 3u;
    b.kmode.position = modes[i][5] & 3u;
    b.lse_layout = modes[i][6] & 3u;
    uint32_t word = 0;
    std::memcpy(&word, &b, sizeof word);
    std::printf("wire %s %u\n", names[i], word);
  }
#endif
#if defined(LAYOUT_V3_FIELDS)
  OFF(aotriton::LazyTensor<2>, eager);
  OFF(aotriton::LazyTensor<4>, eager);
  OFF(fl::attn_options, deterministic);
#if !defined(LAYOUT_VARLEN_BITS)
  OFF(fl::attn_fwd_params, seq_strides_q);
  OFF(fl::attn_fwd_params, seq_strides_k);
  OFF(fl::attn_bwd_params, seq_strides_q);
  OFF(fl::attn_bwd_params, seq_strides_k);
#endif
#endif
  return 0;
}
