// torch's attention ops on libaotriton_rocm through LibTorch's stable ABI
// (see aotriton_rocm_torch.h). Boxed kernels: each reads its arguments off
// the stack without taking them, decides whether libaotriton_rocm covers the
// call, and either computes it (then frees the arguments and writes the
// outputs) or hands the untouched stack to the Python route's op.

#include "aotriton_rocm_torch.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/csrc/stable/library.h>

namespace
{

namespace sd = torch::stable::detail;

constexpr int kOps = 9;
constexpr int kAtenOps = 6; // then ours, in the fallback namespace
const char *const kOpNames[kOps] = {
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_flash_attention_forward",
    "_flash_attention_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "flash_attn_forward",
    "flash_attn_backward",
    "flash_attn_kvcache",
};
// The argument kinds (see aotr_torch_config.arg_kinds) of the arguments
// these kernels read; later ones must be None.
const char *const kKnownKinds[kOps] = {
    "TTTxxxo",       "TTTTTTTTxxxxTTo",  "TTTttxxxxxooott",     "TTTTTTTTxxxxTTooo", "TTTtxxxo",
    "TTTTTTTTTxLxo", "TTTttxxxoxxxxtxx", "TTTTTTTttxxxoxxxxtx", "TTTTttttoxxxxxtxx",
};

thread_local std::string t_error;

struct TorchError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(AOTITorchError err, const char *what)
{
    if (err != AOTI_TORCH_SUCCESS)
        throw TorchError(std::string("aotriton-rocm: ") + what + " failed");
}

// An owned AtenTensorHandle.
class Owned
{
  public:
    Owned() = default;
    explicit Owned(AtenTensorHandle h) : h_(h) {}
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;
    Owned(Owned &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Owned &operator=(Owned &&o) noexcept
    {
        std::swap(h_, o.h_);
        return *this;
    }
    ~Owned()
    {
        if (h_)
            aoti_torch_delete_tensor_object(h_);
    }
    AtenTensorHandle get() const { return h_; }
    AtenTensorHandle release() { return std::exchange(h_, nullptr); }
    explicit operator bool() const { return h_ != nullptr; }

  private:
    AtenTensorHandle h_ = nullptr;
};

// A new owning handle of the tensor `h` refers to.
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

struct DTypes {
    int32_t f16, bf16, f32, i32, i64, u64;
};

// A borrowed tensor's metadata.
struct Info {
    AtenTensorHandle h = nullptr;
    int64_t dim = 0;
    const int64_t *sizes = nullptr;
    const int64_t *strides = nullptr;
    int32_t dtype = 0, device_type = 0, device_index = 0;
    void *data = nullptr;

    int64_t size(int64_t i) const { return sizes[i < 0 ? i + dim : i]; }
    int64_t stride(int64_t i) const { return strides[i < 0 ? i + dim : i]; }
    std::vector<int64_t> size_vec() const { return {sizes, sizes + dim}; }
    int64_t numel() const
    {
        int64_t n = 1;
        for (int64_t i = 0; i < dim; ++i)
            n *= sizes[i];
        return n;
    }
};

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

std::vector<int64_t> contiguous_strides(const std::vector<int64_t> &sizes, int64_t last = 0)
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

// torch.empty_like(t) (preserve_format), on the common path without a call
// into the dispatcher.
Owned empty_like(const Info &t, int32_t dtype)
{
    if (dense(t))
        return empty_strided(t.size_vec(), {t.strides, t.strides + t.dim}, dtype, t);
    if (dtype != t.dtype)
        throw TorchError("aotriton-rocm: empty_like of a non-dense tensor with another dtype");
    // aten::empty_like(self, dtype=None, layout=None, device=None,
    // pin_memory=None, memory_format=None); torch::stable::Tensor is not
    // used (its shared_ptr: see g_state).
    StableIValue stack[6] = {sd::from(share(t.h).release()), 0, 0, 0, 0, 0};
    for (int i = 1; i < 6; ++i)
        stack[i] = sd::from(std::nullopt);
    check(torch_call_dispatcher("aten::empty_like", "", stack, TORCH_ABI_VERSION),
          "aten::empty_like");
    return Owned(sd::to<AtenTensorHandle>(stack[0]));
}

struct State;
using GetStream = AOTITorchError (*)(int32_t, void **);
using ExceptionWhat = const char *(*)();

struct State {
    aotr_runtime *runtime = nullptr;
    TorchLibraryHandle library = nullptr, ours = nullptr; // aten's, the fallback namespace's
    std::string fallback[kOps];
    size_t known_args[kOps] = {};
    std::string kinds[kOps];
    bool cpu_key = false;
    GetStream get_stream = nullptr;
    ExceptionWhat exception_what = nullptr;
    DTypes dt{};
    int32_t rng_seed_rank = 0;
    int64_t rng_seed_size = 0;
    bool rng_unsigned = false;
    int64_t lse_align = 1;
    std::atomic<uint64_t> fallbacks{0};

