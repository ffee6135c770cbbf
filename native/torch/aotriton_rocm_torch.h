/*
 * libaotriton_rocm_torch: torch's attention ops on libaotriton_rocm, built
 * against LibTorch's stable ABI (one binary for torch >= 2.10, CUDA, ROCm
 * and CPU builds). Loading the library registers nothing: aotr_torch_activate
 * puts its kernels on the dispatcher, aotr_torch_deactivate takes them off.
 *
 * The kernels override, on one dispatch key, the six attention ops
 *   aten::_scaled_dot_product_flash_attention[_backward]
 *   aten::_flash_attention_forward / _flash_attention_backward
 *   aten::_scaled_dot_product_efficient_attention[_backward]
 * and serve aotriton_rocm's flash-attn operators flash_attn_forward,
 * flash_attn_backward (dense batches) and flash_attn_kvcache, and hand every
 * call they do not cover (dropout, a debug mask, a boolean or
 * hard-to-read attention bias and its gradient, a request libaotriton_rocm
 * reports AOTR_UNSUPPORTED for, any error)
 * unchanged to `<fallback_namespace>::py_<op name>`, an op with the op's
 * schema that the caller has registered (aotriton_rocm's Python route).
 *
 * libtorch's symbols (aoti_torch_*, torch_*) are left undefined: the process
 * must have made them global (torch loaded with RTLD_GLOBAL, or promoted)
 * before this library is loaded.
 */
#ifndef AOTRITON_ROCM_TORCH_H
#define AOTRITON_ROCM_TORCH_H

#include <stdint.h>

#include <aotriton_rocm/aotriton_rocm.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct aotr_torch_config {
    uint32_t struct_size;
    /* "CUDA" (ROCm tensors use it too); "CPU" for tests. */
    const char *dispatch_key;
    /* The Python route: ops "<fallback_namespace>::py_<aten op name>". */
    const char *fallback_namespace;
    /* The runtime the kernels launch through, and archives added to it. */
    aotr_runtime_options runtime;
    const char *const *archives;
    int32_t archive_count;
    /* The flash ops' RNG-state outputs as torch's meta kernel lays them out
     * in this torch build: a seed of rank 0 or 1 (then rng_seed_size
     * elements) and a 0-dim offset, uint64 or int64. */
    int32_t rng_seed_rank;
    int64_t rng_seed_size;
    int32_t rng_unsigned;
    /* The efficient op's logsumexp rows are rounded up to a multiple of this
     * (32 on CUDA builds of torch, 1 on ROCm builds). */
    int32_t efficient_lse_align;
    /* 0: serve only the fallback namespace's own operators (flash-attn's
     * API), leaving aten's alone (the rng and lse fields are then unused). */
    int32_t aten_ops;
    /* Per op, in the order listed above, the kinds of its arguments in the
     * running torch's schema: 'T' Tensor, 't' Tensor?, 'o' another optional,
     * 'L' a list, 'x' anything else. Arguments past the ones this library
     * knows must be None for a call to be covered. */
    const char *arg_kinds[9];
} aotr_torch_config;

/* 0 on success; -1 with aotr_torch_last_error() otherwise. Activating
 * while active replaces the registrations. */
int aotr_torch_activate(const aotr_torch_config *config);
/* Removes the registrations. The runtime stays (kernels may still be queued
 * on the GPU); activating again with the same options reuses it. */
int aotr_torch_deactivate(void);
int aotr_torch_is_active(void);
const char *aotr_torch_last_error(void);
/* Launches through this library's runtimes (aotr_runtime_launch_count),
 * active or not, since it was loaded: a count that only grows. */
uint64_t aotr_torch_launch_count(const char *kernel);
/* Calls handed to the fallback ops since activation. */
uint64_t aotr_torch_fallback_count(void);

#ifdef __cplusplus
}
#endif

#endif /* AOTRITON_ROCM_TORCH_H */
