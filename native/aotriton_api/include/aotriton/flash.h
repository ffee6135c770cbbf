/* aotriton-rocm: AOTriton's v3 attention API (params structs with a
 * version number), implemented by libaotriton_v2 over libaotriton_rocm.
 *
 * Conventions of the API (facts of upstream's ABI):
 * - Q/K/V/Out are (batch, heads, seqlen, head_dim) views with any strides;
 *   a compact variable-length batch passes (1, heads, total, head_dim) views
 *   with int32 cu_seqlens_q/k (batch + 1); from the 0.14 line on the arrays
 *   are seqinfo_q0/k0 (lengths) and seqinfo_q1/k1 (start rows), and
 *   varlen_bits says per side how they are read.
 * - causal_type CausalType::WindowedAttention with window_left/right: a
 *   window in keys, or both set to WindowValue::BottomRightAligned /
 *   TopLeftAligned for plain causal attention of that alignment.
 * - A params_version other than the struct's kVersion returns
 *   hipErrorInvalidSymbol; the 0.14 line also takes the 0.12/0.13 structs
 *   (params_version 3 / 6), as upstream's 0.14 library does. */
#ifndef AOTRITON_V3_API_FLASH_ATTN_H
#define AOTRITON_V3_API_FLASH_ATTN_H

#include <aotriton/config.h>
#include "runtime.h"
#include "util.h"
#include "cpp_tune.h"
#if AOTRITON_ROCM_API_LINE < 14
#include "v2/flash.h"
#endif

#include <cstddef>

#if AOTRITON_ROCM_API_LINE >= 12
namespace AOTRITON_NS::v2::flash {

/* hipSuccess if this library computes every call PyTorch may make on the
 * stream's GPU (its kernel image is installed and covers them). */
hipError_t AOTRITON_API check_gpu(AOTRITON_NS::Stream stream);

/* Writes the dropout draws of a (batch, heads, seqlen_q, seqlen_k) problem
 * into fp32 `r` as the attention kernels use them: >= 0 where an element is
 * kept, < 0 where dropped (PyTorch's tests read the mask this way). */
hipError_t AOTRITON_API debug_simulate_encoded_softmax(
    AOTRITON_NS::TensorView<4> r, float dropout_p, AOTRITON_NS::TensorView<0> philox_seed,
    AOTRITON_NS::TensorView<0> philox_offset1, uint64_t philox_offset2, AOTRITON_NS::Stream stream);

}  // namespace AOTRITON_NS::v2::flash
#endif

