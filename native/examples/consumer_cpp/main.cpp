// consumer_cpp DRIVER_LIBRARY [ARCHIVE]
//
// The C++ twin of consumer_c: a runtime on DRIVER_LIBRARY (the test suite's
// stub driver, which records launches and never dereferences the addresses
// standing in for device buffers), ARCHIVE added (without it, the library
// finds the installed kernel image), the attention forward and
// backward of one fixed problem, the launches printed as JSON.
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <aotriton_rocm/aotriton_rocm.h>

namespace
{

constexpr int64_t B = 2, HQ = 4, HKV = 2, SQ = 128, SK = 192, D = 64;

void check(aotr_status status, const char *what)
{
    if (status != AOTR_OK)
        throw std::runtime_error(std::string(what) + ": " + aotr_status_name(status) + ": " +
                                 aotr_last_error());
}

template <size_t N>
aotr_tensor tensor(uint64_t address, aotr_dtype dtype, const std::array<int64_t, N> &sizes)
{
    aotr_tensor t{};
    t.data = reinterpret_cast<void *>(static_cast<uintptr_t>(address));
    t.dtype = dtype;
    t.rank = static_cast<int32_t>(N);
    int64_t stride = 1;
    for (size_t i = N; i-- > 0;) {
        t.sizes[i] = sizes[i];
        t.strides[i] = stride;
        stride *= sizes[i];
    }
    return t;
}

struct RuntimeDeleter {
    void operator()(aotr_runtime *r) const { aotr_runtime_destroy(r); }
};
using Runtime = std::unique_ptr<aotr_runtime, RuntimeDeleter>;

template <typename F>
F symbol(void *handle, const char *name)
{
    void *f = dlsym(handle, name);
    if (f == nullptr)
        throw std::runtime_error(std::string(name) + ": " + dlerror());
    return reinterpret_cast<F>(f);
}

int run(const char *driver, const char *archive)
{
    aotr_runtime_options options{};
    options.struct_size = sizeof options;
    options.driver_library = driver;
    options.backend = AOTR_BACKEND_CUDA;
    aotr_runtime *raw = nullptr;
    check(aotr_runtime_create(&options, &raw), "aotr_runtime_create");
    Runtime runtime(raw);
    if (archive != nullptr)
        check(aotr_runtime_add_archive(runtime.get(), archive), "aotr_runtime_add_archive");

    const std::array<int64_t, 4> q_shape{B, HQ, SQ, D}, kv_shape{B, HKV, SK, D};
    const std::array<int64_t, 3> lse_shape{B, HQ, SQ};
    aotr_attn_problem problem{};
    problem.q = tensor(0x100000000, AOTR_FP16, q_shape);
    problem.k = tensor(0x200000000, AOTR_FP16, kv_shape);
    problem.v = tensor(0x300000000, AOTR_FP16, kv_shape);
    problem.scale = 0.125f;
    problem.causal = 1;
    problem.causal_alignment = AOTR_CAUSAL_BOTTOM_RIGHT;
    problem.window_left = problem.window_right = -1;
    check(aotr_attn_check(&problem), "aotr_attn_check");
    check(aotr_attn_supported(runtime.get(), 0, &problem, AOTR_NEED_BACKWARD),
          "aotr_attn_supported");

    aotr_attn_fwd_params fwd{};
    fwd.struct_size = sizeof fwd;
    fwd.stream = reinterpret_cast<void *>(static_cast<uintptr_t>(0x5000));
    fwd.problem = problem;
    fwd.out = tensor(0x400000000, AOTR_FP16, q_shape);
    fwd.lse = tensor(0x500000000, AOTR_FP32, lse_shape);
    check(aotr_attn_fwd(runtime.get(), &fwd), "aotr_attn_fwd");

    aotr_attn_bwd_params bwd{};
    bwd.struct_size = sizeof bwd;
    bwd.stream = fwd.stream;
    bwd.problem = problem;
    bwd.out = fwd.out;
    bwd.lse = fwd.lse;
    bwd.grad_out = tensor(0x600000000, AOTR_FP16, q_shape);
    bwd.grad_q = tensor(0x700000000, AOTR_FP16, q_shape);
    bwd.grad_k = tensor(0x800000000, AOTR_FP16, kv_shape);
    bwd.grad_v = tensor(0x900000000, AOTR_FP16, kv_shape);
    bwd.delta = tensor(0xa00000000, AOTR_FP32, lse_shape);
    check(aotr_attn_bwd(runtime.get(), &bwd), "aotr_attn_bwd");

    // RTLD_NOLOAD: the handle of the copy the library already loaded.
    void *stub = dlopen(driver, RTLD_NOW | RTLD_NOLOAD);
    if (stub == nullptr)
        throw std::runtime_error(std::string(driver) + " is not loaded: " + dlerror());
    auto launch_count = symbol<int (*)()>(stub, "aotr_stub_launch_count");
    auto launch_info =
        symbol<int (*)(int, char *, size_t, unsigned *, unsigned *, unsigned *, void **, size_t *)>(
            stub, "aotr_stub_launch_info");
    auto launch_args = symbol<size_t (*)(int, void *, size_t)>(stub, "aotr_stub_launch_args");

    std::ostringstream json;
    json << "{\"version\": \"" << aotr_version()
         << "\", \"runtime_launch_count\": " << aotr_runtime_launch_count(runtime.get(), nullptr)
         << ", \"launches\": [";
    for (int i = 0; i < launch_count(); i++) {
        std::array<char, 256> name{};
        std::array<unsigned, 3> grid{};
        unsigned block = 0, shared = 0;
        void *stream = nullptr;
        size_t size = 0;
        if (launch_info(i, name.data(), name.size(), grid.data(), &block, &shared, &stream, &size) <
            0)
            throw std::runtime_error("aotr_stub_launch_info(" + std::to_string(i) + ") failed");
        std::vector<unsigned char> args(size);
        if (launch_args(i, args.data(), args.size()) != size)
            throw std::runtime_error("aotr_stub_launch_args(" + std::to_string(i) + ") failed");
        static const char hex[] = "0123456789abcdef";
        std::string bytes;
        for (unsigned char c : args) {
            bytes += hex[c >> 4];
            bytes += hex[c & 15];
        }
        json << (i ? ", " : "") << "{\"symbol\": \"" << name.data() << "\", \"grid\": [" << grid[0]
             << ", " << grid[1] << ", " << grid[2] << "], \"block\": " << block
             << ", \"shared\": " << shared
             << ", \"stream\": " << reinterpret_cast<uintptr_t>(stream) << ", \"args\": \"" << bytes
             << "\"}";
    }
    json << "]}";
    std::cout << json.str() << std::endl;
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        std::cerr << "usage: " << argv[0] << " DRIVER_LIBRARY [ARCHIVE]\n";
        return 2;
    }
    try {
        return run(argv[1], argc == 3 ? argv[2] : nullptr);
    } catch (const std::exception &e) {
        std::cerr << "consumer_cpp: " << e.what() << "\n";
        return 1;
    }
}
