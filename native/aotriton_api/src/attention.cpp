/* v3::flash::attn_fwd / attn_bwd: the params mapped onto aotr_attn_fwd /
 * aotr_attn_bwd, and the exported TensorView instantiations. */
#include "layer.h"
#include "legacy_params.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

namespace aotriton {
/* The instantiations the header declares `extern template`. */
template class TensorView<1>;
template class TensorView<2>;
template class TensorView<3>;
template class TensorView<4>;
}  // namespace aotriton

namespace aotriton_rocm_v2 {

aotr_tensor int64_scalar(void *data) {
  aotr_tensor t{};
  t.data = data;
  t.dtype = AOTR_INT64; /* PyTorch passes int64 or uint64 */
  return t;
}

aotr_status philox_inputs(Session &s, uint64_t offset2, std::pair<void *, void *> outputs,
                          aotr_tensor *seed, aotr_tensor *offset) {
  if (offset2 == 0 && !outputs.first && !outputs.second) return AOTR_OK;
  aotr_philox_state_params ps{};
  ps.struct_size = sizeof ps;
  ps.device = s.device();
  ps.stream = s.stream();
  ps.philox_seed = *seed;
  ps.philox_offset = *offset;
  ps.offset_add = static_cast<int64_t>(offset2);
  ps.seed_out = int64_scalar(outputs.first);
  ps.offset_out = int64_scalar(outputs.second);
  aotr_status st = AOTR_OK;
  if (!outputs.first || !outputs.second) {
    void *pair = nullptr;
    st = s.alloc(2 * sizeof(int64_t), &pair);
    if (!outputs.first) ps.seed_out.data = pair;
    if (!outputs.second) ps.offset_out.data = static_cast<int64_t *>(pair) + 1;
  }
  if (st == AOTR_OK) st = aotr_philox_state(runtime(), &ps);
  if (st == AOTR_UNSUPPORTED)
    return fail(AOTR_UNSUPPORTED,
                "dropout with philox_offset2 (graph capture) needs the "
                "philox_state kernel, which this kernel image predates: "
                "install the image wheel of this release");
  *seed = ps.seed_out;
  *offset = ps.offset_out;
  return st;
}

uint32_t legacy_varlen_bits(int8_t varlen_type, bool cu_seqlens_q, bool seq_strides_q) {
  if (!cu_seqlens_q) return 0;
  if (varlen_type == 2 /* PaddedVarlen */) return 0x0202u;
  return seq_strides_q ? 0x1313u : 0x0B0Bu;
}

namespace {

using namespace aotriton::v3::flash;

/* One side's byte of the word: THD, lengths CUMULATIVE, start REUSE (packed)
 * or ARRAY (strided); THD, INDIVIDUAL, ARRAY (K's seqused_k). */
constexpr uint32_t kPackedSide = 0x0Bu, kStridedSide = 0x13u, kUsedSide = 0x15u;

#if AOTRITON_ROCM_API_LINE >= 14
template <typename Params>
Varlen varlen_of(const Params &in) {
  Varlen v;
  std::memcpy(&v.bits, &in.varlen_bits, sizeof v.bits);
  v.q0 = in.seqinfo_q0;
  v.k0 = in.seqinfo_k0;
  v.q1 = in.seqinfo_q1;
  v.k1 = in.seqinfo_k1;
  return v;
}
#else
template <typename Params>
Varlen varlen_of(const Params &in) {
  Varlen v;
  v.q0 = in.cu_seqlens_q;
  v.k0 = in.cu_seqlens_k;
#if AOTRITON_ROCM_API_LINE >= 12
  v.q1 = in.seq_strides_q;
  v.k1 = in.seq_strides_k;
#endif
  v.bits = legacy_varlen_bits(in.varlen_type, static_cast<bool>(v.q0), static_cast<bool>(v.q1));
  return v;
}
#endif

/* What the core is told beyond the packed problem: where sequences start
 * and how many keys each has, when the word says so; the logsumexp layout. */
struct SeqInfo {
  aotr_tensor starts_q{}, starts_k{}, lens_k{};
  bool lse_th = false;
  bool placed = false;      /* sequences placed by starts / key counts: outputs keep the
                               rows outside them, so staged outputs are copied in too */
  bool core_copies = false; /* V's head dim differs: see core_stages() */
};

/* The word onto the core's packed problem (cu_seqlens) and SeqInfo. */
aotr_status map_varlen(const Varlen &v, aotr_attn_problem *p, SeqInfo *si) {
  const uint32_t qm = v.bits & 0xFFu, km = (v.bits >> 8) & 0xFFu, lse = (v.bits >> 16) & 3u;
  if (v.bits >> 18)
    return fail(AOTR_INVALID_ARGUMENT, "varlen_bits: bits 31:18 are reserved and must be zero");
  if (lse > 1)
    return fail(AOTR_INVALID_ARGUMENT, "varlen_bits: lse_layout must be VarlenLseLayout::HT or TH");
  si->lse_th = lse == 1;
  if (qm == 0 && km == 0) return AOTR_OK;
  if ((qm != kPackedSide && qm != kStridedSide) ||
      (km != kPackedSide && km != kStridedSide && km != kUsedSide))
    return fail(AOTR_UNSUPPORTED,
                "varlen_bits: this library computes dense batches and "
                "stacked (THD) sequences whose lengths are cumulative (Q, K) "
                "or individual (K), starting where the lengths say or at "
                "seqinfo_?1 (packed 0x0B0B, strided 0x1313, seqused_k 0x150B; "
                "the padded BHSD layout 0x0202 is not covered)");
  if (!v.q0 || !v.k0 || (qm == kStridedSide && !v.q1) || (km != kPackedSide && !v.k1))
    return fail(AOTR_INVALID_ARGUMENT, "varlen_bits names a seqinfo array that is a null view");
  p->cu_seqlens_q = core_tensor(v.q0);
  if (km == kUsedSide) {
    si->lens_k = core_tensor(v.k0);
  } else {
    p->cu_seqlens_k = core_tensor(v.k0);
  }
  if (qm == kStridedSide) si->starts_q = core_tensor(v.q1);
  if (km != kPackedSide) si->starts_k = core_tensor(v.k1);
  return AOTR_OK;
}

/* (1, heads, total, head_dim) -> (total, heads, head_dim), the core's packed form. */
aotr_tensor packed_rows(const aotr_tensor &t) {
  aotr_tensor p = t;
  p.rank = 3;
  p.sizes[0] = t.sizes[2];
  p.sizes[1] = t.sizes[1];
  p.sizes[2] = t.sizes[3];
  p.strides[0] = t.strides[2];
  p.strides[1] = t.strides[1];
  p.strides[2] = t.strides[3];
  return p;
}

/* causal_type and the windows: plain causal in either alignment, or a
 * bottom-right aligned window (flash-attn's window_size; -1: unbounded). */
aotr_status map_mask(int8_t causal_type, int32_t left, int32_t right, aotr_attn_problem *p) {
  p->causal = 0;
  p->causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
  p->window_left = p->window_right = -1;
  if (causal_type == CausalType::None) return AOTR_OK;
  if (causal_type != CausalType::WindowedAttention)
    return fail(AOTR_UNSUPPORTED, "causal_type must be CausalType::None or WindowedAttention");
  const int32_t br = WindowValue::BottomRightAligned, tl = WindowValue::TopLeftAligned;
  if (left == br && right == br) {
    p->causal = 1;
  } else if (left == tl && right == tl) {
    p->causal = 1;
    p->causal_alignment = AOTR_CAUSAL_TOP_LEFT;
  } else if (left == br || left == tl || right == br || right == tl) {
    return fail(AOTR_UNSUPPORTED, "window_left/right mix an alignment value with a window");
  } else {
    p->window_left = left; /* aotr_attn_window: a side < 0 is unbounded */
    p->window_right = right;
  }
  return AOTR_OK;
}

/* The core runs the call on copies of the head-dim tensors it makes itself
 * (from any strides but a unit last one) at a head dim that is not a
 * multiple of 8 and when V's head dim differs (`core_copies`): staging them
 * here too would copy them twice. */
bool core_stages(const aotr_tensor &t, bool core_copies) {
  const int64_t d = t.rank > 0 ? t.sizes[t.rank - 1] : 0;
  return (core_copies || d % 8 != 0) && (d == 1 || t.strides[t.rank - 1] == 1);
}

/* Where the forward returns the (seed, offset) it used; the backward does not. */
std::pair<void *, void *> philox_outputs(const attn_fwd_params &in) {
  return {in.philox_seed_output.data_ptr(), in.philox_offset_output.data_ptr()};
}
std::pair<void *, void *> philox_outputs(const attn_bwd_params &) { return {nullptr, nullptr}; }

/* What the forward and backward params share. */
template <typename Params>
aotr_status build_problem(const Params &in, const Varlen &vl, Session &s, aotr_attn_problem *p,
                          SeqInfo *si) {
  *p = aotr_attn_problem{};
  *si = SeqInfo{};
  const bool varlen = (vl.bits & 0xFFFFu) != 0;
  aotr_status mapped = map_varlen(vl, p, si);
  if (mapped != AOTR_OK) return mapped;
  si->placed = si->starts_q.data || si->starts_k.data || si->lens_k.data;
  if (varlen && in.Q.size(0) != 1)
    return fail(AOTR_INVALID_ARGUMENT,
                "a variable-length batch passes (1, heads, total, "
                "head_dim) views");
  p->q = core_tensor(in.Q);
  p->k = core_tensor(in.K);
  p->v = core_tensor(in.V);
  if (varlen) {
    p->q = packed_rows(p->q);
    p->k = packed_rows(p->k);
    p->v = packed_rows(p->v);
    p->max_seqlen_q = in.Max_seqlen_q;
    p->max_seqlen_k = in.Max_seqlen_k;
    /* PyTorch's efficient op passes Max_seqlen_k = 0 with cu_seqlens (its
     * TODO): upstream's kernels never needed it, the core does (a placed
     * call's side is bounded by its rows in the core). */
    int capturing = 0;
    for (int side = 0; side < 2 && !si->placed; side++) {
      int32_t *longest = side ? &p->max_seqlen_k : &p->max_seqlen_q;
      const aotr_tensor &cu = side ? p->cu_seqlens_k : p->cu_seqlens_q;
      if (*longest > 0 || !cu.data || cu.rank != 1 || cu.sizes[0] < 2 || cu.dtype != AOTR_INT32)
        continue;
      /* reading the bounds synchronises, which breaks a graph capture: there
       * the total bounds every sequence (more programs, same result) */
      if (!capturing &&
          aotr_stream_capturing(runtime(), s.device(), s.stream(), &capturing) != AOTR_OK)
        capturing = 0;
      if (capturing) {
        const int64_t total = side ? p->k.sizes[0] : p->q.sizes[0];
        *longest = static_cast<int32_t>(std::min<int64_t>(total, INT32_MAX));
        continue;
      }
      std::vector<int32_t> bounds;
      aotr_status st = s.read_i32(cu.data, static_cast<size_t>(cu.sizes[0]), &bounds);
      if (st != AOTR_OK) return st;
      for (size_t i = 0; i + 1 < bounds.size(); i++)
        *longest = std::max(*longest, bounds[i + 1] - bounds[i]);
    }
  }
  if (in.B && in.B.size(0) * in.B.size(1) * in.B.size(2) * in.B.size(3) > 0)
    p->bias = core_tensor(in.B);
  p->scale = in.Sm_scale;
  p->dropout_p = in.dropout_p;
  aotr_status st = AOTR_OK;
  if (in.dropout_p > 0.0f) {
    p->philox_seed = int64_scalar(in.philox_seed_ptr.data_ptr());
    p->philox_offset = int64_scalar(in.philox_offset1.data_ptr());
    st =
        philox_inputs(s, in.philox_offset2, philox_outputs(in), &p->philox_seed, &p->philox_offset);
  }
  if (st == AOTR_OK) st = map_mask(in.causal_type, in.window_left, in.window_right, p);
  si->core_copies = p->q.sizes[p->q.rank - 1] != p->v.sizes[p->v.rank - 1];
  if (st == AOTR_OK && !core_stages(p->q, si->core_copies)) st = s.input(&p->q);
  if (st == AOTR_OK && !core_stages(p->k, si->core_copies)) st = s.input(&p->k);
  if (st == AOTR_OK && !core_stages(p->v, si->core_copies)) st = s.input(&p->v);
  if (st == AOTR_OK) st = s.input(&p->bias);
  return st;
}

/* The logsumexp (or Delta) at `data` in the layout upstream's kernels
 * assume, whatever the view's strides: dense (batch, heads, seqlen_q)
 * contiguous; packed (heads, total_q) from the 0.12 line on. */
aotr_tensor lse_view(void *data, const aotr_attn_problem &p, bool varlen, bool th = false) {
  aotr_tensor t{};
  t.data = data;
  t.dtype = AOTR_FP32;
  /* (heads, tokens); TH (0.14's VarlenLseLayout::TH): tokens outer */
  const int64_t heads = p.q.sizes[1], tokens = varlen ? p.q.sizes[0] : p.q.sizes[2];
  const int64_t head_stride = th ? 1 : tokens, token_stride = th ? heads : 1;
  if (varlen) {
    t.rank = 2;
    t.sizes[0] = heads;
    t.sizes[1] = tokens;
    t.strides[0] = head_stride;
    t.strides[1] = token_stride;
  } else {
    t.rank = 3;
    t.sizes[0] = p.q.sizes[0];
    t.sizes[1] = heads;
    t.sizes[2] = tokens;
    t.strides[0] = heads * tokens;
    t.strides[1] = head_stride;
    t.strides[2] = token_stride;
  }
  return t;
}

/* The 0.11 line keeps a packed batch's logsumexp padded per sequence:
 * (batch * heads, max_seqlen_q). Copies between that and (heads, total_q);
 * needs the sequence bounds on the host (synchronises). */
aotr_status convert_padded_lse(Session &s, const aotr_attn_problem &p, void *padded,
                               const aotr_tensor &packed, bool to_padded) {
  std::vector<int32_t> cu;
  const size_t batch = static_cast<size_t>(p.cu_seqlens_q.sizes[0] - 1);
  aotr_status st = s.read_i32(p.cu_seqlens_q.data, batch + 1, &cu);
  const int64_t heads = p.q.sizes[1], max_q = p.max_seqlen_q;
  for (size_t b = 0; st == AOTR_OK && b < batch; b++) {
    const int64_t n = cu[b + 1] - cu[b];
    if (n < 0 || n > max_q || cu[b + 1] > packed.sizes[1])
      return fail(AOTR_INVALID_ARGUMENT, "cu_seqlens_q disagrees with Max_seqlen_q or the total");
    aotr_tensor a{}, c{};
    a.dtype = c.dtype = AOTR_FP32;
    a.rank = c.rank = 2;
    a.sizes[0] = c.sizes[0] = heads;
    a.sizes[1] = c.sizes[1] = n;
    a.data = static_cast<float *>(padded) + static_cast<int64_t>(b) * heads * max_q;
    a.strides[0] = max_q;
    a.strides[1] = 1;
    c.data = static_cast<float *>(packed.data) + cu[b];
    c.strides[0] = packed.strides[0];
    c.strides[1] = 1;
    st = to_padded ? s.copy(a, c) : s.copy(c, a);
  }
  return st;
}

/* What the core asks of a logsumexp / Delta: a 16-byte aligned base and a
 * unit last stride (its other strides are free). */
bool lse_fits(const aotr_tensor &t) {
  return t.data && (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0 && t.strides[t.rank - 1] == 1;
}

template <int Rank>
aotriton::TensorView<Rank> acquire(aotriton::LazyTensor<Rank> &lazy) {
#if AOTRITON_ROCM_API_LINE >= 12
  if (lazy.eager) return lazy.eager;
  if (lazy.acquire) return lazy.acquire(&lazy);
#else
  if (lazy.acquire) return lazy.acquire(lazy.cookie);
#endif
  return aotriton::TensorView<Rank>();
}

bool same_shape(const aotr_tensor &a, const aotr_tensor &b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; i++)
    if (a.sizes[i] != b.sizes[i]) return false;
  return true;
}

}  // namespace

hipError_t forward(const attn_fwd_params &in, void *stream) {
  int32_t device = 0;
  aotr_status st = current_device(&device);
  if (st != AOTR_OK) return report(st, "attn_fwd");
  Session s(device, stream);
  aotr_attn_fwd_params f{};
  f.struct_size = sizeof f;
  f.device = device;
  f.stream = stream;
  const Varlen vl = varlen_of(in);
  const bool varlen = (vl.bits & 0xFFFFu) != 0;
  aotr_tensor user_out = core_tensor(in.Out);
  if (varlen) user_out = packed_rows(user_out);
  aotr_tensor user_mask{};
  if (in.encoded_softmax && in.encoded_softmax.size(0) * in.encoded_softmax.size(1) > 0)
    user_mask = core_tensor(in.encoded_softmax);
  SeqInfo si;
  st = build_problem(in, vl, s, &f.problem, &si);
  const bool padded_lse = varlen && AOTRITON_ROCM_API_LINE < 12;
  if (st == AOTR_OK) {
    f.out = user_out;
    if (!core_stages(f.out, si.core_copies)) st = si.placed ? s.inout(&f.out) : s.output(&f.out);
  }
  if (st == AOTR_OK) {
    f.lse = lse_view(in.L.data_ptr(), f.problem, varlen, si.lse_th);
    if (!in.L || padded_lse)
      st = s.scratch(&f.lse, AOTR_FP32, f.lse.rank, f.lse.sizes, false);
    else if (!lse_fits(f.lse))
      st = si.placed ? s.inout(&f.lse) : s.output(&f.lse);
  }
  if (st == AOTR_OK && user_mask.data) {
    f.debug_mask = user_mask;
    st = s.output(&f.debug_mask, false, true);
  }
  f.seq_starts_q = si.starts_q;
  f.seq_starts_k = si.starts_k;
  f.seqlens_k = si.lens_k;
  if (st == AOTR_OK) st = aotr_attn_fwd(runtime(), &f);
  if (st == AOTR_OK) st = s.finish();
  if (st == AOTR_OK && padded_lse && in.L)
    st = convert_padded_lse(s, f.problem, in.L.data_ptr(), f.lse, true);
  if (st == AOTR_OK) return hipSuccess;
  hipError_t err = report(st, "attn_fwd");
  (void)s.poison(user_out);
  return err;
}

hipError_t backward(const attn_bwd_params &in, void *stream, bool deterministic) {
  int32_t device = 0;
  aotr_status st = current_device(&device);
  if (st != AOTR_OK) return report(st, "attn_bwd");
  Session s(device, stream);
  aotr_attn_bwd_params b{};
  b.struct_size = sizeof b;
  b.device = device;
  b.stream = stream;
  const Varlen vl = varlen_of(in);
  const bool varlen = (vl.bits & 0xFFFFu) != 0;
  auto rows = [varlen](aotr_tensor t) { return varlen ? packed_rows(t) : t; };
  const aotr_tensor user_dq = rows(core_tensor(in.DQ)), user_dk = rows(core_tensor(in.DK)),
                    user_dv = rows(core_tensor(in.DV));
  aotr_tensor user_db{};
  if (in.DB && in.DB.size(0) * in.DB.size(1) * in.DB.size(2) * in.DB.size(3) > 0)
    user_db = core_tensor(in.DB);
  aotriton::TensorView<2> delta_view;
  aotriton::TensorView<4> acc_view;
  SeqInfo si;
  st = build_problem(in, vl, s, &b.problem, &si);
  const bool padded_lse = varlen && AOTRITON_ROCM_API_LINE < 12;
  const aotr_attn_problem &p = b.problem;
  if (st == AOTR_OK) {
    b.out = rows(core_tensor(in.Out));
    b.grad_out = rows(core_tensor(in.DO));
    if (!core_stages(b.out, si.core_copies)) st = s.input(&b.out);
    if (st == AOTR_OK && !core_stages(b.grad_out, si.core_copies)) st = s.input(&b.grad_out);
  }
  if (st == AOTR_OK) {
    b.lse = lse_view(in.L.data_ptr(), p, varlen, si.lse_th);
    if (padded_lse) {
      aotr_tensor packed;
      st = s.scratch(&packed, AOTR_FP32, b.lse.rank, b.lse.sizes, false);
      if (st == AOTR_OK) st = convert_padded_lse(s, p, in.L.data_ptr(), packed, false);
      b.lse = packed;
    } else if (!lse_fits(b.lse)) {
      st = s.input(&b.lse, true); /* contiguous, as the Delta scratch below */
    }
  }
  b.grad_q = user_dq;
  b.grad_k = user_dk;
  b.grad_v = user_dv;
  b.grad_bias = user_db;
  for (aotr_tensor *g : {&b.grad_q, &b.grad_k, &b.grad_v})
    if (st == AOTR_OK && !core_stages(*g, si.core_copies))
      st = si.placed ? s.inout(g) : s.output(g);
  if (st == AOTR_OK) st = s.output(&b.grad_bias, true);
  if (st == AOTR_OK) {
    /* Delta: the caller's lazy tensor where it has the logsumexp's layout */
    if (!padded_lse) delta_view = acquire(in.D);
    b.delta = lse_view(delta_view.data_ptr(), p, varlen, si.lse_th);
    /* the core takes delta laid out like the (staged) logsumexp */
    if (!delta_view || delta_view.dtype() != aotriton::kFloat32 || !lse_fits(b.delta) ||
        !std::equal(b.delta.strides, b.delta.strides + b.delta.rank, b.lse.strides))
      st = s.scratch(&b.delta, AOTR_FP32, b.lse.rank, b.lse.sizes, false);
  }
  if (st == AOTR_OK && !deterministic &&
      aotr_attn_supported(runtime(), device, &p, AOTR_NEED_BACKWARD | AOTR_NEED_DQ_ACCUM) ==
          AOTR_OK) {
    /* the fused backward sums dQ in fp32 (faster; not bitwise reproducible) */
    acc_view = acquire(in.DQ_ACC);
    aotr_tensor acc = rows(core_tensor(acc_view));
    if (acc_view && acc.dtype == AOTR_FP32 && same_shape(acc, p.q) && aotr_layout_ok(&acc) &&
        is_contiguous(acc) && s.zero(acc) == AOTR_OK)
      b.grad_q_accum = acc;
  }
  b.seq_starts_q = si.starts_q;
  b.seq_starts_k = si.starts_k;
  b.seqlens_k = si.lens_k;
  if (st == AOTR_OK) st = aotr_attn_bwd(runtime(), &b);
  if (st == AOTR_OK) st = s.finish();
  in.D.free();
  in.DQ_ACC.free();
  if (st == AOTR_OK) return hipSuccess;
  hipError_t err = report(st, "attn_bwd");
  for (const aotr_tensor *t :
       {&user_dq, &user_dk, &user_dv, static_cast<const aotr_tensor *>(&user_db)})
    (void)s.poison(*t);
  return err;
}

}  // namespace aotriton_rocm_v2