namespace AOTRITON_NS::v3::flash {

using T4 = AOTRITON_NS::TensorView<4>;
using T2 = AOTRITON_NS::TensorView<2>;
using T1 = AOTRITON_NS::TensorView<1>;
using T0 = AOTRITON_NS::TensorView<0>;
using LT2 = AOTRITON_NS::LazyTensor<2>;
using LT4 = AOTRITON_NS::LazyTensor<4>;

struct AOTRITON_API attn_options {
  int force_backend_index = -1; /* ignored: one backend here */
#if AOTRITON_ROCM_API_LINE >= 12
  bool deterministic = false; /* backward: bitwise reproducible dQ */
#endif
};

/* int8_t constants rather than an enum: the params store int8_t. */
struct AOTRITON_API CausalType {
  static constexpr int8_t None = 0;
  static constexpr int8_t WindowedAttention = 3;
};

struct AOTRITON_API WindowValue {
  static constexpr int32_t TopLeftAligned = -2147483647;     /* 0x80000001 */
  static constexpr int32_t BottomRightAligned = -2147483646; /* 0x80000002 */
};

#if AOTRITON_ROCM_API_LINE < 14
struct AOTRITON_API VarlenType {
  static constexpr int8_t None = 0;
  static constexpr int8_t CompactVarlen = 1;
  static constexpr int8_t PaddedVarlen = 2;
#if AOTRITON_ROCM_API_LINE >= 12
  static constexpr int8_t StridedVarlen = 3;
#endif
};
#else
/* The 0.14 line's description of a variable-length batch: per side (Q, K)
 * three choices, plus where the logsumexp rows go. seqinfo_?0 gives the
 * lengths, seqinfo_?1 the start rows; a mode reads only what it names.
 * Constants as uint32_t, assigned into the bit-fields below. */
struct AOTRITON_API VarlenStacked {
  static constexpr uint32_t BHSD = 0; /* sequence z is batch entry z */
  static constexpr uint32_t THD = 1;  /* all sequences on one token axis (batch size 1) */
};

struct AOTRITON_API VarlenLength {
  static constexpr uint32_t MAX = 0;        /* every sequence is Max_seqlen long */
  static constexpr uint32_t CUMULATIVE = 1; /* seqinfo_?0[z + 1] - seqinfo_?0[z], (N + 1,) */
  static constexpr uint32_t INDIVIDUAL = 2; /* seqinfo_?0[z], (N,) */
};

struct AOTRITON_API VarlenPosition {
  static constexpr uint32_t IMPLIED = 0; /* 0 (BHSD) or z * Max_seqlen (THD) */
  static constexpr uint32_t REUSE = 1;   /* seqinfo_?0[z] (CUMULATIVE only) */
  static constexpr uint32_t ARRAY = 2;   /* seqinfo_?1[z] */
};

struct AOTRITON_API VarlenLseLayout {
  static constexpr uint32_t HT = 0; /* (heads, tokens): (b * H + h) * S + s */
  static constexpr uint32_t TH = 1; /* (tokens, heads): (b * S + s) * H + h */
};

/* One side's mode: one byte of the wire word (stacked bit 0, length bits
 * 2:1, position bits 4:3, bits 7:5 zero). */
struct AOTRITON_API VarlenMode {
  uint8_t stacked : 1;
  uint8_t length : 2;
  uint8_t position : 2;
  uint8_t reserved : 3;
};

/* The 32-bit word: Q's mode in bits 7:0, K's in 15:8, the logsumexp layout
 * in 17:16, the rest zero. Zero (the default) is a dense batch. (GCC takes
 * no __attribute__ next to alignas: visibility as a standard attribute.) */
struct [[gnu::visibility("default")]] alignas(uint32_t) VarlenBits {
  VarlenMode qmode;
  VarlenMode kmode;
  uint16_t lse_layout : 2;
  uint16_t reserved : 14;
};

static_assert(sizeof(VarlenMode) == 1, "VarlenMode ABI");
static_assert(sizeof(VarlenBits) == 4 && alignof(VarlenBits) == 4, "VarlenBits ABI");
#endif

struct AOTRITON_API attn_fwd_params {
  T4 Q;
  T4 K;
  T4 V;
  T4 B; /* additive bias, or a null view */
  T2 A; /* ALiBi slopes (unused by PyTorch) */
  float Sm_scale;
  T2 L; /* fp32 logsumexp, or a null view */
  T4 Out;
#if AOTRITON_ROCM_API_LINE >= 14
  T1 seqinfo_q0; /* lengths (see VarlenLength) */
  T1 seqinfo_k0;
  int32_t Max_seqlen_q = 0; /* the longest sequences of a variable-length batch */
  int32_t Max_seqlen_k = 0;
  T1 seqinfo_q1; /* start rows (VarlenPosition::ARRAY) */
  T1 seqinfo_k1;
#else
  T1 cu_seqlens_q;
  T1 cu_seqlens_k;
  int32_t Max_seqlen_q = 0; /* read with cu_seqlens_q only */
  int32_t Max_seqlen_k = 0;
#if AOTRITON_ROCM_API_LINE >= 12
  T1 seq_strides_q;
  T1 seq_strides_k;
#endif
#endif
  float dropout_p;
  T0 philox_seed_ptr; /* int64 device scalars */
  T0 philox_offset1;
  uint64_t philox_offset2; /* added to *philox_offset1 */
  T0 philox_seed_output;   /* optional: receive the seed and offset used */
  T0 philox_offset_output;
  T4 encoded_softmax; /* optional debug mask */
  T0 persistent_atomic_counter;
  int8_t causal_type;
#if AOTRITON_ROCM_API_LINE < 14
  int8_t varlen_type = 0; /* 0.14: left as padding (a 0.13 caller's byte) */
#endif
  int32_t window_left;
  int32_t window_right;
#if AOTRITON_ROCM_API_LINE >= 14
  VarlenBits varlen_bits = {};

