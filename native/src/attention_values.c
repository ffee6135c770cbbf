/* FlashAttention's kernel arguments: their values by name (slots.h), the
 * grids and the launches. */
#include <math.h>
#include <stdio.h>

#include "attention_internal.h"
#include "slots.h"

#define INT32_LIMIT 2147483647LL
#define MAX_GRID_Y 65535

void aotr_attn_window(int64_t left, int64_t right, int32_t causal, int64_t seqlen_k, int32_t *out)
{
    const int64_t side[2] = {left, right};
    for (int i = 0; i < 2; i++)
        out[i] = side[i] < 0 || side[i] >= seqlen_k ? -1 : (int32_t)side[i];
    if (causal)
        out[1] = 0;
}

double aotr_attn_default_scale(int64_t head_dim)
{
    if (head_dim <= 0)
        return 1.0;
    /* Newton's method for the root from above (it falls until it stops),
     * since the core links no libm: within an ulp of sqrt in double, so its
     * float (what the kernels take) is the correctly rounded 1/sqrt. */
    const double d = (double)head_dim;
    double root = d;
    for (;;) {
        const double next = 0.5 * (root + d / root);
        if (next >= root)
            break;
        root = next;
    }
    return 1.0 / root;
}

aotr_status aotr_set_i32(aotr_arg_value *v, int slot, int64_t x)
{
    if (x > INT32_LIMIT || x < -INT32_LIMIT - 1)
        return aotr_fail(AOTR_UNSUPPORTED,
                         "%s = %lld does not fit the kernels' 32-bit "
                         "argument",
                         aotr_arg_slot_name(slot), (long long)x);
    v[slot].i32 = (int32_t)x;
    return AOTR_OK;
}

aotr_status aotr_set_strides(aotr_arg_value *v, int first, const int64_t s[], int count)
{
    aotr_status st = AOTR_OK;
    for (int i = 0; i < count && st == AOTR_OK; i++)
        st = aotr_set_i32(v, first + i, s[i]);
    return st;
}

aotr_status aotr_set_zhm(aotr_arg_value *v, int first, const aotr_tensor *t, int varlen)
{
    int64_t s[3];
    aotr_zhm(t, varlen, s);
    return aotr_set_strides(v, first, s, 3);
}

/* aotr_set_zhm and aotr_set_strides fill consecutive slots: each tensor's strides are
 * listed together in variants.toml, whose order numbers the slots. */