    // Unfilled RNG-state / unused / debug-mask outputs: nothing reads or
    // writes them without dropout or a debug mask, so one set per device and
    // dtype serves every call (as in the Python route).
    std::mutex aux_mu;
    std::map<std::tuple<int32_t, int32_t, int32_t>, std::vector<Owned>> aux;

    ~State()
    {
        unregister();
        aux.clear(); // runtimes are kept: see runtime_for()
    }

    void unregister()
    {
        if (library)
            aoti_torch_delete_library_object(std::exchange(library, nullptr));
        if (ours)
            aoti_torch_delete_library_object(std::exchange(ours, nullptr));
    }

    // New handles of the (seed, offset, debug mask) of the flash ops, or of
    // the efficient op's unused int64 scalar (dtype < 0).
    std::vector<Owned> aux_outputs(const Info &like, int32_t dtype)
    {
        std::lock_guard<std::mutex> lock(aux_mu);
        auto &set = aux[{like.device_type, like.device_index, dtype}];
        if (set.empty()) {
            if (dtype < 0) {
                set.push_back(empty_strided({}, {}, dt.i64, like));
            } else {
                int32_t rng = rng_unsigned ? dt.u64 : dt.i64;
                std::vector<int64_t> seed_sizes;
                if (rng_seed_rank == 1)
                    seed_sizes.push_back(rng_seed_size);
                set.push_back(empty_strided(seed_sizes, contiguous_strides(seed_sizes), rng, like));
                set.push_back(empty_strided({}, {}, rng, like));
                set.push_back(empty_strided({0}, {1}, dtype, like));
            }
        }
        std::vector<Owned> out;
        for (auto &t : set)
            out.push_back(share(t.get()));
        return out;
    }
};

// The active state. Kernels count themselves in g_inflight before loading
// it; a state swapped out while kernels run is retired and freed by the last
// one (never waited for: a kernel may be waiting for the GIL that the
// deactivating thread holds). std::shared_ptr is avoided on purpose: its
// atomics reference glibc 2.32's __libc_single_threaded (manylinux_2_28).
std::atomic<State *> g_state{nullptr};
std::atomic<int64_t> g_inflight{0};
std::mutex g_activation_mu;
std::mutex g_retired_mu;
std::vector<State *> g_retired;

void free_retired_if_idle()
{
    std::vector<State *> done;
    {
        std::lock_guard<std::mutex> lock(g_retired_mu);
        if (g_retired.empty() || g_inflight.load() != 0)
            return;
        done.swap(g_retired);
    }
    for (State *s : done)
        delete s;
}

// Swaps in `next` (nullptr: none); the old state's registrations go at once.
void replace_state(State *next)
{
    State *old = g_state.exchange(next);
    if (!old)
        return;
    old->unregister();
    {
        std::lock_guard<std::mutex> lock(g_retired_mu);
        g_retired.push_back(old);
    }
    free_retired_if_idle();
}

struct InFlight {
    State *state;
    InFlight() : state((g_inflight.fetch_add(1), g_state.load())) {}
    ~InFlight()
    {
        if (g_inflight.fetch_sub(1) == 1)
            free_retired_if_idle();
    }
    InFlight(const InFlight &) = delete;
    InFlight &operator=(const InFlight &) = delete;
};

// Runtimes by their options, kept for the life of the process: deactivation
// cannot wait for kernels already queued on the GPU, whose code objects a
// destroyed runtime would unload. Reactivating with the same options reuses
// one (launch counts then go on from where they were).
std::mutex g_runtimes_mu;
std::map<std::string, aotr_runtime *> g_runtimes;

int fail(const std::string &msg);

bool runtime_for(const aotr_torch_config &c, aotr_runtime **out)
{
    std::string key = std::to_string(c.runtime.backend);
    for (const char *part : {c.runtime.archive_dir, c.runtime.driver_library})
        key += std::string("\n") + (part ? part : "");
    for (int32_t i = 0; i < c.archive_count; ++i)
        key += std::string("\n") + c.archives[i];
    std::lock_guard<std::mutex> lock(g_runtimes_mu);
    auto found = g_runtimes.find(key);
    if (found != g_runtimes.end()) {
        *out = found->second;
        return true;
    }
    aotr_runtime_options opts = c.runtime;
    opts.struct_size = sizeof opts;
    aotr_runtime *rt = nullptr;
    if (aotr_runtime_create(&opts, &rt) != AOTR_OK) {
        fail(std::string("aotr_runtime_create: ") + aotr_last_error());
        return false;
    }
    for (int32_t i = 0; i < c.archive_count; ++i) {
        if (aotr_runtime_add_archive(rt, c.archives[i]) != AOTR_OK) {
            fail(std::string("aotr_runtime_add_archive: ") + aotr_last_error());
            aotr_runtime_destroy(rt);
            return false;
        }
    }
    *out = g_runtimes[key] = rt;
    return true;
}

// ------------------------------------------------------------ the stack

// A boxed call's stack, read without taking ownership until consume().
struct Args {
    StableIValue *stack;
    uint64_t n;
    const std::string &kinds;

