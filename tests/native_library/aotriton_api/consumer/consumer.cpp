// A C++ consumer of AOTriton's API written the way PyTorch calls it
// (aten/.../hip/flash_attn/aot/mha_all_aot.hip and the efficient op in
// cuda/attention.cu, attention_backward.cu): (B, S, H, D) tensors passed as
// permute(0, 2, 1, 3) views, compact varlen as (1, H, total, D) views with
// int32 cu_seqlens, causal as WindowedAttention with both windows set to one
// alignment value, dropout through int64 device scalars, a bias and its
// gradient, LazyTensor D / DQ_ACC whose acquire allocates on first call.
// Against the 0.14 headers a variable-length batch is described by
// VarlenBits as PyTorch's aotriton_adapter.h builds it (packed, seqused_k)
// or as Transformer Engine passes cu_seqlens_padded (strided), with the
// logsumexp in either layout.
//
// It is a shared library with a C entry point per call so that a test can
// hand it device (or, on the stub driver, host) memory from Python.
#include <aotriton/flash.h>
#include <aotriton/runtime.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

extern "C" {

struct consumer_tensor {
  void *data;         // null: absent
  int32_t dtype;      // aotriton::DType
  int32_t rank;
  int64_t sizes[4];
  int64_t strides[4];
};

// mask: 0 none, 1 causal bottom-right, 2 causal top-left, 3 window (window_left/right)
struct consumer_case {
  int32_t mask, window_left, window_right, deterministic;
  float scale, dropout_p;
  int32_t max_seqlen_q, max_seqlen_k;  // varlen only
  consumer_tensor q, k, v, out, lse;   // (B, S, H, D) or (total, H, D); lse as the line wants
  consumer_tensor bias, cu_seqlens_q, cu_seqlens_k, seed, offset, encoded_softmax;
  consumer_tensor dout, dq, dk, dv, dbias;
  // graph capture: PyTorch's intra-graph offset, and where the forward returns (seed, offset)
  uint64_t philox_offset2;
  consumer_tensor seed_output, offset_output;
  // 0.14: varlen_mode 0 packed, 1 seqused_k (K's lengths in seqused_k, its
  // starts in cu_seqlens_k), 2 strided (starts in seq_starts_q/k), 3 padded; lse_th:
  // the logsumexp as (total, heads)
  int32_t varlen_mode, lse_th;
  consumer_tensor seq_starts_q, seq_starts_k, seqused_k;
};

// Allocates `bytes` of device memory (zeroed when asked); the caller keeps it alive.
typedef void *(*consumer_alloc)(int64_t bytes, int32_t zero);

int consumer_check_gpu(void *stream);
int consumer_experimental(void *stream);
int consumer_forward(const consumer_case *c, void *stream);
int consumer_forward_version(const consumer_case *c, void *stream, int32_t version);
int consumer_backward(const consumer_case *c, void *stream, consumer_alloc alloc);
int consumer_simulate(const consumer_tensor *r, float dropout_p, const consumer_tensor *seed,
                      const consumer_tensor *offset, void *stream);
int consumer_fwd_kversion(void);
int consumer_bwd_kversion(void);
}

