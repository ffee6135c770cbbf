// torch's attention ops on libaotriton_rocm through LibTorch's stable ABI
// (see aotriton_rocm_torch.h). Boxed kernels: each reads its arguments off
// the stack without taking them, decides whether libaotriton_rocm covers the
// call, and either computes it (then frees the arguments and writes the
// outputs) or hands the untouched stack to the Python route's op.
//
// This file: activation, the registrations and the boxed dispatch. The
// kernels are in aten_kernels.cpp and flash_attn_kernels.cpp, the tensors and
// views they use in tensors.cpp (torch_internal.h).

#include "torch_internal.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <memory>

namespace aotr_torch
{

std::vector<Owned> State::aux_outputs(const Info &like, int32_t dtype)
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

Owned State::empty_output(const Info &like, int32_t dtype)
{
    std::lock_guard<std::mutex> lock(aux_mu);
    Owned &t = empties[{like.device_type, like.device_index, dtype}];
    if (!t)
        t = empty_strided({0}, {1}, dtype, like);
    return share(t.get());
}

} // namespace aotr_torch

namespace
{

using namespace aotr_torch;

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

// GCC 12 mistakes the State pointer retired below for a pointer to the local
// `old` (a -Wdangling-pointer false positive since State is shared between
// files).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif
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
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

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