    AtenTensorHandle tensor(size_t i) const { return sd::to<AtenTensorHandle>(stack[i]); }
    // Tensor? (or an undefined Tensor): nullptr when absent.
    AtenTensorHandle opt_tensor(size_t i) const
    {
        if (kinds[i] == 'T')
            return defined(tensor(i)) ? tensor(i) : nullptr;
        auto *box = sd::to<StableIValue *>(stack[i]);
        return box ? sd::to<AtenTensorHandle>(*box) : nullptr;
    }
    double f64(size_t i) const { return sd::to<double>(stack[i]); }
    bool boolean(size_t i) const { return sd::to<bool>(stack[i]); }
    int64_t i64(size_t i) const { return sd::to<int64_t>(stack[i]); }
    bool is_none(size_t i) const { return sd::to<StableIValue *>(stack[i]) == nullptr; }
    std::optional<double> opt_f64(size_t i) const
    {
        auto *box = sd::to<StableIValue *>(stack[i]);
        return box ? std::optional<double>(sd::to<double>(*box)) : std::nullopt;
    }
    std::optional<int64_t> opt_i64(size_t i) const
    {
        auto *box = sd::to<StableIValue *>(stack[i]);
        return box ? std::optional<int64_t>(sd::to<int64_t>(*box)) : std::nullopt;
    }
    std::vector<bool> bools(size_t i) const
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
    // Argument i None (or absent from this torch's schema)?
    bool none_at(size_t i) const
    {
        if (i >= n)
            return true;
        char k = kinds[i];
        return k == 'T' ? !defined(tensor(i)) : (k == 't' || k == 'o') ? is_none(i) : false;
    }
    // Arguments past `known` (added by a later torch) left at None?
    bool rest_none(size_t known) const
    {
        for (size_t i = known; i < n; ++i) {
            char k = kinds[i];
            if (k == 'T' ? defined(tensor(i)) : (k == 't' || k == 'o') ? !is_none(i) : true)
                return false;
        }
        return true;
    }
    // Frees every argument (the kernel owns them), once the call is done.
    void consume() const
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
};

// Writes the outputs (taking the handles) over the consumed arguments.
struct Outputs {
    std::vector<StableIValue> values;
    void tensor(Owned &&t) { values.push_back(sd::from(t.release())); }
    void integer(int64_t v) { values.push_back(sd::from(v)); }
    void write(const Args &args)
    {
        args.consume();
        for (size_t i = 0; i < values.size(); ++i)
            args.stack[i] = values[i];
    }
};

// -------------------------------------------------------- aotr plumbing

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

// (B, S, H, D) as (B, H, S, D).
const int kBSHD[4] = {0, 2, 1, 3};

// The aotr_tensor of `t`, dims in `perm` order; false if it has none.
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

// A tensor the kernels read or write through `slot`: when its layout breaks
// the kernels' assumptions, a copy with rows padded to 16 elements (in the
// tensor's own dim order) takes its place; outputs are copied back.
struct Slot {
    aotr_tensor *slot;
    Info t;
    const int *perm;
    bool output;
    Owned scratch;
};

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

// Launches `call`, once more over copies if the layout needs them. True when
// the kernels ran; false to hand the call to the Python route.
template <class Call>
bool launch(const State &s, std::vector<Slot> &slots, Call call)
{
    aotr_status st = call();
    if (st == AOTR_NEEDS_LAYOUT) {
        if (!relayout(s, slots))
            return false;
        st = call();
        if (st == AOTR_OK)
            copy_back(slots);
    }
    if (st != AOTR_OK)
        t_error = std::string(aotr_status_name(st)) + ": " + aotr_last_error();
    return st == AOTR_OK;
}

struct Target {
    int32_t device = 0;
    void *stream = nullptr;
};

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
    return static_cast<float>(scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// A window side as libaotriton_rocm takes it (aotr_attn_window applies
// flash-attn's rule): None is -1, sizes past int32 are unbounded anyway.
int32_t window_side(std::optional<int64_t> w)
{
    return static_cast<int32_t>(std::clamp<int64_t>(w.value_or(-1), -1, INT32_MAX));
}

struct Problem {
    aotr_attn_problem p{};
    bool ok = true;
    Problem(const State &s, const Info &q, const Info &k, const Info &v, const int *perm)
    {
        ok = view(s, q, perm, &p.q) && view(s, k, perm, &p.k) && view(s, v, perm, &p.v);
        p.window_left = p.window_right = -1;
    }
};

// An additive attn_bias of q's dtype as the (B, H, Sq, Sk) view the kernels
// read: broadcast dims get stride 0 (never materialised). False when it does
// not broadcast; a layout the kernels cannot read surfaces as
// AOTR_NEEDS_LAYOUT and goes to the Python route, which copies it.
bool bias_view(const State &s, AtenTensorHandle h, const Info &q, const Info &k, aotr_tensor *out)
{
    Info b = info(h);
    const int64_t full[4] = {q.size(0), q.size(1), q.size(2), k.size(2)};
    if (b.dim > 4 || b.dtype != q.dtype || !view(s, b, nullptr, out))
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

// ---------------------------------------------------------------- kernels

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

// flash-attn's ALiBi slopes (fp32 (H,) or (B, H) on q's device) into the
// params; libaotriton_rocm checks their shape. False: not usable here.
bool alibi_view(const State &s, AtenTensorHandle h, const Info &q, aotr_tensor *out)
{
    Info a = info(h);
    return a.dtype == s.dt.f32 && a.device_type == q.device_type &&
           a.device_index == q.device_index && view(s, a, nullptr, out);
}

// What flash-attn's backward adds to torch's: the forward's score mods, and
// the deterministic flag (the split kernels, not the fused one).
struct BwdMods {
    float softcap = 0.0f;
    AtenTensorHandle alibi = nullptr;
    bool deterministic = false;
};

// The backward of every op: grads allocated by the caller, views in `perm`.
bool backward(const State &s, const Info &go, const Info &q, const Info &k, const Info &v,
              const Info &out, const Info &lse_in, const int *perm, Problem &pr,
              std::vector<Owned> &grads, const BwdMods &mods = {})
{
    Target tg;
    if (!pr.ok || !target(s, q, &tg))
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

// The backward into new dQ, dK, dV (laid out like q, k, v), written as the
// op's outputs; false: nothing was written.
bool backward_outputs(const State &s, const Args &a, const Info &go, const Info &q, const Info &k,
                      const Info &v, const Info &out, const Info &lse, const int *perm, Problem &pr,
                      const BwdMods &mods = {})
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

// flash-attn's variable-length batch: cu_seqlens and max seqlens.
bool varlen(const State &s, AtenTensorHandle cu_q, AtenTensorHandle cu_k, int64_t max_q,
            int64_t max_k, Problem &pr)
{
    if (!cu_q || !cu_k)
        return false;
    pr.ok = pr.ok && view(s, info(cu_q), nullptr, &pr.p.cu_seqlens_q) &&
            view(s, info(cu_k), nullptr, &pr.p.cu_seqlens_k);
    pr.p.max_seqlen_q = static_cast<int32_t>(max_q);
    pr.p.max_seqlen_k = static_cast<int32_t>(max_k);
    return max_q >= 0 && max_k >= 0 && max_q <= INT32_MAX && max_k <= INT32_MAX;
}

// The forward of a call in flash-attn's layouts, its problem set up: (B, S,
// H, D) views (`perm` kBSHD) or packed (total, H, D) ones (nullptr); `out`
// like q and `lse` (B, H, Sq) or (H, total). False: the Python route takes
// the call (nothing was written).
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
    if (packed && !varlen(s, cu_q, cu_k, a.i64(5), a.i64(6), pr))
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
    if (packed && !varlen(s, cu_q, cu_k, a.i64(8), a.i64(9), pr))
        return false;
    pr.p.scale = softmax_scale(a.opt_f64(14), q.size(-1));
    pr.p.causal = a.boolean(11);
    pr.p.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    pr.p.window_left = window_side(a.opt_i64(15));
    pr.p.window_right = window_side(a.opt_i64(16));
    return backward_outputs(s, a, go, q, k, v, out, lse, perm, pr);
}

// The problem of a dense (B, S, H, D) call of our operators, whose
// (softmax_scale, causal, window_left, window_right) arguments sit together
// from argument `at` (operator_schemas.py).
Problem dense_problem(const State &s, const Args &a, const Info &q, const Info &k, const Info &v,
                      size_t at)
{
    Problem pr(s, q, k, v, kBSHD);
    pr.p.scale = softmax_scale(a.opt_f64(at), q.size(-1));
    pr.p.causal = a.boolean(at + 1);
    pr.p.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    pr.p.window_left = window_side(a.i64(at + 2));
    pr.p.window_right = window_side(a.i64(at + 3));
    return pr;
}

// aotriton_rocm::flash_attn_forward (flash_attn_ops.py): flash-attn's dense
// (B, S, H, D) call without dropout or a debug mask; softcap and ALiBi run on
// the kernels. A packed batch goes to the Python route, which checks its
// offsets on the host first.
bool op_fwd(const State &s, const Args &a)
{
    if (a.opt_tensor(3) || a.opt_tensor(4) || a.f64(7) != 0.0 || a.boolean(14))
        return false;
    Info q = info(a.tensor(0)), k = info(a.tensor(1)), v = info(a.tensor(2));
    if (q.dim != 4 || k.dim != 4 || v.dim != 4)
        return false;
    Problem pr = dense_problem(s, a, q, k, v, 8);
    Owned out, lse;
    if (!flash_layout_fwd(s, q, k, v, kBSHD, pr, a.opt_tensor(13), static_cast<float>(a.f64(12)),
                          &out, &lse))
        return false;
    Outputs o;
    o.tensor(std::move(out));
    o.tensor(std::move(lse));
    o.tensor(empty_strided({0}, {1}, s.dt.i64, q)); // no Philox state without dropout
    o.tensor(empty_strided({0}, {1}, q.dtype, q));  // no debug mask
    o.write(a);
    return true;
}

// aotriton_rocm::flash_attn_backward: the dense (B, S, H, D) backward without
// dropout; softcap, ALiBi and `deterministic` (the split kernels) run here.
bool op_bwd(const State &s, const Args &a)
{
    if (a.opt_tensor(7) || a.opt_tensor(8) || a.f64(11) != 0.0)
        return false;
    Info go = info(a.tensor(0)), q = info(a.tensor(1)), k = info(a.tensor(2)),
         v = info(a.tensor(3)), out = info(a.tensor(4)), lse = info(a.tensor(5));
    if (q.dim != 4 || k.dim != 4 || v.dim != 4)
        return false;
    Problem pr = dense_problem(s, a, q, k, v, 12);
    BwdMods mods{static_cast<float>(a.f64(16)), a.opt_tensor(17), a.boolean(18)};
    return backward_outputs(s, a, go, q, k, v, out, lse, kBSHD, pr, mods);
}

// aotriton_rocm::flash_attn_kvcache: queries (B, Sq, H, D), or packed with
// cu_seqlens_q, over dense or paged caches (after the caller's append); the
// split workspace is allocated here, sized by the library.
bool op_kvcache(const State &s, const Args &a)
{
    Info q = info(a.tensor(0)), kc = info(a.tensor(1)), vc = info(a.tensor(2));
    AtenTensorHandle cu_q = a.opt_tensor(14);
    Target tg;
    if (q.dim != (cu_q ? 3 : 4) || q.numel() == 0 || !target(s, q, &tg))
        return false;
    aotr_attn_kvcache_params p{};
    p.struct_size = sizeof p;
    p.device = tg.device;
    p.stream = tg.stream;
    const std::pair<int, aotr_tensor *> optional[] = {
        {4, &p.k_start}, {5, &p.cache_batch_idx}, {6, &p.block_table}, {14, &p.cu_seqlens_q}};
    for (const auto &[i, slot] : optional)
        if (AtenTensorHandle h = a.opt_tensor(i); h && !view(s, info(h), nullptr, slot))
            return false;
    AtenTensorHandle alibi = a.opt_tensor(7);
    if (!view(s, q, nullptr, &p.q) || !view(s, kc, nullptr, &p.k_cache) ||
        !view(s, vc, nullptr, &p.v_cache) || !view(s, info(a.tensor(3)), nullptr, &p.k_end) ||
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
    p.num_splits = static_cast<int32_t>(std::clamp<int64_t>(a.i64(13), 0, AOTR_MAX_SPLITS));
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

// (B, H, S, D) sizes laid out as (B, S, H, D) in memory, as torch's
// efficient-attention meta kernels allocate their outputs.
Owned bshd_empty(const Info &like, int64_t last)
{
    int64_t b = like.size(0), h = like.size(1), sq = like.size(2);
    return empty_strided({b, h, sq, last}, {sq * h * last, last, h * last, 1}, like.dtype, like);
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

using Impl = bool (*)(const State &, const Args &);
const Impl kImpls[kOps] = {flash_fwd, flash_bwd, fa_fwd, fa_bwd,    eff_fwd,
                           eff_bwd,   op_fwd,    op_bwd, op_kvcache};

[[noreturn]] void fallback_failed(const State &s, int op)
{
    std::string msg = "aotriton-rocm: " + s.fallback[op] + " failed";
    const char *what = s.exception_what ? s.exception_what() : nullptr;
    if (what && *what)
        msg += std::string(": ") + what;
    throw std::runtime_error(msg);
}

template <int Op>
void boxed(StableIValue *stack, uint64_t num_args, uint64_t /*num_outputs*/)
{
    InFlight guard;
    State *s = guard.state;
    if (!s)
        throw std::runtime_error(std::string("aotriton-rocm: ") + kOpNames[Op] +
                                 " called after its extension was deactivated");
    if (num_args == s->kinds[Op].size() && num_args >= s->known_args[Op]) {
        Args args{stack, num_args, s->kinds[Op]};
        try {
            if (kImpls[Op](*s, args))
                return;
        } catch (const std::exception &e) {
            // nothing consumed yet: the Python route takes the call as it came
            t_error = e.what();
        }
    }
    s->fallbacks.fetch_add(1, std::memory_order_relaxed);
    // torch_call_dispatcher converts return i with the type of return n-1-i,
    // which breaks on the flash forward's (9 Tensors and SymInts): its py_
    // op returns the 7 Tensors, and max_q/max_k (the seqlens, as torch's
    // kernel returns them too) are put back here.
    int64_t seqlens[2] = {0, 0};
    if (Op == 0) {
        for (int i = 0; i < 2; ++i) {
            Info t = info(sd::to<AtenTensorHandle>(stack[i]));
            seqlens[i] = t.dim == 4 ? t.size(2) : 0;
        }
    }
    if (torch_call_dispatcher(s->fallback[Op].c_str(), "", stack, TORCH_ABI_VERSION) !=
        AOTI_TORCH_SUCCESS)
        fallback_failed(*s, Op);
    if (Op == 0) {
        StableIValue tensors[7];
        std::copy(stack, stack + 7, tensors);
        std::copy(tensors, tensors + 4, stack);
        stack[4] = sd::from(seqlens[0]);
        stack[5] = sd::from(seqlens[1]);
        std::copy(tensors + 4, tensors + 7, stack + 6);
    }
}

using Boxed = void (*)(StableIValue *, uint64_t, uint64_t);
const Boxed kBoxed[kOps] = {boxed<0>, boxed<1>, boxed<2>, boxed<3>, boxed<4>,
                            boxed<5>, boxed<6>, boxed<7>, boxed<8>};

GetStream find_get_stream()
{
    // libtorch_cuda / libtorch_hip, only if torch has loaded one: the same
    // binary loads into CPU-only torch.
    for (const char *lib : {"libtorch_cuda.so", "libtorch_hip.so"}) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
        if (!h)
            continue;
        void *sym = dlsym(h, "aoti_torch_get_current_cuda_stream");
        dlclose(h); // balances the NOLOAD reference; torch keeps it loaded
        if (sym)
            return reinterpret_cast<GetStream>(sym);
    }
    return nullptr;
}

int fail(const std::string &msg)
{
    t_error = msg;
    return -1;
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) int aotr_torch_activate(const aotr_torch_config *c)
{
    if (!c || c->struct_size < sizeof(aotr_torch_config))
        return fail("aotr_torch_activate: config is NULL or struct_size is too small");
    if (!c->dispatch_key || !c->fallback_namespace)
        return fail("aotr_torch_activate: dispatch_key and fallback_namespace are required");
    std::lock_guard<std::mutex> lock(g_activation_mu);
    std::unique_ptr<State> s(new State);
    const int first = c->aten_ops ? 0 : kAtenOps;
    for (int i = first; i < kOps; ++i) {
        const char *kinds = c->arg_kinds[i];
        size_t known = std::strlen(kKnownKinds[i]);
        if (!kinds || std::strncmp(kinds, kKnownKinds[i], known) != 0)
            return fail(std::string("aotr_torch_activate: ") + kOpNames[i] +
                        " has a schema this library does not know (argument kinds " +
                        (kinds ? kinds : "(null)") + ", expected " + kKnownKinds[i] + "...)");
        s->kinds[i] = kinds;
        s->known_args[i] = known;
        s->fallback[i] = std::string(c->fallback_namespace) + "::py_" + kOpNames[i];
    }
    s->cpu_key = std::strcmp(c->dispatch_key, "CPU") == 0;
    s->get_stream = find_get_stream();
    s->exception_what = reinterpret_cast<ExceptionWhat>(
        dlsym(RTLD_DEFAULT, "torch_exception_get_what_without_backtrace"));
    s->dt = {aoti_torch_dtype_float16(), aoti_torch_dtype_bfloat16(), aoti_torch_dtype_float32(),
             aoti_torch_dtype_int32(),   aoti_torch_dtype_int64(),    aoti_torch_dtype_uint64()};
    s->rng_seed_rank = c->rng_seed_rank;
    s->rng_seed_size = c->rng_seed_size;
    s->rng_unsigned = c->rng_unsigned != 0;
    s->lse_align = c->efficient_lse_align > 0 ? c->efficient_lse_align : 1;

    if (!runtime_for(*c, &s->runtime))
        return -1;

    // Replace an active set: its registrations go first.
    replace_state(nullptr);
    if (c->aten_ops && aoti_torch_library_init_impl("aten", c->dispatch_key, __FILE__, __LINE__,
                                                    &s->library) != AOTI_TORCH_SUCCESS)
        return fail(std::string("aotr_torch_activate: cannot open aten's ") + c->dispatch_key +
                    " kernels (see torch's error above)");
    if (aoti_torch_library_init_impl(c->fallback_namespace, c->dispatch_key, __FILE__, __LINE__,
                                     &s->ours) != AOTI_TORCH_SUCCESS)
        return fail(std::string("aotr_torch_activate: cannot open ") + c->fallback_namespace +
                    "'s " + c->dispatch_key + " kernels (see torch's error above)");
    for (int i = first; i < kOps; ++i) {
        if (torch_library_impl(i < kAtenOps ? s->library : s->ours, kOpNames[i], kBoxed[i],
                               TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS)
            return fail(std::string("aotr_torch_activate: registering ") + kOpNames[i] +
                        " failed (see torch's error above)");
    }
    replace_state(s.release());
    return 0;
}

__attribute__((visibility("default"))) int aotr_torch_deactivate(void)
{
    std::lock_guard<std::mutex> lock(g_activation_mu);
    replace_state(nullptr);
    return 0;
}

__attribute__((visibility("default"))) int aotr_torch_is_active(void)
{
    return g_state.load() != nullptr;
}

__attribute__((visibility("default"))) const char *aotr_torch_last_error(void)
{
    return t_error.c_str();
}

__attribute__((visibility("default"))) uint64_t aotr_torch_launch_count(const char *kernel)
{
    std::lock_guard<std::mutex> lock(g_runtimes_mu);
    uint64_t n = 0;
    for (const auto &kept : g_runtimes)
        n += aotr_runtime_launch_count(kept.second, kernel);
    return n;
}

__attribute__((visibility("default"))) uint64_t aotr_torch_fallback_count(void)
{
    InFlight guard;
    return guard.state ? guard.state->fallbacks.load(std::memory_order_relaxed) : 0;
}

} // extern "C"
