/* Dropout draws (aotr_dropout_uniform) and the Philox state after a call
 * (aotr_philox_state). */
#include <string.h>

#include "attention_internal.h"
#include "slots.h"

#define INT32_LIMIT 2147483647LL

static aotr_status check_philox(const aotr_tensor *t, const char *name)
{
    aotr_status st = aotr_check_tensor(t, name);
    if (st != AOTR_OK)
        return st;
    if (!aotr_present(t) || t->dtype != AOTR_INT64 || aotr_numel(t) < 1 ||
        ((uintptr_t)t->data & 7u))
        return aotr_fail(AOTR_INVALID_ARGUMENT,
                         "%s must be an 8-byte aligned int64 device "
                         "scalar (the forward's)",
                         name);
    return AOTR_OK;
}

/* A contiguous fp32 (B, H, Sq, Sk) tensor whose sizes fit the kernel's 32-bit arguments. */
static aotr_status check_draws_out(const aotr_tensor *t)
{
    aotr_status st = aotr_check_tensor(t, "out");
    if (st != AOTR_OK)
        return st;
    if ((!aotr_present(t) && aotr_numel(t) > 0) || t->rank != 4 || t->dtype != AOTR_FP32)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "out must be an fp32 (batch, heads, seqlen_q, "
                                                "seqlen_k) tensor");
    const int64_t *n = t->sizes;
    if (aotr_numel(t) == 0)
        return AOTR_OK; /* nothing is written: any strides, any address */
    if (t->strides[3] != 1 || t->strides[2] != n[3] || t->strides[1] != n[2] * n[3] ||
        t->strides[0] != n[1] * n[2] * n[3])
        return aotr_fail(AOTR_NEEDS_LAYOUT, "out must be contiguous: pass a contiguous tensor "
                                            "and copy from it");
    if (n[0] * n[1] > INT32_LIMIT || n[2] > INT32_LIMIT || n[3] > INT32_LIMIT)
        return aotr_fail(AOTR_UNSUPPORTED, "sizes beyond 32 bits are not covered");
    return AOTR_OK;
}

aotr_status aotr_dropout_uniform(aotr_runtime *rt, const aotr_dropout_uniform_params *params)
{
    aotr_status st;
    if ((st = aotr_check_call(rt, params, params ? params->struct_size : 0, sizeof *params,
                              "aotr_dropout_uniform")) ||
        (st = check_draws_out(&params->out)) ||
        (st = check_philox(&params->philox_seed, "philox_seed")) ||
        (st = check_philox(&params->philox_offset, "philox_offset")))
        return st;
    if (!(params->dropout_p >= 0.0f && params->dropout_p <= 1.0f))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "dropout_p=%g is outside [0, 1]",
                         (double)params->dropout_p);
    if (params->encode_keep != 0 && params->encode_keep != 1)
        return aotr_fail(AOTR_INVALID_ARGUMENT, "encode_keep must be 0 or 1, not %d",
                         params->encode_keep);
    const int64_t *n = params->out.sizes;
    if (aotr_numel(&params->out) == 0)
        return AOTR_OK; /* nothing to write */
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    v[AOTR_SLOT_R].p = params->out.data;
    v[AOTR_SLOT_RNG_SEED].p = params->philox_seed.data;
    v[AOTR_SLOT_RNG_OFFSET].p = params->philox_offset.data;
    v[AOTR_SLOT_batch].i32 = (int32_t)n[0];
    v[AOTR_SLOT_num_heads].i32 = (int32_t)n[1];
    v[AOTR_SLOT_max_seqlen_q].i32 = (int32_t)n[2];
    v[AOTR_SLOT_max_seqlen_k].i32 = (int32_t)n[3];
    v[AOTR_SLOT_dropout_p].f32 = params->dropout_p;
    v[AOTR_SLOT_encode_keep].i32 = params->encode_keep;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    const aotr_launchable *k =
        aotr_device_pick(dev, AOTR_KERNEL_DROPOUT_UNIFORM, AOTR_FP32, 16, 0, n[2], n[3]);
    if (!k)
        return AOTR_UNSUPPORTED;
    return aotr_attn_launch(rt, dev, k, aotr_cdiv(n[2], aotr_launchable_block_m(k)), n[0] * n[1],
                            params->stream, v);
}

aotr_status aotr_philox_state(aotr_runtime *rt, const aotr_philox_state_params *params)
{
    aotr_status st;
    if ((st = aotr_check_call(rt, params, params ? params->struct_size : 0, sizeof *params,
                              "aotr_philox_state")) ||
        (st = check_philox(&params->philox_seed, "philox_seed")) ||
        (st = check_philox(&params->philox_offset, "philox_offset")) ||
        (st = check_philox(&params->seed_out, "seed_out")) ||
        (st = check_philox(&params->offset_out, "offset_out")))
        return st;
    aotr_arg_value v[AOTR_ARG_SLOTS];
    memset(v, 0, sizeof v);
    v[AOTR_SLOT_RNG_SEED].p = params->philox_seed.data;
    v[AOTR_SLOT_RNG_OFFSET].p = params->philox_offset.data;
    v[AOTR_SLOT_offset_add].i64 = params->offset_add;
    v[AOTR_SLOT_SEED_OUT].p = params->seed_out.data;
    v[AOTR_SLOT_OFFSET_OUT].p = params->offset_out.data;
    aotr_device *dev = NULL;
    if ((st = aotr_runtime_device(rt, params->device, &dev)) != AOTR_OK)
        return st;
    const aotr_launchable *k =
        aotr_device_pick(dev, AOTR_KERNEL_PHILOX_STATE, AOTR_FP32, 16, 0, 1, 1);
    if (!k)
        return AOTR_UNSUPPORTED;
    return aotr_attn_launch(rt, dev, k, 1, 1, params->stream, v);
}
