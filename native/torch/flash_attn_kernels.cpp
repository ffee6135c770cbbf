// aotriton_rocm's flash-attn operators (flash_attn_ops.py) on libaotriton_rocm:
// flash_attn_forward, flash_attn_backward and flash_attn_kvcache.

#include "torch_internal.h"

#include <algorithm>
#include <optional>

namespace aotr_torch
{

namespace
{

// The problem of a call of our operators: (B, S, H, D) q/k/v, or packed
// (total, H, D) ones with cu_seqlens (`cu` the index of cu_seqlens_q, the
// schema's cu_seqlens_k and max seqlens after it) whose offsets cover every
// packed row. (softmax_scale, causal, window_left, window_right) sit together
// from argument `at` (operator_schemas.py); `perm` is set to the views' dim
// order. None: the Python route takes the call, which pads the outputs past
// the last offset or raises the library's refusal of the offsets.
std::optional<Problem> flash_problem(const State &s, const Args &a, const Info &q, const Info &k,
                                     const Info &v, size_t cu, size_t at, const int **perm)
{
    AtenTensorHandle cu_q = a.opt_tensor(cu), cu_k = a.opt_tensor(cu + 1);
    const bool packed = cu_q || cu_k;
    const int64_t rank = packed ? 3 : 4;
    if (q.dim != rank || k.dim != rank || v.dim != rank)
        return std::nullopt;
    *perm = packed ? nullptr : kBSHD;
    std::optional<Problem> out(std::in_place, s, q, k, v, *perm);
    Problem &pr = *out;
    if (packed && !varlen(s, q, cu_q, cu_k, a.i64(cu + 2), a.i64(cu + 3), pr))
        return std::nullopt;
    pr.p.scale = softmax_scale(a.opt_f64(at), q.size(-1));
    pr.p.causal = a.boolean(at + 1);
    pr.p.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    pr.p.window_left = window_side(a.i64(at + 2));
    pr.p.window_right = window_side(a.i64(at + 3));
    if (!pr.ok)
        return std::nullopt;
    if (!packed)
        return out;
    // checked on the host by the library (nothing is read during a capture: -1)
    Target tg;
    int64_t rows_q = -1, rows_k = -1;
    if (!target(s, q, &tg) ||
        aotr_varlen_rows(s.runtime, tg.device, tg.stream, &pr.p, &rows_q, &rows_k) != AOTR_OK ||
        (rows_q >= 0 && (rows_q != q.size(0) || rows_k != k.size(0))))
        return std::nullopt;
    return out;
}

} // namespace

// aotriton_rocm::flash_attn_forward (flash_attn_ops.py): flash-attn's call
// without dropout or a debug mask, dense or packed; softcap and ALiBi run on
// the kernels.
bool op_fwd(const State &s, const Args &a)
{
    if (a.f64(7) != 0.0 || a.boolean(14))
        return false;
    Info q = info(a.tensor(0)), k = info(a.tensor(1)), v = info(a.tensor(2));
    const int *perm = nullptr;
    std::optional<Problem> pr = flash_problem(s, a, q, k, v, 3, 8, &perm);
    Owned out, lse;
    if (!pr || !flash_layout_fwd(s, q, k, v, perm, *pr, a.opt_tensor(13),
                                 static_cast<float>(a.f64(12)), &out, &lse))
        return false;
    Outputs o;
    o.tensor(std::move(out));
    o.tensor(std::move(lse));
    State &state = const_cast<State &>(s);
    o.tensor(state.empty_output(q, s.dt.i64)); // no Philox state without dropout
    o.tensor(state.empty_output(q, q.dtype));  // no debug mask
    o.write(a);
    return true;
}

// aotriton_rocm::flash_attn_backward: the backward without dropout, dense or
// packed; softcap, ALiBi and `deterministic` (the split kernels) run here.
bool op_bwd(const State &s, const Args &a)
{
    if (a.f64(11) != 0.0)
        return false;
    Info go = info(a.tensor(0)), q = info(a.tensor(1)), k = info(a.tensor(2)),
         v = info(a.tensor(3)), out = info(a.tensor(4)), lse = info(a.tensor(5));
    const int *perm = nullptr;
    std::optional<Problem> pr = flash_problem(s, a, q, k, v, 7, 12, &perm);
    if (!pr)
        return false;
    BwdMods mods{static_cast<float>(a.f64(16)), a.opt_tensor(17), a.boolean(18)};
    return backward_outputs(s, a, go, q, k, v, out, lse, perm, *pr, mods);
}

// aotriton_rocm::flash_attn_kvcache: queries (B, Sq, H, D), or packed with
// cu_seqlens_q, over dense or paged caches (after the caller's append); the
// split workspace is allocated here, sized by the library.
bool op_kvcache(const State &s, const Args &a)
{
    Info q = info(a.tensor(0)), kc = info(a.tensor(1)), vc = info(a.tensor(2));
    AtenTensorHandle cu_q = a.opt_tensor(14);
    Target tg;
    if (q.dim != (cu_q ? 3 : 4) || q.numel() == 0 || !same_device(q, kc) || !same_device(q, vc) ||
        !target(s, q, &tg))
        return false;
    aotr_attn_kvcache_params p{};
    p.struct_size = sizeof p;
    p.device = tg.device;
    p.stream = tg.stream;
    const std::pair<int, aotr_tensor *> optional[] = {
        {4, &p.k_start}, {5, &p.cache_batch_idx}, {6, &p.block_table}, {14, &p.cu_seqlens_q}};
    for (const auto &[i, slot] : optional)
        if (AtenTensorHandle h = a.opt_tensor(i))
            if (Info t = info(h); !same_device(q, t) || !view(s, t, nullptr, slot))
                return false;
    AtenTensorHandle alibi = a.opt_tensor(7);
    Info k_end = info(a.tensor(3));
    if (!same_device(q, k_end) || !view(s, q, nullptr, &p.q) || !view(s, kc, nullptr, &p.k_cache) ||
        !view(s, vc, nullptr, &p.v_cache) || !view(s, k_end, nullptr, &p.k_end) ||
        (alibi && !alibi_view(s, alibi, q, &p.alibi_slopes)))
        return false;
    int64_t heads = q.size(-2), batch = cu_q ? info(cu_q).size(0) - 1 : q.size(0);
    int64_t seqlen_q = cu_q ? a.i64(15) : q.size(1);
    if (seqlen_q < 0 || seqlen_q > INT32_MAX)
        return false;
    p.max_seqlen_q = cu_q ? static_cast<int32_t>(seqlen_q) : 0;
    p.scale = softmax_scale(a.opt_f64(8), q.size(-1));
    p.causal = a.boolean(9);
    p.window_left = window_side(a.i64(10));
    p.window_right = window_side(a.i64(11));
    p.softcap = static_cast<float>(a.f64(12));
    // saturated only: the library judges the range (its refusal reaches the Python route)
    p.num_splits = static_cast<int32_t>(std::clamp<int64_t>(a.i64(13), INT32_MIN, INT32_MAX));
    Owned out = empty_like(q, q.dtype);
    std::vector<int64_t> lse_sizes = cu_q ? std::vector<int64_t>{heads, q.size(0)}
                                          : std::vector<int64_t>{batch, heads, seqlen_q};
    Owned lse = empty_strided(lse_sizes, contiguous_strides(lse_sizes), s.dt.f32, q);
    Info oi = info(out.get());
    if (!view(s, oi, nullptr, &p.out) || !view(s, info(lse.get()), nullptr, &p.lse))
        return false;
    int32_t splits = 1;
    if (aotr_attn_fwd_kvcache_splits(s.runtime, &p, &splits) != AOTR_OK)
        return false;
    Owned o_part, l_part;
    if (splits > 1) {
        std::vector<int64_t> os = {batch * heads, splits, seqlen_q, q.size(-1)};
        std::vector<int64_t> ls = {batch * heads, splits, seqlen_q};
        o_part = empty_strided(os, contiguous_strides(os), s.dt.f32, q);
        l_part = empty_strided(ls, contiguous_strides(ls), s.dt.f32, q);
        if (!view(s, info(o_part.get()), nullptr, &p.out_partial) ||
            !view(s, info(l_part.get()), nullptr, &p.lse_partial))
            return false;
        p.num_splits = splits;
    }
    std::vector<Slot> slots;
    slots.push_back({&p.q, q, nullptr, false, {}});
    slots.push_back({&p.k_cache, kc, nullptr, false, {}});
    slots.push_back({&p.v_cache, vc, nullptr, false, {}});
    slots.push_back({&p.out, oi, nullptr, true, {}});
    if (!launch(s, slots, [&] { return aotr_attn_fwd_kvcache(s.runtime, &p); }))
        return false;
    Outputs o;
    o.tensor(std::move(out));
    o.tensor(std::move(lse));
    o.write(a);
    return true;
}

} // namespace aotr_torch