#define CONSECUTIVE(a, b)                                                                          \
    _Static_assert(b == a + 1,                                                                     \
                   "variants.toml: " #b " must follow " #a " (aotr_set_zhm, aotr_set_strides)")
#define ZHM(z, h, m)                                                                               \
    CONSECUTIVE(z, h);                                                                             \
    CONSECUTIVE(h, m)
ZHM(AOTR_SLOT_stride_qz, AOTR_SLOT_stride_qh, AOTR_SLOT_stride_qm);
ZHM(AOTR_SLOT_stride_kz, AOTR_SLOT_stride_kh, AOTR_SLOT_stride_kn);
ZHM(AOTR_SLOT_stride_vz, AOTR_SLOT_stride_vh, AOTR_SLOT_stride_vn);
ZHM(AOTR_SLOT_stride_bz, AOTR_SLOT_stride_bh, AOTR_SLOT_stride_bm);
ZHM(AOTR_SLOT_stride_oz, AOTR_SLOT_stride_oh, AOTR_SLOT_stride_om);
ZHM(AOTR_SLOT_stride_doz, AOTR_SLOT_stride_doh, AOTR_SLOT_stride_dom);
ZHM(AOTR_SLOT_stride_dkz, AOTR_SLOT_stride_dkh, AOTR_SLOT_stride_dkn);
ZHM(AOTR_SLOT_stride_dvz, AOTR_SLOT_stride_dvh, AOTR_SLOT_stride_dvn);
ZHM(AOTR_SLOT_stride_dqz, AOTR_SLOT_stride_dqh, AOTR_SLOT_stride_dqm);
ZHM(AOTR_SLOT_stride_dbz, AOTR_SLOT_stride_dbh, AOTR_SLOT_stride_dbm);
ZHM(AOTR_SLOT_stride_dqaz, AOTR_SLOT_stride_dqah, AOTR_SLOT_stride_dqam);
CONSECUTIVE(AOTR_SLOT_stride_lz, AOTR_SLOT_stride_lh);
CONSECUTIVE(AOTR_SLOT_stride_az, AOTR_SLOT_stride_ah);

/* Everything the forward and the backward kernels share. */
aotr_status aotr_common_values(const aotr_attn_problem *p, const aotr_attn_dims *d, int needs_rng,
                               aotr_arg_value *v)
{
    aotr_status st;
    if ((st = aotr_need_layout(&p->q, "q")) || (st = aotr_need_layout(&p->k, "k")) ||
        (st = aotr_need_layout(&p->v, "v")))
        return st;
    /* Pointers a launch never dereferences (a feature it does not use) get
     * q's address: valid device memory, aligned like every other input. */
    void *spare = p->q.data;
    v[AOTR_SLOT_Q].p = p->q.data;
    v[AOTR_SLOT_K].p = p->k.data;
    v[AOTR_SLOT_V].p = p->v.data;
    v[AOTR_SLOT_CU_Q].p = d->varlen ? p->cu_seqlens_q.data : spare;
    v[AOTR_SLOT_CU_K].p = d->varlen ? p->cu_seqlens_k.data : spare;
    if (needs_rng) {
        const aotr_tensor *r[2] = {&p->philox_seed, &p->philox_offset};
        for (int i = 0; i < 2; i++)
            if (!aotr_present(r[i]) || r[i]->dtype != AOTR_INT64 || aotr_numel(r[i]) < 1 ||
                ((uintptr_t)r[i]->data & 7u))
                return aotr_fail(AOTR_INVALID_ARGUMENT,
                                 "dropout needs philox_%s: an "
                                 "8-byte aligned int64 device scalar",
                                 i ? "offset" : "seed");
    }
    v[AOTR_SLOT_RNG_SEED].p = needs_rng ? p->philox_seed.data : spare;
    v[AOTR_SLOT_RNG_OFFSET].p = needs_rng ? p->philox_offset.data : spare;
    if (aotr_present(&p->bias)) {
        if ((st = aotr_need_layout(&p->bias, "bias")) != AOTR_OK)
            return st;
        v[AOTR_SLOT_BIAS].p = p->bias.data;
        if ((st = aotr_set_strides(v, AOTR_SLOT_stride_bz, p->bias.strides, 3)) != AOTR_OK)
            return st;
    } else {
        v[AOTR_SLOT_BIAS].p = spare;
        v[AOTR_SLOT_stride_bz].i32 = v[AOTR_SLOT_stride_bh].i32 = v[AOTR_SLOT_stride_bm].i32 = 0;
    }
    if ((st = aotr_set_zhm(v, AOTR_SLOT_stride_qz, &p->q, d->varlen)) ||
        (st = aotr_set_zhm(v, AOTR_SLOT_stride_kz, &p->k, d->varlen)) ||
        (st = aotr_set_zhm(v, AOTR_SLOT_stride_vz, &p->v, d->varlen)))
        return st;
    int32_t window[2];
    aotr_attn_window(p->window_left, p->window_right, p->causal, d->sk, window);
    if ((st = aotr_set_i32(v, AOTR_SLOT_batch, d->b)) ||
        (st = aotr_set_i32(v, AOTR_SLOT_num_heads, d->h)) ||
        (st = aotr_set_i32(v, AOTR_SLOT_gqa_group, d->hk ? d->h / d->hk : 1)) ||
        (st = aotr_set_i32(v, AOTR_SLOT_max_seqlen_q, d->sq)) ||
        (st = aotr_set_i32(v, AOTR_SLOT_max_seqlen_k, d->sk)) ||
        (st = aotr_set_i32(v, AOTR_SLOT_window_left, window[0])) ||
        (st = aotr_set_i32(v, AOTR_SLOT_window_right, window[1])))
        return st;
    v[AOTR_SLOT_varlen].i32 = d->varlen;
    v[AOTR_SLOT_head_dim].i32 = (int32_t)d->d;
    v[AOTR_SLOT_bottom_right].i32 = p->causal_alignment == AOTR_CAUSAL_BOTTOM_RIGHT;
    v[AOTR_SLOT_sm_scale].f32 = p->scale;
    v[AOTR_SLOT_dropout_p].f32 = p->dropout_p;
    return AOTR_OK;
}

aotr_score_mod aotr_score_mod_of(uint32_t struct_size, size_t alibi_at, size_t softcap_at,
                                 const aotr_tensor *alibi, float softcap)
{
    aotr_score_mod m = {NULL, 0.0f};
    if (struct_size >= alibi_at + sizeof(aotr_tensor) && aotr_present(alibi))
        m.alibi = alibi;
    if (struct_size >= softcap_at + sizeof(float))
        m.softcap = softcap;
    return m;
}

aotr_status aotr_score_mod_values(const aotr_score_mod *m, const aotr_attn_dims *d,
                                  const void *spare, aotr_arg_value *v)
{
    if (!(isfinite(m->softcap) && m->softcap >= 0.0f))
        return aotr_fail(AOTR_INVALID_ARGUMENT, "softcap=%g: must be finite and >= 0 (0: off)",
                         (double)m->softcap);
    v[AOTR_SLOT_softcap].f32 = m->softcap;
    v[AOTR_SLOT_ALIBI].p = (void *)spare;
    v[AOTR_SLOT_stride_az].i32 = v[AOTR_SLOT_stride_ah].i32 = v[AOTR_SLOT_has_alibi].i32 = 0;
    const aotr_tensor *a = m->alibi;
    if (!a)
        return AOTR_OK;
    int64_t s[2];
    aotr_status st = aotr_alibi_strides(a, d->b, d->h, s);
    if (st == AOTR_OK)
        st = aotr_set_strides(v, AOTR_SLOT_stride_az, s, 2);
    if (st != AOTR_OK)
        return st;
    v[AOTR_SLOT_ALIBI].p = a->data;
    v[AOTR_SLOT_has_alibi].i32 = 1;
    return AOTR_OK;
}

/* A kernel of an image built before softcap/ALiBi cannot apply them: refuse
 * rather than ignore them. */
aotr_status aotr_score_mod_declared(const aotr_launchable *k, const aotr_arg_value *v)
{
    if (v[AOTR_SLOT_has_alibi].i32 && !aotr_launchable_declares(k, AOTR_SLOT_ALIBI))
        return aotr_fail(AOTR_UNSUPPORTED, "the installed kernel image predates ALiBi: "
                                           "install matching aotriton-rocm kernel images");
    if (v[AOTR_SLOT_softcap].f32 > 0.0f && !aotr_launchable_declares(k, AOTR_SLOT_softcap))
        return aotr_fail(AOTR_UNSUPPORTED, "the installed kernel image predates softcap: "
                                           "install matching aotriton-rocm kernel images");
    return AOTR_OK;
}

aotr_status aotr_launch_grid(uint64_t blocks, int64_t programs, uint32_t grid[3])
{
    int64_t y = programs < MAX_GRID_Y ? programs : MAX_GRID_Y;
    if (y < 1)
        y = 1;
    uint64_t z = aotr_cdiv(programs, y);
    if (blocks > 0x7fffffffu || z > MAX_GRID_Y)
        return aotr_fail(AOTR_UNSUPPORTED, "the launch grid (%llu, %lld, %llu) is too large",
                         (unsigned long long)blocks, (long long)y, (unsigned long long)z);
    grid[0] = (uint32_t)blocks;
    grid[1] = (uint32_t)y;
    grid[2] = (uint32_t)z;
    return AOTR_OK;
}

aotr_status aotr_attn_launch(aotr_runtime *rt, aotr_device *dev, const aotr_launchable *k,
                             uint64_t blocks, int64_t programs, void *stream,
                             const aotr_arg_value *v)
{
    uint32_t grid[3];
    aotr_status st = aotr_launch_grid(blocks, programs, grid);
    if (st == AOTR_OK)
        st = aotr_launchable_check(k, v);
    if (st == AOTR_OK)
        st = aotr_device_launch(rt, dev, k, grid, stream, v);
    return st;
}
