// Internal to libaotriton_rocm_torch: what aotriton_rocm_torch.cpp (activation,
// the registrations, the boxed kernels), tensors.cpp (tensors, views and the
// boxed stack), aten_kernels.cpp (the SDPA ops) and flash_attn_kernels.cpp
// (aotriton_rocm's flash-attn operators) share.
#ifndef AOTRITON_ROCM_TORCH_INTERNAL_H
#define AOTRITON_ROCM_TORCH_INTERNAL_H

#include "aotriton_rocm_torch.h"

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/csrc/stable/library.h>

namespace aotr_torch
{

namespace sd = torch::stable::detail;

constexpr int kOps = 9;

extern thread_local std::string t_error;

struct TorchError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(AOTITorchError err, const char *what);

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
Owned share(AtenTensorHandle h);
Owned undefined_tensor();

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

Info info(AtenTensorHandle h);
// On one device: the kernels read every tensor of a call on q's device (a
// tensor elsewhere goes to the Python route, which names it).
inline bool same_device(const Info &a, const Info &b)
{
    return a.device_type == b.device_type && a.device_index == b.device_index;
}
bool defined(AtenTensorHandle h);
Owned empty_strided(const std::vector<int64_t> &sizes, const std::vector<int64_t> &strides,
                    int32_t dtype, const Info &like);
std::vector<int64_t> contiguous_strides(const std::vector<int64_t> &sizes, int64_t last = 0);
// torch.empty_like(t) (preserve_format), on the common path without a call
// into the dispatcher.
Owned empty_like(const Info &t, int32_t dtype);

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
    std::map<std::tuple<int32_t, int32_t, int32_t>, Owned> empties;

    ~State()
    {
        unregister();
        aux.clear(); // runtimes are kept: see runtime_for()
        empties.clear();
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
    std::vector<Owned> aux_outputs(const Info &like, int32_t dtype);
    // A new handle of the one (0,) tensor of `dtype` on like's device that
    // every call shares (our flash-attn operators' Philox state and debug
    // mask without dropout: nothing reads or writes them).
    Owned empty_output(const Info &like, int32_t dtype);
};

// ------------------------------------------------------------ the stack

// A boxed call's stack, read without taking ownership until consume().
struct Args {
    StableIValue *stack;
    uint64_t n;
    const std::string &kinds;

    AtenTensorHandle tensor(size_t i) const { return sd::to<AtenTensorHandle>(stack[i]); }
    // Tensor? (or an undefined Tensor): nullptr when absent.
    AtenTensorHandle opt_tensor(size_t i) const;
    double f64(size_t i) const { return sd::to<double>(stack[i]); }
    bool boolean(size_t i) const { return sd::to<bool>(stack[i]); }
    int64_t i64(size_t i) const { return sd::to<int64_t>(stack[i]); }
    bool is_none(size_t i) const { return sd::to<StableIValue *>(stack[i]) == nullptr; }
    std::optional<double> opt_f64(size_t i) const;
    std::optional<int64_t> opt_i64(size_t i) const;
    std::vector<bool> bools(size_t i) const;
    // Argument i None (or absent from this torch's schema)?
    bool none_at(size_t i) const;
    // Arguments past `known` (added by a later torch) left at None?
    bool rest_none(size_t known) const;
    // Frees every argument (the kernel owns them), once the call is done.
    void consume() const;
};

// Writes the outputs (taking the handles) over the consumed arguments.
struct Outputs {
    std::vector<StableIValue> values;
    void tensor(Owned &&t) { values.push_back(sd::from(t.release())); }
    void integer(int64_t v) { values.push_back(sd::from(v)); }
    void write(const Args &args);
};

// -------------------------------------------------------- aotr plumbing

// (B, S, H, D) as (B, H, S, D).
inline constexpr int kBSHD[4] = {0, 2, 1, 3};

// The aotr_tensor of `t`, dims in `perm` order; false if it has none.
bool view(const State &s, const Info &t, const int *perm, aotr_tensor *out);

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

bool relayout(const State &s, std::vector<Slot> &slots);
void copy_back(std::vector<Slot> &slots);

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

bool target(const State &s, const Info &q, Target *out);
float softmax_scale(std::optional<double> scale, int64_t head_dim);
// A window side as libaotriton_rocm takes it (aotr_attn_window applies
// flash-attn's rule): None is -1, saturated to int32 (unbounded either way).
int32_t window_side(std::optional<int64_t> w);

struct Problem {
    aotr_attn_problem p{};
    bool ok = true;
    Problem(const State &s, const Info &q, const Info &k, const Info &v, const int *perm);
};

// flash-attn's variable-length batch into the problem: cu_seqlens and max
// seqlens (false: absent, or out of int32).
bool varlen(const State &s, const Info &q, AtenTensorHandle cu_q, AtenTensorHandle cu_k,
            int64_t max_q, int64_t max_k, Problem &pr);

// An additive attn_bias of q's dtype as the (B, H, Sq, Sk) view the kernels
// read: broadcast dims get stride 0 (never materialised). False when it does
// not broadcast; a layout the kernels cannot read surfaces as
// AOTR_NEEDS_LAYOUT and goes to the Python route, which copies it.
bool bias_view(const State &s, AtenTensorHandle h, const Info &q, const Info &k, aotr_tensor *out);
// flash-attn's ALiBi slopes (fp32 (H,) or (B, H) on q's device) into the
// params; libaotriton_rocm checks their shape. False: not usable here.
bool alibi_view(const State &s, AtenTensorHandle h, const Info &q, aotr_tensor *out);

// ---------------------------------------------------------------- kernels
// Each: true when it computed the call and wrote its outputs; false to hand
// the untouched stack to the Python route.

// aten_kernels.cpp: the SDPA ops
bool flash_fwd(const State &s, const Args &a);
bool flash_bwd(const State &s, const Args &a);
bool fa_fwd(const State &s, const Args &a);
bool fa_bwd(const State &s, const Args &a);
bool eff_fwd(const State &s, const Args &a);
bool eff_bwd(const State &s, const Args &a);

// What flash-attn's backward adds to torch's: the forward's score mods, and
// the deterministic flag (the split kernels, not the fused one).
struct BwdMods {
    float softcap = 0.0f;
    AtenTensorHandle alibi = nullptr;
    bool deterministic = false;
};

// The backward into new dQ, dK, dV (laid out like q, k, v), written as the
// op's outputs; false: nothing was written.
bool backward_outputs(const State &s, const Args &a, const Info &go, const Info &q, const Info &k,
                      const Info &v, const Info &out, const Info &lse, const int *perm, Problem &pr,
                      const BwdMods &mods = {});
// The forward of a call in flash-attn's layouts, its problem set up: (B, S,
// H, D) views (`perm` kBSHD) or packed (total, H, D) ones (nullptr); `out`
// like q and `lse` (B, H, Sq) or (H, total). False: the Python route takes
// the call (nothing was written).
bool flash_layout_fwd(const State &s, const Info &q, const Info &k, const Info &v, const int *perm,
                      const Problem &pr, AtenTensorHandle alibi, float softcap, Owned *out,
                      Owned *lse);

// flash_attn_kernels.cpp: aotriton_rocm's flash-attn operators
bool op_fwd(const State &s, const Args &a);
bool op_bwd(const State &s, const Args &a);
bool op_kvcache(const State &s, const Args &a);

} // namespace aotr_torch

#endif // AOTRITON_ROCM_TORCH_INTERNAL_H