namespace {

using aotriton::TensorView;
namespace v3 = aotriton::v3::flash;

// sdp::aotriton_adapter::mk_aotensor: a view over a tensor's sizes and strides
template <int R>
TensorView<R> view(const consumer_tensor &t) {
  std::array<uint64_t, R> sizes{}, strides{};
  for (int i = 0; i < R && i < t.rank; i++) {
    sizes[i] = static_cast<uint64_t>(t.sizes[i]);
    strides[i] = static_cast<uint64_t>(t.strides[i]);
  }
  return TensorView<R>(reinterpret_cast<intptr_t>(t.data), sizes, strides,
                       static_cast<aotriton::DType>(t.dtype));
}

// (B, S, H, D).permute(0, 2, 1, 3); a packed (total, H, D) batch as
// unsqueeze(0).transpose(1, 2): (1, H, total, D)
TensorView<4> bhsd(const consumer_tensor &t) {
  consumer_tensor p = t;
  if (t.rank == 3) {
    p.rank = 4;
    p.sizes[0] = 1, p.sizes[1] = t.sizes[1], p.sizes[2] = t.sizes[0], p.sizes[3] = t.sizes[2];
    p.strides[0] = t.sizes[0] * t.strides[0];
    p.strides[1] = t.strides[1], p.strides[2] = t.strides[0], p.strides[3] = t.strides[2];
  } else {
    std::swap(p.sizes[1], p.sizes[2]);
    std::swap(p.strides[1], p.strides[2]);
  }
  return view<4>(p);
}

TensorView<0> scalar(const consumer_tensor &t) {
  return TensorView<0>(reinterpret_cast<intptr_t>(t.data), static_cast<aotriton::DType>(t.dtype));
}

#if AOTRITON_VERSION_MINOR >= 14
// sdp::aotriton_adapter::mk_varlen_mode / mk_varlen_bits_packed / _seqused_k
constexpr v3::VarlenMode mk_varlen_mode(uint32_t length, uint32_t position) {
  v3::VarlenMode mode{};
  mode.stacked = v3::VarlenStacked::THD;
  mode.length = length & 3u;
  mode.position = position & 3u;
  return mode;
}

constexpr v3::VarlenBits mk_varlen_bits_packed() {
  const auto packed = mk_varlen_mode(v3::VarlenLength::CUMULATIVE, v3::VarlenPosition::REUSE);
  return v3::VarlenBits{.qmode = packed, .kmode = packed};
}

constexpr v3::VarlenBits mk_varlen_bits_seqused_k() {
  return v3::VarlenBits{
      .qmode = mk_varlen_mode(v3::VarlenLength::CUMULATIVE, v3::VarlenPosition::REUSE),
      .kmode = mk_varlen_mode(v3::VarlenLength::INDIVIDUAL, v3::VarlenPosition::ARRAY),
  };
}

// The seqinfo arrays and the word of a variable-length case.
template <typename Params>
void set_varlen(const consumer_case &c, Params *p) {
  p->seqinfo_q0 = view<1>(c.cu_seqlens_q);
  if (c.varlen_mode == 1) {
    p->varlen_bits = mk_varlen_bits_seqused_k();
    p->seqinfo_k0 = view<1>(c.seqused_k);
    p->seqinfo_k1 = view<1>(c.cu_seqlens_k);
  } else if (c.varlen_mode == 2) {
    const auto strided = mk_varlen_mode(v3::VarlenLength::CUMULATIVE, v3::VarlenPosition::ARRAY);
    p->varlen_bits = v3::VarlenBits{.qmode = strided, .kmode = strided};
    p->seqinfo_k0 = view<1>(c.cu_seqlens_k);
    p->seqinfo_q1 = view<1>(c.seq_starts_q);
    p->seqinfo_k1 = view<1>(c.seq_starts_k);
  } else if (c.varlen_mode == 3) {  // padded BHSD (Transformer Engine's); not covered here
    v3::VarlenMode padded{};
    padded.length = v3::VarlenLength::CUMULATIVE & 3u;
    p->varlen_bits = v3::VarlenBits{.qmode = padded, .kmode = padded};
    p->seqinfo_k0 = view<1>(c.cu_seqlens_k);
  } else {
    p->varlen_bits = mk_varlen_bits_packed();
    p->seqinfo_k0 = view<1>(c.cu_seqlens_k);
  }
  if (c.lse_th) p->varlen_bits.lse_layout = v3::VarlenLseLayout::TH & 3u;
  p->Max_seqlen_q = c.max_seqlen_q;
  p->Max_seqlen_k = c.max_seqlen_k;
}
#else
template <typename Params>
void set_varlen(const consumer_case &c, Params *p) {
  p->varlen_type = v3::VarlenType::CompactVarlen;
  p->cu_seqlens_q = view<1>(c.cu_seqlens_q);
  p->cu_seqlens_k = view<1>(c.cu_seqlens_k);
  p->Max_seqlen_q = c.max_seqlen_q;
  p->Max_seqlen_k = c.max_seqlen_k;
}
#endif

void set_mask(const consumer_case &c, int8_t *causal_type, int32_t *left, int32_t *right) {
  *causal_type = c.mask ? v3::CausalType::WindowedAttention : v3::CausalType::None;
  if (c.mask == 1) *left = *right = v3::WindowValue::BottomRightAligned;
  if (c.mask == 2) *left = *right = v3::WindowValue::TopLeftAligned;
  if (c.mask == 3) *left = c.window_left, *right = c.window_right;
}

v3::attn_fwd_params fwd_params(const consumer_case &c) {
  v3::attn_fwd_params p;
  const bool varlen = c.cu_seqlens_q.data != nullptr;
  p.Q = bhsd(c.q);
  p.K = bhsd(c.k);
  p.V = bhsd(c.v);
  p.B = c.bias.data ? view<4>(c.bias) : TensorView<4>(0, {0, 0, 0, 0}, {0, 0, 0, 0}, p.Q.dtype());
  p.Sm_scale = c.scale;
  p.L = c.lse.data ? view<2>(c.lse) : TensorView<2>(0, {0, 0}, {0, 0}, aotriton::kFloat32);
  p.Out = bhsd(c.out);
  if (varlen) set_varlen(c, &p);
  p.dropout_p = c.dropout_p;
  p.philox_seed_ptr = scalar(c.seed);
  p.philox_offset1 = scalar(c.offset);
  p.philox_offset2 = c.philox_offset2;
  p.philox_seed_output = c.seed_output.data ? scalar(c.seed_output) : TensorView<0>(0, aotriton::kUInt64);
  p.philox_offset_output =
      c.offset_output.data ? scalar(c.offset_output) : TensorView<0>(0, aotriton::kUInt64);
  p.encoded_softmax = c.encoded_softmax.data
                          ? view<4>(c.encoded_softmax)
                          : TensorView<4>(0, {0, 0, 0, 0}, {0, 0, 0, 0}, p.Q.dtype());
  p.persistent_atomic_counter = TensorView<0>(0, aotriton::kInt32);
  set_mask(c, &p.causal_type, &p.window_left, &p.window_right);
  return p;
}

// sdp::aotriton_adapter's lazy tensors: acquire allocates like a model view
struct LazyContext {
  consumer_alloc alloc;
  const TensorView<4> *like4;
  const TensorView<2> *like2;
  bool zero;
  bool acquired;
};

template <int R>
TensorView<R> allocate_like(LazyContext *ctx) {
  ctx->acquired = true;
  std::array<uint64_t, R> sizes{}, strides{};
  uint64_t n = 1;
  for (int i = R - 1; i >= 0; i--) {
    sizes[i] = R == 4 ? ctx->like4->size(i) : ctx->like2->size(i);
    strides[i] = n;
    n *= sizes[i];
  }
  void *data = ctx->alloc(static_cast<int64_t>(n * 4), ctx->zero ? 1 : 0);
  return TensorView<R>(reinterpret_cast<intptr_t>(data), sizes, strides, aotriton::kFloat32);
}

#if AOTRITON_VERSION_MINOR >= 12
template <int R>
TensorView<R> acquire(aotriton::LazyTensor<R> *self) {
  return allocate_like<R>(static_cast<LazyContext *>(self->cookie));
}
template <int R>
void dispose(aotriton::LazyTensor<R> *) {}
#else
template <int R>
TensorView<R> acquire(void *cookie) {
  return allocate_like<R>(static_cast<LazyContext *>(cookie));
}
template <int R>
void dispose(void *) {}
#endif

}  // namespace

