/* Shared by FlashAttention's files: attention_check.c (the request checks),
 * attention_values.c (argument values, grids, launches), attention.c (the
 * forward and backward) and dropout.c. */
#ifndef AOTR_ATTENTION_INTERNAL_H
#define AOTR_ATTENTION_INTERNAL_H

#include "internal.h"

typedef struct aotr_attn_dims {
    int64_t b, h, hk, sq, sk, d;
    int64_t dv; /* value's head dim (d unless V's differs) */
    int varlen;
} aotr_attn_dims;

static inline int64_t aotr_numel(const aotr_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->sizes[i];
    return n;
}

static inline uint64_t aotr_cdiv(int64_t a, int64_t b) { return (uint64_t)((a + b - 1) / b); }

/* ------------------------------------------------- attention_check.c */
/* A rank in 0..AOTR_MAX_RANK and no negative size (INVALID_ARGUMENT). */
AOTR_HIDDEN aotr_status aotr_check_tensor(const aotr_tensor *t, const char *name);
AOTR_HIDDEN int aotr_same_shape(const aotr_tensor *a, const aotr_tensor *b);
AOTR_HIDDEN aotr_status aotr_problem_dims(const aotr_attn_problem *p, aotr_attn_dims *d);
AOTR_HIDDEN void aotr_zhm(const aotr_tensor *t, int varlen, int64_t out[3]);
AOTR_HIDDEN aotr_status aotr_check_call(const aotr_runtime *rt, const void *params,
                                        uint32_t struct_size, size_t minimum, const char *what);
/* aotr_check_call, then the problem; fills `d`. */
AOTR_HIDDEN aotr_status aotr_attn_begin(aotr_runtime *rt, const void *params, uint32_t struct_size,
                                        size_t minimum, const aotr_attn_problem *p,
                                        aotr_attn_dims *d, const char *what);
/* Given, shaped and typed like `model`, and in the kernels' layout. */
AOTR_HIDDEN aotr_status aotr_need_like(const aotr_tensor *t, const aotr_tensor *model,
                                       const char *name, const char *model_name);
/* Given, shaped and typed like `model` (any layout: staged copies). */
AOTR_HIDDEN aotr_status aotr_shaped_like(const aotr_tensor *t, const aotr_tensor *model,
                                         const char *name, const char *model_name);
AOTR_HIDDEN aotr_status aotr_shaped_like_out(const aotr_tensor *t, const aotr_attn_problem *p,
                                             const char *name);
AOTR_HIDDEN aotr_status aotr_check_lse(const aotr_tensor *lse, const aotr_attn_dims *d,
                                       const char *name, int64_t out[2]);

/* ------------------------------------------------ attention_values.c */
/* softcap and ALiBi: the fields appended to the params structs, read only
 * when the caller's struct_size covers them. */
typedef struct aotr_score_mod {
    const aotr_tensor *alibi; /* NULL: absent */
    float softcap;
} aotr_score_mod;

/* The AOTR_PICK_* features of a call. */
static inline unsigned aotr_pick_features(int bias, int dropout, const aotr_score_mod *mod)
{
    return (bias ? AOTR_PICK_BIAS : 0u) | (dropout ? AOTR_PICK_DROPOUT : 0u) |
           (mod && (mod->alibi || mod->softcap > 0.0f) ? AOTR_PICK_SCORE_MODS : 0u);
}

/* The slot's 32-bit value, UNSUPPORTED where it does not fit; _strides fills
 * `count` consecutive slots, _zhm a q/k/v-like tensor's (z, h, row) ones. */
AOTR_HIDDEN aotr_status aotr_set_i32(aotr_arg_value *v, int slot, int64_t x);
AOTR_HIDDEN aotr_status aotr_set_strides(aotr_arg_value *v, int first, const int64_t s[],
                                         int count);
AOTR_HIDDEN aotr_status aotr_set_zhm(aotr_arg_value *v, int first, const aotr_tensor *t,
                                     int varlen);
AOTR_HIDDEN aotr_status aotr_common_values(const aotr_attn_problem *p, const aotr_attn_dims *d,
                                           int needs_rng, aotr_arg_value *v);
AOTR_HIDDEN aotr_score_mod aotr_score_mod_of(uint32_t struct_size, size_t alibi_at,
                                             size_t softcap_at, const aotr_tensor *alibi,
                                             float softcap);
AOTR_HIDDEN aotr_status aotr_score_mod_values(const aotr_score_mod *m, const aotr_attn_dims *d,
                                              const void *spare, aotr_arg_value *v);
AOTR_HIDDEN aotr_status aotr_score_mod_declared(const aotr_launchable *k, const aotr_arg_value *v);
/* The grid of `blocks` x `programs` (aotr_launch_grid), the divisibility
 * check, the launch. */
AOTR_HIDDEN aotr_status aotr_attn_launch(aotr_runtime *rt, aotr_device *dev,
                                         const aotr_launchable *k, uint64_t blocks,
                                         int64_t programs, void *stream, const aotr_arg_value *v);

#endif /* AOTR_ATTENTION_INTERNAL_H */
