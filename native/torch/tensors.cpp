// Tensors, views and the boxed stack of libaotriton_rocm_torch's kernels
// (torch_internal.h): owned handles, metadata, allocation, the aotr_tensor
// views of torch tensors and the copies that meet the kernels' layout.

#include "torch_internal.h"

#include <algorithm>

namespace aotr_torch
{

thread_local std::string t_error;

void check(AOTITorchError err, const char *what)
{
    if (err != AOTI_TORCH_SUCCESS)
        throw TorchError(std::string("aotriton-rocm: ") + what + " failed");
}

Owned share(AtenTensorHandle h)
{
    AtenTensorHandle out = nullptr;
    check(aoti_torch_new_tensor_handle(h, &out), "aoti_torch_new_tensor_handle");
    return Owned(out);
}

Owned undefined_tensor()
{
    AtenTensorHandle out = nullptr;
    check(aoti_torch_new_uninitialized_tensor(&out), "aoti_torch_new_uninitialized_tensor");
    return Owned(out);
}

Info info(AtenTensorHandle h)
{
    Info t;
    t.h = h;
    check(aoti_torch_get_dim(h, &t.dim), "aoti_torch_get_dim");
    check(aoti_torch_get_sizes(h, const_cast<int64_t **>(&t.sizes)), "aoti_torch_get_sizes");
    check(aoti_torch_get_strides(h, const_cast<int64_t **>(&t.strides)), "aoti_torch_get_strides");
    check(aoti_torch_get_dtype(h, &t.dtype), "aoti_torch_get_dtype");
    check(aoti_torch_get_device_type(h, &t.device_type), "aoti_torch_get_device_type");
    check(aoti_torch_get_device_index(h, &t.device_index), "aoti_torch_get_device_index");
    check(aoti_torch_get_data_ptr(h, &t.data), "aoti_torch_get_data_ptr");
    return t;
}

bool defined(AtenTensorHandle h)
{
    bool d = false;
    check(aoti_torch_is_defined(h, &d), "aoti_torch_is_defined");
    return d;
}

Owned empty_strided(const std::vector<int64_t> &sizes, const std::vector<int64_t> &strides,
                    int32_t dtype, const Info &like)
{
    AtenTensorHandle out = nullptr;
    check(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(),
                                   dtype, like.device_type, like.device_index, &out),
          "aoti_torch_empty_strided");
    return Owned(out);
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t> &sizes, int64_t last)
{
    std::vector<int64_t> s(sizes.size());
    int64_t n = 1;
    for (size_t i = sizes.size(); i-- > 0;) {
        s[i] = n;
        int64_t extent = (i + 1 == sizes.size() && last) ? last : sizes[i];
        n *= extent > 1 ? extent : 1;
    }
    return s;
}

namespace
{

// torch's is_non_overlapping_and_dense.
bool dense(const Info &t)
{
    std::vector<int64_t> perm;
    for (int64_t i = 0; i < t.dim; ++i) {
        if (t.sizes[i] == 0)
            return true;
        if (t.sizes[i] > 1)
            perm.push_back(i);
    }
    std::sort(perm.begin(), perm.end(),
              [&](int64_t a, int64_t b) { return t.strides[a] < t.strides[b]; });
    int64_t want = 1;
    for (int64_t i : perm) {
        if (t.strides[i] != want)
            return false;
        want *= t.sizes[i];
    }
    return true;
}

} // namespace

Owned empty_like(const Info &t, int32_t dtype)
{
    if (dense(t))
        return empty_strided(t.size_vec(), {t.strides, t.strides + t.dim}, dtype, t);
    if (dtype != t.dtype)
        throw TorchError("aotriton-rocm: empty_like of a non-dense tensor with another dtype");
    // aten::empty_like(self, dtype=None, layout=None, device=None,
    // pin_memory=None, memory_format=None); torch::stable::Tensor is not
    // used (its shared_ptr: see g_state, aotriton_rocm_torch.cpp).
    StableIValue stack[6] = {sd::from(share(t.h).release()), 0, 0, 0, 0, 0};
    for (int i = 1; i < 6; ++i)
        stack[i] = sd::from(std::nullopt);
    check(torch_call_dispatcher("aten::empty_like", "", stack, TORCH_ABI_VERSION),
          "aten::empty_like");
    return Owned(sd::to<AtenTensorHandle>(stack[0]));
}

// ------------------------------------------------------------ the stack

AtenTensorHandle Args::opt_tensor(size_t i) const
{
    if (kinds[i] == 'T')
        return defined(tensor(i)) ? tensor(i) : nullptr;
    auto *box = sd::to<StableIValue *>(stack[i]);
    return box ? sd::to<AtenTensorHandle>(*box) : nullptr;
}

std::optional<double> Args::opt_f64(size_t i) const
{
    auto *box = sd::to<StableIValue *>(stack[i]);
    return box ? std::optional<double>(sd::to<double>(*box)) : std::nullopt;
}

std::optional<int64_t> Args::opt_i64(size_t i) const
{
    auto *box = sd::to<StableIValue *>(stack[i]);
    return box ? std::optional<int64_t>(sd::to<int64_t>(*box)) : std::nullopt;
}

std::vector<bool> Args::bools(size_t i) const
{
    auto list = sd::to<StableListHandle>(stack[i]);
    size_t len = 0;
    check(torch_list_size(list, &len), "torch_list_size");
    std::vector<bool> out(len);
    for (size_t j = 0; j < len; ++j) {
        StableIValue v = 0;
        check(torch_list_get_item(list, j, &v), "torch_list_get_item");
        out[j] = sd::to<bool>(v);
    }
    return out;
}

