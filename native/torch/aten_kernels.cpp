// The SDPA ops' kernels (aten::_scaled_dot_product_flash_attention,
// _flash_attention_forward, _scaled_dot_product_efficient_attention and their
// backwards) on libaotriton_rocm, and the forward and backward calls the
// flash-attn operators (flash_attn_kernels.cpp) share.

#include "torch_internal.h"

namespace aotr_torch
{

namespace
{

// The backward of every op: grads allocated by the caller, views in `perm`.
bool backward(const State &s, const Info &go, const Info &q, const Info &k, const Info &v,
              const Info &out, const Info &lse_in, const int *perm, Problem &pr,
              std::vector<Owned> &grads, const BwdMods &mods = {})
{
    Target tg;
    if (!pr.ok || !same_device(q, go) || !same_device(q, out) || !same_device(q, lse_in) ||
        !target(s, q, &tg))
        return false;
    Owned lse_copy;
    Info lse = lse_in;
    if (lse.dim > 0 && lse.stride(-1) != 1) {
        std::vector<int64_t> sizes = lse.size_vec();
        lse_copy = empty_strided(sizes, contiguous_strides(sizes), lse.dtype, lse);
        check(aoti_torch_copy_(lse_copy.get(), lse.h, 0), "aoti_torch_copy_");
        lse = info(lse_copy.get());
    }
    Owned delta = empty_like(lse, s.dt.f32);
    aotr_attn_bwd_params p{};
    p.struct_size = sizeof p;
    p.device = tg.device;
    p.stream = tg.stream;
    p.problem = pr.p;
    p.softcap = mods.softcap;
    Info gi[3] = {info(grads[0].get()), info(grads[1].get()), info(grads[2].get())};
    if ((mods.alibi && !alibi_view(s, mods.alibi, q, &p.alibi_slopes)) ||
        !view(s, out, perm, &p.out) || !view(s, go, perm, &p.grad_out) ||
        !view(s, lse, nullptr, &p.lse) || !view(s, info(delta.get()), nullptr, &p.delta) ||
        !view(s, gi[0], perm, &p.grad_q) || !view(s, gi[1], perm, &p.grad_k) ||
        !view(s, gi[2], perm, &p.grad_v))
        return false;
    // The fused backward where the image has it for the problem (its head dim
    // is then a tile width, so a dense accumulator meets the layout rules):
    // faster, but dQ is summed with atomics, not bitwise deterministic.
    // torch's deterministic-algorithms flag is out of the stable ABI's reach,
    // so torch's ops cannot honour it (docs/USAGE.md, "Features in detail");
    // flash-attn's passes it.
    Owned dq_accum;
    if (!mods.deterministic &&
        aotr_attn_supported(s.runtime, tg.device, &p.problem,
                            AOTR_NEED_BACKWARD | AOTR_NEED_DQ_ACCUM) == AOTR_OK) {
        std::vector<int64_t> sizes = q.size_vec(); // in q's dim order, so `perm` applies
        dq_accum = empty_strided(sizes, contiguous_strides(sizes), s.dt.f32, q);
        check(aoti_torch_zero_(dq_accum.get()), "aoti_torch_zero_");
        if (!view(s, info(dq_accum.get()), perm, &p.grad_q_accum))
            return false;
    }
    std::vector<Slot> slots;
    slots.push_back({&p.problem.q, q, perm, false, {}});
    slots.push_back({&p.problem.k, k, perm, false, {}});
    slots.push_back({&p.problem.v, v, perm, false, {}});
    slots.push_back({&p.out, out, perm, false, {}});
    slots.push_back({&p.grad_out, go, perm, false, {}});
    slots.push_back({&p.grad_q, gi[0], perm, true, {}});
    slots.push_back({&p.grad_k, gi[1], perm, true, {}});
    slots.push_back({&p.grad_v, gi[2], perm, true, {}});
    return launch(s, slots, [&] { return aotr_attn_bwd(s.runtime, &p); });
}

// (B, H, S, D) sizes laid out as (B, S, H, D) in memory, as torch's
// efficient-attention meta kernels allocate their outputs.
Owned bshd_empty(const Info &like, int64_t last)
{
    int64_t b = like.size(0), h = like.size(1), sq = like.size(2);
    return empty_strided({b, h, sq, last}, {sq * h * last, last, h * last, 1}, like.dtype, like);
}

} // namespace

bool varlen(const State &s, const Info &q, AtenTensorHandle cu_q, AtenTensorHandle cu_k,
            int64_t max_q, int64_t max_k, Problem &pr)
{
    if (!cu_q || !cu_k)
        return false;
    Info cq = info(cu_q), ck = info(cu_k);
    pr.ok = pr.ok && same_device(q, cq) && same_device(q, ck) &&
            view(s, cq, nullptr, &pr.p.cu_seqlens_q) && view(s, ck, nullptr, &pr.p.cu_seqlens_k);
    pr.p.max_seqlen_q = static_cast<int32_t>(max_q);
    pr.p.max_seqlen_k = static_cast<int32_t>(max_k);
    return max_q >= 0 && max_k >= 0 && max_q <= INT32_MAX && max_k <= INT32_MAX;
}

// aten::_scaled_dot_product_flash_attention (B, H, S, D)
bool flash_fwd(const State &s, const Args &a)
{
    if (a.f64(3) != 0.0 || a.boolean(5) || !a.rest_none(7))
        return false;
    Info q = info(a.tensor(0)), k = info(a.tensor(1)), v = info(a.tensor(2));
    if (q.dim != 4 || k.dim != 4)
        return false;
    Problem pr(s, q, k, v, nullptr);
    Target tg;
    if (!pr.ok || !target(s, q, &tg))
        return false;
    pr.p.scale = softmax_scale(a.opt_f64(6), q.size(3));
    pr.p.causal = a.boolean(4);
    pr.p.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    Owned out = empty_like(q, q.dtype);
    std::vector<int64_t> lse_sizes{q.size(0), q.size(1), q.size(2)};
    Owned lse = empty_strided(lse_sizes, contiguous_strides(lse_sizes), s.dt.f32, q);
    aotr_attn_fwd_params p{};
    p.struct_size = sizeof p;
    p.device = tg.device;
    p.stream = tg.stream;
    p.problem = pr.p;
    Info oi = info(out.get());
    if (!view(s, oi, nullptr, &p.out) || !view(s, info(lse.get()), nullptr, &p.lse))
        return false;
    std::vector<Slot> slots;
    slots.push_back({&p.problem.q, q, nullptr, false, {}});
    slots.push_back({&p.problem.k, k, nullptr, false, {}});
    slots.push_back({&p.problem.v, v, nullptr, false, {}});
    slots.push_back({&p.out, oi, nullptr, true, {}});
    if (!launch(s, slots, [&] { return aotr_attn_fwd(s.runtime, &p); }))
        return false;
    auto aux = const_cast<State &>(s).aux_outputs(q, q.dtype);
    Outputs o;
    o.tensor(std::move(out));
    o.tensor(std::move(lse));
    o.tensor(undefined_tensor());
    o.tensor(undefined_tensor());
    o.integer(q.size(2));
    o.integer(k.size(2));
    for (auto &t : aux)
        o.tensor(std::move(t));
    o.write(a);
    return true;
}

bool backward_outputs(const State &s, const Args &a, const Info &go, const Info &q, const Info &k,
                      const Info &v, const Info &out, const Info &lse, const int *perm, Problem &pr,
                      const BwdMods &mods)
{
    std::vector<Owned> grads;
    for (const Info *t : {&q, &k, &v})
        grads.push_back(empty_like(*t, t->dtype));
    if (!backward(s, go, q, k, v, out, lse, perm, pr, grads, mods))
        return false;
    Outputs o;
    for (auto &g : grads)
        o.tensor(std::move(g));
    o.write(a);
    return true;
}

// aten::_scaled_dot_product_flash_attention_backward (B, H, S, D)
bool flash_bwd(const State &s, const Args &a)
{
    if (a.f64(10) != 0.0 || !a.rest_none(15))
        return false;
    Info go = info(a.tensor(0)), q = info(a.tensor(1)), k = info(a.tensor(2)),
         v = info(a.tensor(3)), out = info(a.tensor(4)), lse = info(a.tensor(5));
    if (q.dim != 4 || k.dim != 4)
        return false;
    Problem pr(s, q, k, v, nullptr);
    pr.p.scale = softmax_scale(a.opt_f64(14), q.size(3));
    pr.p.causal = a.boolean(11);
    pr.p.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    return backward_outputs(s, a, go, q, k, v, out, lse, nullptr, pr);
}

bool flash_layout_fwd(const State &s, const Info &q, const Info &k, const Info &v, const int *perm,
                      const Problem &pr, AtenTensorHandle alibi, float softcap, Owned *out,
                      Owned *lse)
{
    Target tg;
    if (!pr.ok || !target(s, q, &tg))
        return false;
    *out = empty_like(q, q.dtype);
    std::vector<int64_t> lse_sizes = perm ? std::vector<int64_t>{q.size(0), q.size(2), q.size(1)}
                                          : std::vector<int64_t>{q.size(1), q.size(0)};
    *lse = empty_strided(lse_sizes, contiguous_strides(lse_sizes), s.dt.f32, q);
    aotr_attn_fwd_params p{};
    p.struct_size = sizeof p;
    p.device = tg.device;
    p.stream = tg.stream;
    p.problem = pr.p;
    p.softcap = softcap;
    Info oi = info(out->get());
    if (!view(s, oi, perm, &p.out) || !view(s, info(lse->get()), nullptr, &p.lse) ||
        (alibi && !alibi_view(s, alibi, q, &p.alibi_slopes)))
        return false;
    std::vector<Slot> slots;
    slots.push_back({&p.problem.q, q, perm, false, {}});
    slots.push_back({&p.problem.k, k, perm, false, {}});
    slots.push_back({&p.problem.v, v, perm, false, {}});
    slots.push_back({&p.out, oi, perm, true, {}});
    return launch(s, slots, [&] { return aotr_attn_fwd(s.runtime, &p); });
}

// aten::_flash_attention_forward: (B, S, H, D), or packed (total, H, D).
// Arguments past scale and the window: seqused_k (13) must be None,
// alibi_slopes (14, where this torch has it) runs on the kernels, later ones
// (block_table, num_splits) must be None.
bool fa_fwd(const State &s, const Args &a)
{
    if (a.f64(7) != 0.0 || a.boolean(9) || !a.none_at(13) || !a.rest_none(15))
        return false;
    AtenTensorHandle alibi = a.n > 14 ? a.opt_tensor(14) : nullptr;
    Info q = info(a.tensor(0)), k = info(a.tensor(1)), v = info(a.tensor(2));
    AtenTensorHandle cu_q = a.opt_tensor(3), cu_k = a.opt_tensor(4);
    bool packed = cu_q || cu_k;
    if (q.dim != (packed ? 3 : 4) || k.dim != q.dim)
        return false;
    const int *perm = packed ? nullptr : kBSHD;
    Problem pr(s, q, k, v, perm);
    if (packed && !varlen(s, q, cu_q, cu_k, a.i64(5), a.i64(6), pr))
        return false;
    pr.p.scale = softmax_scale(a.opt_f64(10), q.size(-1));
    pr.p.causal = a.boolean(8);
    pr.p.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    pr.p.window_left = window_side(a.opt_i64(11));
    pr.p.window_right = window_side(a.opt_i64(12));
    Owned out, lse;
    if (!flash_layout_fwd(s, q, k, v, perm, pr, alibi, 0.0f, &out, &lse))
        return false;
    auto aux = const_cast<State &>(s).aux_outputs(q, q.dtype);
    Outputs o;
    o.tensor(std::move(out));
    o.tensor(std::move(lse));
    for (auto &t : aux)
        o.tensor(std::move(t));
    o.write(a);
    return true;
}

// aten::_flash_attention_backward
bool fa_bwd(const State &s, const Args &a)
{
    if (a.f64(10) != 0.0 || !a.rest_none(17))
        return false;
    Info go = info(a.tensor(0)), q = info(a.tensor(1)), k = info(a.tensor(2)),
         v = info(a.tensor(3)), out = info(a.tensor(4)), lse = info(a.tensor(5));
    AtenTensorHandle cu_q = a.opt_tensor(6), cu_k = a.opt_tensor(7);
    bool packed = cu_q || cu_k;
    if (q.dim != (packed ? 3 : 4) || k.dim != q.dim)
        return false;
    const int *perm = packed ? nullptr : kBSHD;
    Problem pr(s, q, k, v, perm);
    if (packed && !varlen(s, q, cu_q, cu_k, a.i64(8), a.i64(9), pr))
        return false;
    pr.p.scale = softmax_scale(a.opt_f64(14), q.size(-1));
    pr.p.causal = a.boolean(11);
    pr.p.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    pr.p.window_left = window_side(a.opt_i64(15));
    pr.p.window_right = window_side(a.opt_i64(16));
    return backward_outputs(s, a, go, q, k, v, out, lse, perm, pr);
}

// aten::_scaled_dot_product_efficient_attention (B, H, S, D)
bool eff_fwd(const State &s, const Args &a)
{
    if (a.f64(5) != 0.0 || !a.rest_none(8))
        return false;
    Info q = info(a.tensor(0)), k = info(a.tensor(1)), v = info(a.tensor(2));
    if (q.dim != 4 || k.dim != 4 || v.dim != 4)
        return false;
    bool want_lse = a.boolean(4);
    Problem pr(s, q, k, v, nullptr);
    if (AtenTensorHandle bias = a.opt_tensor(3))
        pr.ok = pr.ok && bias_view(s, bias, q, k, &pr.p.bias);
    Target tg;
    if (!pr.ok || !target(s, q, &tg))
        return false;
    pr.p.scale = softmax_scale(a.opt_f64(7), q.size(3));
    pr.p.causal = a.boolean(6);
    pr.p.causal_alignment = AOTR_CAUSAL_TOP_LEFT;
    Owned out = bshd_empty(q, v.size(3));
    int64_t sq = q.size(2);
    int64_t rows = want_lse ? (sq + s.lse_align - 1) / s.lse_align * s.lse_align : 0;
    std::vector<int64_t> lse_sizes{q.size(0), q.size(1), rows};
    Owned lse = empty_strided(lse_sizes, contiguous_strides(lse_sizes), s.dt.f32, q);
    Owned scratch_lse;
    if (!want_lse) {
        std::vector<int64_t> sizes{q.size(0), q.size(1), sq};
        scratch_lse = empty_strided(sizes, contiguous_strides(sizes), s.dt.f32, q);
    }
    aotr_attn_fwd_params p{};
    p.struct_size = sizeof p;
    p.device = tg.device;
    p.stream = tg.stream;
    p.problem = pr.p;
    Info oi = info(out.get());
    if (!view(s, oi, nullptr, &p.out) ||
        !view(s, info(want_lse ? lse.get() : scratch_lse.get()), nullptr, &p.lse))
        return false;
    std::vector<Slot> slots;
    slots.push_back({&p.problem.q, q, nullptr, false, {}});
    slots.push_back({&p.problem.k, k, nullptr, false, {}});
    slots.push_back({&p.problem.v, v, nullptr, false, {}});
    slots.push_back({&p.out, oi, nullptr, true, {}});
    if (!launch(s, slots, [&] { return aotr_attn_fwd(s.runtime, &p); }))
        return false;
    auto unused = const_cast<State &>(s).aux_outputs(q, -1);
    Outputs o;
    o.tensor(std::move(out));
    o.tensor(std::move(lse));
    o.tensor(share(unused[0].get()));
    o.tensor(std::move(unused[0]));
    o.write(a);
    return true;
}

// aten::_scaled_dot_product_efficient_attention_backward
bool eff_bwd(const State &s, const Args &a)
{
    AtenTensorHandle bias = a.opt_tensor(4);
    // the bias gradient (summed over broadcast dims) is the Python route's
    if (a.f64(9) != 0.0 || !a.rest_none(13) || (bias && a.bools(10).at(3)))
        return false;
    Info go = info(a.tensor(0)), q = info(a.tensor(1)), k = info(a.tensor(2)),
         v = info(a.tensor(3)), out = info(a.tensor(5)), lse = info(a.tensor(6));
    if (q.dim != 4 || k.dim != 4 || v.dim != 4)
        return false;
    Problem pr(s, q, k, v, nullptr);
    if (bias)
        pr.ok = pr.ok && bias_view(s, bias, q, k, &pr.p.bias);
    pr.p.scale = softmax_scale(a.opt_f64(12), q.size(3));
    pr.p.causal = a.boolean(11);
    pr.p.causal_alignment = AOTR_CAUSAL_TOP_LEFT;
    std::vector<Owned> grads;
    for (const Info *t : {&q, &k, &v})
        grads.push_back(bshd_empty(*t, t->size(3)));
    if (!backward(s, go, q, k, v, out, lse, nullptr, pr, grads))
        return false;
    Outputs o;
    for (auto &g : grads)
        o.tensor(std::move(g));
    o.tensor(undefined_tensor());
    o.write(a);
    return true;
}

} // namespace aotr_torch