  static constexpr int32_t kVersion = 4;
#elif AOTRITON_ROCM_API_LINE >= 12
  static constexpr int32_t kVersion = 3;
#else
  static constexpr int32_t kVersion = 1;
#endif
  attn_fwd_params();
};

hipError_t AOTRITON_API attn_fwd(const attn_fwd_params &params, int32_t params_version,
                                 AOTRITON_NS::Stream stream, const attn_options *options = nullptr);

struct AOTRITON_API attn_bwd_params {
  T4 Q;
  T4 K;
  T4 V;
  T4 B;
  float Sm_scale;
  T4 Out;
  T4 DO;
  T4 DK;
  T4 DV;
  T4 DQ;
  T4 DB; /* bias gradient, or a null view */
  T2 L;
  mutable LT2 D; /* fp32 workspace like L (acquired when needed) */
#if AOTRITON_ROCM_API_LINE >= 14
  T1 seqinfo_q0;
  T1 seqinfo_k0;
  int32_t Max_seqlen_q = 0;
  int32_t Max_seqlen_k = 0;
  T1 seqinfo_q1;
  T1 seqinfo_k1;
#else
  T1 cu_seqlens_q;
  T1 cu_seqlens_k;
  int32_t Max_seqlen_q = 0;
  int32_t Max_seqlen_k = 0;
#if AOTRITON_ROCM_API_LINE >= 12
  T1 seq_strides_q;
  T1 seq_strides_k;
#endif
#endif
  float dropout_p;
  T0 philox_seed_ptr;
  T0 philox_offset1;
  uint64_t philox_offset2;
  int8_t causal_type;
#if AOTRITON_ROCM_API_LINE < 14
  int8_t varlen_type = 0;
#endif
  int32_t window_left;
  int32_t window_right;
  mutable LT4 DQ_ACC; /* fp32 dQ accumulator like DQ (acquired when needed) */
#if AOTRITON_ROCM_API_LINE >= 14
  VarlenBits varlen_bits = {};