bool Args::none_at(size_t i) const
{
    if (i >= n)
        return true;
    char k = kinds[i];
    return k == 'T' ? !defined(tensor(i)) : (k == 't' || k == 'o') ? is_none(i) : false;
}

bool Args::rest_none(size_t known) const
{
    for (size_t i = known; i < n; ++i) {
        char k = kinds[i];
        if (k == 'T' ? defined(tensor(i)) : (k == 't' || k == 'o') ? !is_none(i) : true)
            return false;
    }
    return true;
}

void Args::consume() const
{
    for (size_t i = 0; i < n; ++i) {
        switch (kinds[i]) {
        case 'T': aoti_torch_delete_tensor_object(tensor(i)); break;
        case 't':
        case 'o': {
            auto *box = sd::to<StableIValue *>(stack[i]);
            if (box && kinds[i] == 't')
                aoti_torch_delete_tensor_object(sd::to<AtenTensorHandle>(*box));
            delete box; // allocated with new StableIValue by torch
            break;
        }
        case 'L': torch_delete_list(sd::to<StableListHandle>(stack[i])); break;
        default: break;
        }
    }
}

void Outputs::write(const Args &args)
{
    args.consume();
    for (size_t i = 0; i < values.size(); ++i)
        args.stack[i] = values[i];
}

// -------------------------------------------------------- aotr plumbing

namespace
{

bool aotr_dtype_of(const State &s, int32_t dtype, int32_t *out)
{
    const DTypes &d = s.dt;
    *out = dtype == d.f16    ? AOTR_FP16
           : dtype == d.bf16 ? AOTR_BF16
           : dtype == d.f32  ? AOTR_FP32
           : dtype == d.i32  ? AOTR_INT32
           : dtype == d.i64  ? AOTR_INT64
                             : AOTR_DTYPE_INVALID;
    return *out != AOTR_DTYPE_INVALID;
}

} // namespace

bool view(const State &s, const Info &t, const int *perm, aotr_tensor *out)
{
    *out = aotr_tensor{};
    if (t.dim > AOTR_MAX_RANK || !aotr_dtype_of(s, t.dtype, &out->dtype))
        return false;
    out->data = t.data;
    out->rank = static_cast<int32_t>(t.dim);
    for (int64_t i = 0; i < t.dim; ++i) {
        int64_t src = perm ? perm[i] : i;
        out->sizes[i] = t.sizes[src];
        out->strides[i] = t.strides[src];
    }
    return true;
}

bool relayout(const State &s, std::vector<Slot> &slots)
{
    for (Slot &x : slots) {
        if (aotr_layout_ok(x.slot))
            continue;
        std::vector<int64_t> sizes = x.t.size_vec();
        int64_t last = sizes.empty() ? 1 : (sizes.back() + 15) / 16 * 16;
        x.scratch = empty_strided(sizes, contiguous_strides(sizes, last), x.t.dtype, x.t);
        if (!x.output)
            check(aoti_torch_copy_(x.scratch.get(), x.t.h, 0), "aoti_torch_copy_");
        if (!view(s, info(x.scratch.get()), x.perm, x.slot) || !aotr_layout_ok(x.slot))
            return false;
    }
    return true;
}

void copy_back(std::vector<Slot> &slots)
{
    for (Slot &x : slots)
        if (x.output && x.scratch)
            check(aoti_torch_copy_(x.t.h, x.scratch.get(), 0), "aoti_torch_copy_");
}

bool target(const State &s, const Info &q, Target *out)
{
    out->device = q.device_index < 0 ? 0 : q.device_index;
    out->stream = nullptr;
    if (s.cpu_key)
        return true;
    if (!s.get_stream)
        return false;
    return s.get_stream(q.device_index, &out->stream) == AOTI_TORCH_SUCCESS;
}

float softmax_scale(std::optional<double> scale, int64_t head_dim)
{
    return static_cast<float>(scale ? *scale : aotr_attn_default_scale(head_dim));
}

int32_t window_side(std::optional<int64_t> w)
{
    return static_cast<int32_t>(std::clamp<int64_t>(w.value_or(-1), INT32_MIN, INT32_MAX));
}

Problem::Problem(const State &s, const Info &q, const Info &k, const Info &v, const int *perm)
{
    ok = same_device(q, k) && same_device(q, v) && view(s, q, perm, &p.q) &&
         view(s, k, perm, &p.k) && view(s, v, perm, &p.v);
    p.window_left = p.window_right = -1;
}

bool bias_view(const State &s, AtenTensorHandle h, const Info &q, const Info &k, aotr_tensor *out)
{
    Info b = info(h);
    const int64_t full[4] = {q.size(0), q.size(1), q.size(2), k.size(2)};
    if (b.dim > 4 || b.dtype != q.dtype || !same_device(b, q) || !view(s, b, nullptr, out))
        return false;
    for (int i = 0; i < 4; ++i) {
        int64_t j = i - (4 - b.dim);
        int64_t n = j < 0 ? 1 : b.sizes[j];
        if (n != full[i] && n != 1)
            return false;
        out->sizes[i] = full[i];
        out->strides[i] = (j < 0 || n != full[i]) ? 0 : b.strides[j];
    }
    out->rank = 4;
    return true;
}

bool alibi_view(const State &s, AtenTensorHandle h, const Info &q, aotr_tensor *out)
{
    Info a = info(h);
    return a.dtype == s.dt.f32 && same_device(a, q) && view(s, a, nullptr, out);
}

} // namespace aotr_torch