namespace aotriton::v3::flash {

attn_fwd_params::attn_fwd_params() {}
attn_bwd_params::attn_bwd_params() {}

hipError_t attn_fwd(const attn_fwd_params &params, int32_t params_version, aotriton::Stream stream,
                    const attn_options *) {
#if AOTRITON_ROCM_API_LINE >= 14
  if (params_version == 3) {
    aotriton_rocm_v2::FwdParamsV3 old;
    std::memcpy(static_cast<void *>(&old), &params, sizeof old); /* trivially copyable */
    return aotriton_rocm_v2::forward(aotriton_rocm_v2::translate(old), stream.native());
  }
#endif
  if (params_version != attn_fwd_params::kVersion) return hipErrorInvalidSymbol;
  return aotriton_rocm_v2::forward(params, stream.native());
}

hipError_t attn_bwd(const attn_bwd_params &params, int32_t params_version, aotriton::Stream stream,
                    const attn_options *options) {
  if (params_version != attn_bwd_params::kVersion &&
      !(AOTRITON_ROCM_API_LINE >= 14 && params_version == 6))
    return hipErrorInvalidSymbol;
#if AOTRITON_ROCM_API_LINE >= 12
  const bool deterministic = options && options->deterministic;
#else
  (void)options;
  const bool deterministic = false;
#endif
#if AOTRITON_ROCM_API_LINE >= 14
  if (params_version == 6) {
    aotriton_rocm_v2::BwdParamsV6 old;
    std::memcpy(static_cast<void *>(&old), &params, sizeof old); /* trivially copyable */
    return aotriton_rocm_v2::backward(aotriton_rocm_v2::translate(old), stream.native(),
                                      deterministic);
  }
#endif
  return aotriton_rocm_v2::backward(params, stream.native(), deterministic);
}

}  // namespace aotriton::v3::flash