  static constexpr int32_t kVersion = 7;
#elif AOTRITON_ROCM_API_LINE >= 12
  static constexpr int32_t kVersion = 6;
#else
  static constexpr int32_t kVersion = 3;
#endif
  attn_bwd_params();
};

hipError_t AOTRITON_API attn_bwd(const attn_bwd_params &params, int32_t params_version,
                                 AOTRITON_NS::Stream stream, const attn_options *options = nullptr);

/* Layouts measured by compiling upstream's headers (0.11.2b; 0.12b and
 * 0.13b agree; 0.14: the 0.14.0 flash.h over 0.13b's other headers, see
 * docs/ABI.md); tests/native_library/test_aotriton_api.py checks them again. */
#define AOTRITON_ROCM_AT(T, f, off) static_assert(offsetof(T, f) == (off), #T "::" #f " offset")
AOTRITON_ROCM_AT(attn_options, force_backend_index, 0);
#if AOTRITON_ROCM_API_LINE >= 14
/* The wire word the kernels decode, from the bit-fields' allocation (GCC
 * evaluates a bit_cast of bit-fields at compile time; clang does not, and
 * the tests check the same words at run time). */
#if defined(__GNUC__) && !defined(__clang__)
namespace aotriton_rocm_detail {
constexpr uint32_t wire(VarlenBits b) { return __builtin_bit_cast(uint32_t, b); }
constexpr VarlenBits bits(uint8_t sq, uint8_t lq, uint8_t pq, uint8_t sk, uint8_t lk, uint8_t pk,
                          uint16_t lse) {
  VarlenBits b{};
  b.qmode.stacked = sq & 1u;
  b.qmode.length = lq & 3u;
  b.qmode.position = pq & 3u;
  b.kmode.stacked = sk & 1u;
  b.kmode.length = lk & 3u;
  b.kmode.position = pk & 3u;
  b.lse_layout = lse & 3u;
  return b;
}
static_assert(wire(VarlenBits{}) == 0x0u, "dense: 0");
static_assert(wire(bits(1, 1, 1, 1, 1, 1, 0)) == 0x0B0Bu, "packed: 0x0B0B");
static_assert(wire(bits(0, 1, 0, 0, 1, 0, 0)) == 0x0202u, "padded: 0x0202");
static_assert(wire(bits(1, 1, 2, 1, 1, 2, 0)) == 0x1313u, "strided: 0x1313");
static_assert(wire(bits(1, 1, 1, 1, 2, 2, 0)) == 0x150Bu, "seqused_k: 0x150B");
static_assert(wire(bits(1, 1, 1, 1, 2, 2, 1)) == 0x1150Bu, "seqused_k, TH logsumexp: 0x1150B");
}  // namespace aotriton_rocm_detail
#endif
static_assert(sizeof(attn_options) == 8, "attn_options ABI");
AOTRITON_ROCM_AT(attn_options, deterministic, 4);
static_assert(sizeof(attn_fwd_params) == 832 && alignof(attn_fwd_params) == 8,
              "attn_fwd_params ABI");
static_assert(sizeof(attn_bwd_params) == 1240 && alignof(attn_bwd_params) == 8,
              "attn_bwd_params ABI");
AOTRITON_ROCM_AT(attn_fwd_params, Q, 0);
AOTRITON_ROCM_AT(attn_fwd_params, K, 80);
AOTRITON_ROCM_AT(attn_fwd_params, V, 160);
AOTRITON_ROCM_AT(attn_fwd_params, B, 240);
AOTRITON_ROCM_AT(attn_fwd_params, A, 320);
AOTRITON_ROCM_AT(attn_fwd_params, Sm_scale, 368);
AOTRITON_ROCM_AT(attn_fwd_params, L, 376);
AOTRITON_ROCM_AT(attn_fwd_params, Out, 424);
AOTRITON_ROCM_AT(attn_fwd_params, seqinfo_q0, 504);
AOTRITON_ROCM_AT(attn_fwd_params, seqinfo_k0, 536);
AOTRITON_ROCM_AT(attn_fwd_params, Max_seqlen_q, 568);
AOTRITON_ROCM_AT(attn_fwd_params, Max_seqlen_k, 572);
AOTRITON_ROCM_AT(attn_fwd_params, seqinfo_q1, 576);
AOTRITON_ROCM_AT(attn_fwd_params, seqinfo_k1, 608);
AOTRITON_ROCM_AT(attn_fwd_params, dropout_p, 640);
AOTRITON_ROCM_AT(attn_fwd_params, philox_seed_ptr, 648);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset1, 664);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset2, 680);
AOTRITON_ROCM_AT(attn_fwd_params, philox_seed_output, 688);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset_output, 704);
AOTRITON_ROCM_AT(attn_fwd_params, encoded_softmax, 720);
AOTRITON_ROCM_AT(attn_fwd_params, persistent_atomic_counter, 800);
AOTRITON_ROCM_AT(attn_fwd_params, causal_type, 816);
AOTRITON_ROCM_AT(attn_fwd_params, window_left, 820);
AOTRITON_ROCM_AT(attn_fwd_params, window_right, 824);
AOTRITON_ROCM_AT(attn_fwd_params, varlen_bits, 828);
AOTRITON_ROCM_AT(attn_bwd_params, Q, 0);
AOTRITON_ROCM_AT(attn_bwd_params, K, 80);
AOTRITON_ROCM_AT(attn_bwd_params, V, 160);
AOTRITON_ROCM_AT(attn_bwd_params, B, 240);
AOTRITON_ROCM_AT(attn_bwd_params, Sm_scale, 320);
AOTRITON_ROCM_AT(attn_bwd_params, Out, 328);
AOTRITON_ROCM_AT(attn_bwd_params, DO, 408);
AOTRITON_ROCM_AT(attn_bwd_params, DK, 488);
AOTRITON_ROCM_AT(attn_bwd_params, DV, 568);
AOTRITON_ROCM_AT(attn_bwd_params, DQ, 648);
AOTRITON_ROCM_AT(attn_bwd_params, DB, 728);
AOTRITON_ROCM_AT(attn_bwd_params, L, 808);
AOTRITON_ROCM_AT(attn_bwd_params, D, 856);
AOTRITON_ROCM_AT(attn_bwd_params, seqinfo_q0, 928);
AOTRITON_ROCM_AT(attn_bwd_params, seqinfo_k0, 960);
AOTRITON_ROCM_AT(attn_bwd_params, Max_seqlen_q, 992);
AOTRITON_ROCM_AT(attn_bwd_params, Max_seqlen_k, 996);
AOTRITON_ROCM_AT(attn_bwd_params, seqinfo_q1, 1000);
AOTRITON_ROCM_AT(attn_bwd_params, seqinfo_k1, 1032);
AOTRITON_ROCM_AT(attn_bwd_params, dropout_p, 1064);
AOTRITON_ROCM_AT(attn_bwd_params, philox_seed_ptr, 1072);
AOTRITON_ROCM_AT(attn_bwd_params, philox_offset1, 1088);
AOTRITON_ROCM_AT(attn_bwd_params, philox_offset2, 1104);
AOTRITON_ROCM_AT(attn_bwd_params, causal_type, 1112);
AOTRITON_ROCM_AT(attn_bwd_params, window_left, 1116);
AOTRITON_ROCM_AT(attn_bwd_params, window_right, 1120);
AOTRITON_ROCM_AT(attn_bwd_params, DQ_ACC, 1128);
AOTRITON_ROCM_AT(attn_bwd_params, varlen_bits, 1232);
#elif AOTRITON_ROCM_API_LINE >= 12
static_assert(sizeof(attn_options) == 8, "attn_options ABI");
AOTRITON_ROCM_AT(attn_options, deterministic, 4);
static_assert(sizeof(attn_fwd_params) == 832 && alignof(attn_fwd_params) == 8,
              "attn_fwd_params ABI");