int consumer_check_gpu(void *stream) {
  return static_cast<int>(aotriton::v2::flash::check_gpu(static_cast<hipStream_t>(stream)));
}

int consumer_experimental(void *stream) {
  return aotriton::isArchExperimentallySupported(static_cast<hipStream_t>(stream)) ? 1 : 0;
}

int consumer_forward_version(const consumer_case *c, void *stream, int32_t version) {
  v3::attn_fwd_params p = fwd_params(*c);
  return static_cast<int>(v3::attn_fwd(p, version, static_cast<hipStream_t>(stream)));
}

int consumer_forward(const consumer_case *c, void *stream) {
  return consumer_forward_version(c, stream, v3::attn_fwd_params::kVersion);
}

int consumer_backward(const consumer_case *c, void *stream, consumer_alloc alloc) {
  v3::attn_bwd_params p;
  p.Q = bhsd(c->q);
  p.K = bhsd(c->k);
  p.V = bhsd(c->v);
  p.B = c->bias.data ? view<4>(c->bias) : TensorView<4>(0, {0, 0, 0, 0}, {0, 0, 0, 0}, p.Q.dtype());
  p.Sm_scale = c->scale;
  p.Out = bhsd(c->out);
  p.DO = bhsd(c->dout);
  p.DK = bhsd(c->dk);
  p.DV = bhsd(c->dv);
  p.DQ = bhsd(c->dq);
  p.DB = c->dbias.data ? view<4>(c->dbias) : TensorView<4>(0, {0, 0, 0, 0}, {0, 0, 0, 0}, p.Q.dtype());
  p.L = view<2>(c->lse);
  LazyContext delta{alloc, nullptr, &p.L, false, false};
  LazyContext acc{alloc, &p.DQ, nullptr, true, false};
  p.D.cookie = &delta;
  p.D.acquire = &acquire<2>;
  p.D.dispose = &dispose<2>;
  p.DQ_ACC.cookie = &acc;
  p.DQ_ACC.acquire = &acquire<4>;
  p.DQ_ACC.dispose = &dispose<4>;
  const bool varlen = c->cu_seqlens_q.data != nullptr;
  if (varlen) set_varlen(*c, &p);
  p.dropout_p = c->dropout_p;
  p.philox_seed_ptr = scalar(c->seed);
  p.philox_offset1 = scalar(c->offset);
  p.philox_offset2 = c->philox_offset2;
  set_mask(*c, &p.causal_type, &p.window_left, &p.window_right);
  v3::attn_options options;
#if AOTRITON_VERSION_MINOR >= 12
  options.deterministic = c->deterministic != 0;
#endif
  hipError_t err = v3::attn_bwd(p, v3::attn_bwd_params::kVersion, static_cast<hipStream_t>(stream),
                                &options);
  // which lazy tensors the library asked for: bit 1 D, bit 2 DQ_ACC
  return static_cast<int>(err) | (delta.acquired ? 1 << 20 : 0) | (acc.acquired ? 1 << 21 : 0);
}

int consumer_simulate(const consumer_tensor *r, float dropout_p, const consumer_tensor *seed,
                      const consumer_tensor *offset, void *stream) {
  return static_cast<int>(aotriton::v2::flash::debug_simulate_encoded_softmax(
      view<4>(*r), dropout_p, scalar(*seed), scalar(*offset), 0, static_cast<hipStream_t>(stream)));
}

int consumer_fwd_kversion(void) { return v3::attn_fwd_params::kVersion; }
int consumer_bwd_kversion(void) { return v3::attn_bwd_params::kVersion; }