static_assert(sizeof(attn_bwd_params) == 1232 && alignof(attn_bwd_params) == 8,
              "attn_bwd_params ABI");
AOTRITON_ROCM_AT(attn_fwd_params, Q, 0);
AOTRITON_ROCM_AT(attn_fwd_params, K, 80);
AOTRITON_ROCM_AT(attn_fwd_params, V, 160);
AOTRITON_ROCM_AT(attn_fwd_params, B, 240);
AOTRITON_ROCM_AT(attn_fwd_params, A, 320);
AOTRITON_ROCM_AT(attn_fwd_params, Sm_scale, 368);
AOTRITON_ROCM_AT(attn_fwd_params, L, 376);
AOTRITON_ROCM_AT(attn_fwd_params, Out, 424);
AOTRITON_ROCM_AT(attn_fwd_params, cu_seqlens_q, 504);
AOTRITON_ROCM_AT(attn_fwd_params, cu_seqlens_k, 536);
AOTRITON_ROCM_AT(attn_fwd_params, Max_seqlen_q, 568);
AOTRITON_ROCM_AT(attn_fwd_params, Max_seqlen_k, 572);
AOTRITON_ROCM_AT(attn_fwd_params, seq_strides_q, 576);
AOTRITON_ROCM_AT(attn_fwd_params, seq_strides_k, 608);
AOTRITON_ROCM_AT(attn_fwd_params, dropout_p, 640);
AOTRITON_ROCM_AT(attn_fwd_params, philox_seed_ptr, 648);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset1, 664);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset2, 680);
AOTRITON_ROCM_AT(attn_fwd_params, philox_seed_output, 688);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset_output, 704);
AOTRITON_ROCM_AT(attn_fwd_params, encoded_softmax, 720);
AOTRITON_ROCM_AT(attn_fwd_params, persistent_atomic_counter, 800);
AOTRITON_ROCM_AT(attn_fwd_params, causal_type, 816);
AOTRITON_ROCM_AT(attn_fwd_params, varlen_type, 817);
AOTRITON_ROCM_AT(attn_fwd_params, window_left, 820);
AOTRITON_ROCM_AT(attn_fwd_params, window_right, 824);
AOTRITON_ROCM_AT(attn_bwd_params, Q, 0);
AOTRITON_ROCM_AT(attn_bwd_params, K, 80);
AOTRITON_ROCM_AT(attn_bwd_params, V, 160);
AOTRITON_ROCM_AT(attn_bwd_params, B, 240);
AOTRITON_ROCM_AT(attn_bwd_params, Sm_scale, 320);
AOTRITON_ROCM_AT(attn_bwd_params, Out, 328);
AOTRITON_ROCM_AT(attn_bwd_params, DO, 408);
AOTRITON_ROCM_AT(attn_bwd_params, DK, 488);
AOTRITON_ROCM_AT(attn_bwd_params, DV, 568);
AOTRITON_ROCM_AT(attn_bwd_params, DQ, 648);
AOTRITON_ROCM_AT(attn_bwd_params, DB, 728);
AOTRITON_ROCM_AT(attn_bwd_params, L, 808);
AOTRITON_ROCM_AT(attn_bwd_params, D, 856);
AOTRITON_ROCM_AT(attn_bwd_params, cu_seqlens_q, 928);
AOTRITON_ROCM_AT(attn_bwd_params, cu_seqlens_k, 960);
AOTRITON_ROCM_AT(attn_bwd_params, Max_seqlen_q, 992);
AOTRITON_ROCM_AT(attn_bwd_params, Max_seqlen_k, 996);
AOTRITON_ROCM_AT(attn_bwd_params, seq_strides_q, 1000);
AOTRITON_ROCM_AT(attn_bwd_params, seq_strides_k, 1032);
AOTRITON_ROCM_AT(attn_bwd_params, dropout_p, 1064);
AOTRITON_ROCM_AT(attn_bwd_params, philox_seed_ptr, 1072);
AOTRITON_ROCM_AT(attn_bwd_params, philox_offset1, 1088);
AOTRITON_ROCM_AT(attn_bwd_params, philox_offset2, 1104);
AOTRITON_ROCM_AT(attn_bwd_params, causal_type, 1112);
AOTRITON_ROCM_AT(attn_bwd_params, varlen_type, 1113);
AOTRITON_ROCM_AT(attn_bwd_params, window_left, 1116);
AOTRITON_ROCM_AT(attn_bwd_params, window_right, 1120);
AOTRITON_ROCM_AT(attn_bwd_params, DQ_ACC, 1128);
#else
static_assert(sizeof(attn_options) == 4, "attn_options ABI");
static_assert(sizeof(attn_fwd_params) == 768 && alignof(attn_fwd_params) == 8,
              "attn_fwd_params ABI");
static_assert(sizeof(attn_bwd_params) == 1040 && alignof(attn_bwd_params) == 8,
              "attn_bwd_params ABI");
AOTRITON_ROCM_AT(attn_fwd_params, Q, 0);
AOTRITON_ROCM_AT(attn_fwd_params, K, 80);
AOTRITON_ROCM_AT(attn_fwd_params, V, 160);
AOTRITON_ROCM_AT(attn_fwd_params, B, 240);
AOTRITON_ROCM_AT(attn_fwd_params, A, 320);
AOTRITON_ROCM_AT(attn_fwd_params, Sm_scale, 368);
AOTRITON_ROCM_AT(attn_fwd_params, L, 376);
AOTRITON_ROCM_AT(attn_fwd_params, Out, 424);
AOTRITON_ROCM_AT(attn_fwd_params, cu_seqlens_q, 504);
AOTRITON_ROCM_AT(attn_fwd_params, cu_seqlens_k, 536);
AOTRITON_ROCM_AT(attn_fwd_params, Max_seqlen_q, 568);
AOTRITON_ROCM_AT(attn_fwd_params, Max_seqlen_k, 572);
AOTRITON_ROCM_AT(attn_fwd_params, dropout_p, 576);
AOTRITON_ROCM_AT(attn_fwd_params, philox_seed_ptr, 584);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset1, 600);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset2, 616);
AOTRITON_ROCM_AT(attn_fwd_params, philox_seed_output, 624);
AOTRITON_ROCM_AT(attn_fwd_params, philox_offset_output, 640);
AOTRITON_ROCM_AT(attn_fwd_params, encoded_softmax, 656);
AOTRITON_ROCM_AT(attn_fwd_params, persistent_atomic_counter, 736);
AOTRITON_ROCM_AT(attn_fwd_params, causal_type, 752);
AOTRITON_ROCM_AT(attn_fwd_params, varlen_type, 753);
AOTRITON_ROCM_AT(attn_fwd_params, window_left, 756);
AOTRITON_ROCM_AT(attn_fwd_params, window_right, 760);
AOTRITON_ROCM_AT(attn_bwd_params, Q, 0);
AOTRITON_ROCM_AT(attn_bwd_params, K, 80);
AOTRITON_ROCM_AT(attn_bwd_params, V, 160);
AOTRITON_ROCM_AT(attn_bwd_params, B, 240);
AOTRITON_ROCM_AT(attn_bwd_params, Sm_scale, 320);
AOTRITON_ROCM_AT(attn_bwd_params, Out, 328);
AOTRITON_ROCM_AT(attn_bwd_params, DO, 408);
AOTRITON_ROCM_AT(attn_bwd_params, DK, 488);
AOTRITON_ROCM_AT(attn_bwd_params, DV, 568);
AOTRITON_ROCM_AT(attn_bwd_params, DQ, 648);
AOTRITON_ROCM_AT(attn_bwd_params, DB, 728);
AOTRITON_ROCM_AT(attn_bwd_params, L, 808);
AOTRITON_ROCM_AT(attn_bwd_params, D, 856);
AOTRITON_ROCM_AT(attn_bwd_params, cu_seqlens_q, 880);
AOTRITON_ROCM_AT(attn_bwd_params, cu_seqlens_k, 912);
AOTRITON_ROCM_AT(attn_bwd_params, Max_seqlen_q, 944);
AOTRITON_ROCM_AT(attn_bwd_params, Max_seqlen_k, 948);
AOTRITON_ROCM_AT(attn_bwd_params, dropout_p, 952);
AOTRITON_ROCM_AT(attn_bwd_params, philox_seed_ptr, 960);
AOTRITON_ROCM_AT(attn_bwd_params, philox_offset1, 976);
AOTRITON_ROCM_AT(attn_bwd_params, philox_offset2, 992);
AOTRITON_ROCM_AT(attn_bwd_params, causal_type, 1000);
AOTRITON_ROCM_AT(attn_bwd_params, varlen_type, 1001);
AOTRITON_ROCM_AT(attn_bwd_params, window_left, 1004);
AOTRITON_ROCM_AT(attn_bwd_params, window_right, 1008);
AOTRITON_ROCM_AT(attn_bwd_params, DQ_ACC, 1016);
#endif
#undef AOTRITON_ROCM_AT

}  // namespace AOTRITON_NS::v3::flash

#endif
