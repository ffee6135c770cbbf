/* Internal interfaces of libaotriton_rocm (not installed). */
#ifndef AOTR_INTERNAL_H
#define AOTR_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "aotriton_rocm/aotriton_rocm.h"

#define AOTR_HIDDEN __attribute__((visibility("hidden")))

/* ------------------------------------------------------------ error.c */
/* Set the thread-local message (printf format) and return `status`. */
AOTR_HIDDEN aotr_status aotr_fail(aotr_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the current message with "<prefix>: " (keeps the status). */
AOTR_HIDDEN aotr_status aotr_fail_prefix(aotr_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
AOTR_HIDDEN void aotr_clear_error(void);

/* Cold-start timing: with AOTRITON_ROCM_TRACE=1 in the environment (read
 * once), aotr_trace() prints "aotriton-rocm: trace: <phase> <ms> ms <detail>"
 * on stderr. Placed only on one-time paths (archive open, device setup,
 * module loads, a kernel's first launch), never per call. */
AOTR_HIDDEN int aotr_trace_on(void);
AOTR_HIDDEN double aotr_now_ms(void);
AOTR_HIDDEN void aotr_trace(const char *phase, double ms, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------- json.c */
/* A read-only JSON DOM (RFC 8259), enough for the archive index. Strings
 * are NUL-terminated UTF-8 (escapes decoded; a \u0000 is refused). Numbers
 * keep their double value and, when integral and in range, int64. */
typedef enum aotr_json_type {
    AOTR_JSON_NULL,
    AOTR_JSON_FALSE,
    AOTR_JSON_TRUE,
    AOTR_JSON_NUMBER,
    AOTR_JSON_STRING,
    AOTR_JSON_ARRAY,
    AOTR_JSON_OBJECT
} aotr_json_type;

typedef struct aotr_json aotr_json;
/* 32 bytes: an index holds about 100 000 values, and a fresh process pays
 * for every page of the document (read the union's member of `type` only). */
struct aotr_json {
    aotr_json_type type;
    int is_int; /* NUMBER: the value is integral and fits int64 */
    size_t n;   /* ARRAY/OBJECT: number of items; STRING: byte length */
    union {
        struct {
            int64_t i; /* NUMBER */
            double d;
        };
        const char *s; /* STRING: value */
        struct {
            aotr_json *items;  /* ARRAY: n values; OBJECT: n values, keys[i] names items[i] */
            const char **keys; /* OBJECT */
        };
    };
};

/* Parse `len` bytes (not NUL-terminated). Returns NULL with an aotr_fail
 * message ("json: ... at byte N") on error. Depth is limited (64). One
 * allocation arena per document, freed by aotr_json_free(root). */
AOTR_HIDDEN aotr_json *aotr_json_parse(const char *text, size_t len);
AOTR_HIDDEN void aotr_json_free(aotr_json *root);
/* FNV-1a of a NUL-terminated string (the runtime's name tables). */
static inline uint32_t aotr_str_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}
/* Object member or NULL (also NULL when `obj` is not an object). */
AOTR_HIDDEN const aotr_json *aotr_json_get(const aotr_json *obj, const char *key);
/* Typed getters: 1 on success. */
AOTR_HIDDEN int aotr_json_int(const aotr_json *v, int64_t *out);
AOTR_HIDDEN const char *aotr_json_str(const aotr_json *v); /* NULL if not a string */

/* ----------------------------------------------------------- sha256.c */
typedef struct aotr_sha256 {
    uint32_t h[8];
    uint64_t length;
    uint8_t block[64];
    size_t used;
} aotr_sha256;
AOTR_HIDDEN void aotr_sha256_init(aotr_sha256 *ctx);
AOTR_HIDDEN void aotr_sha256_update(aotr_sha256 *ctx, const void *data, size_t len);
AOTR_HIDDEN void aotr_sha256_final(aotr_sha256 *ctx, uint8_t digest[32]);
AOTR_HIDDEN void aotr_sha256_digest(const void *data, size_t len, uint8_t digest[32]);
/* 64 lowercase hex chars -> 32 bytes; 1 on success. */
AOTR_HIDDEN int aotr_hex_to_digest(const char *hex, uint8_t digest[32]);

/* --------------------------------------------------------------- xz.c */
/* Decompress one .xz stream of exactly `out_size` bytes through liblzma
 * (dlopen("liblzma.so.5") on first use; no link-time dependency). */
AOTR_HIDDEN aotr_status aotr_xz_decode(const uint8_t *in, size_t in_size, uint8_t *out,
                                       size_t out_size);

/* ------------------------------------------- archive.c / archive_index.c */
/* Kernel argument types as recorded in the archive ("*fp16", "i32", ...). */
typedef enum aotr_arg_kind {
    AOTR_ARG_POINTER = 1, /* "*<anything>": 8 bytes */
    AOTR_ARG_I32 = 2,     /* "i32": 4 bytes */
    AOTR_ARG_FP32 = 3,    /* "fp32": 4 bytes */
    AOTR_ARG_I64 = 4      /* "i64": 8 bytes */
} aotr_arg_kind;

typedef struct aotr_kernel_arg {
    const char *name; /* "Q", "stride_qz", ..., "global_scratch" */
    const char *type; /* as recorded */
    aotr_arg_kind kind;
} aotr_kernel_arg;

typedef struct aotr_kernel_record {
    const char *key;    /* unique in the archive */
    const char *kernel; /* "attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq" */
    const char *symbol;
    /* functional values; -1 where the record has no such axis */
    aotr_dtype dtype; /* from "dtype": "fp16"/"bf16"/"fp32" */
    int32_t head_dim; /* padded tile width BLOCK_D */
    int32_t pad_head, has_bias, enable_dropout;
    /* config: BLOCK_M / BLOCK_N (0 when absent) */
    int32_t block_m, block_n;
    int32_t min_seqlen; /* config MIN_SEQLEN: shorter sequences take another route (0: none) */
    int32_t num_warps, num_stages, warp_size;
    uint32_t shared;
    uint32_t global_scratch_size; /* bytes per program, allocated per launch */
    size_t num_args;              /* includes the trailing global/profile scratch pointers */
    const aotr_kernel_arg *args;
    size_t num_divisible;
    const char *const *divisible_16; /* argument names compiled as divisible by 16 */
    uint64_t offset, compressed_size, size;
    uint8_t sha256[32];
    const aotr_json *json; /* the record itself (functional, config, ...) */
} aotr_kernel_record;

/* The records (archive order) and the manifest object of an open archive. */
AOTR_HIDDEN size_t aotr_archive_records(const aotr_archive *a, const aotr_kernel_record **records);
AOTR_HIDDEN const aotr_json *aotr_archive_manifest(const aotr_archive *a);
/* The sha256-checked code object of record `index`, decoded on first use
 * and cached in the archive (thread-safe). The bytes live as long as the
 * archive. */
/* An archive of kernel records held in memory (an archive's index: JSON
 * manifest and records, without code objects), named `name` in messages;
 * the JSON is copied. */
AOTR_HIDDEN aotr_status aotr_archive_from_index(const char *name, const char *json, size_t size,
                                                aotr_archive **out);
AOTR_HIDDEN aotr_status aotr_archive_code_object(aotr_archive *a, size_t index,
                                                 const uint8_t **code, size_t *size);

/* -------------------------- driver.c, driver_open.c, driver_memory.c */
typedef struct aotr_driver aotr_driver;

/* Open the HIP runtime (AOTR_BACKEND_HIP) or CUDA driver (AOTR_BACKEND_CUDA):
 * `library` if given, else the copy already loaded in the process
 * (RTLD_NOLOAD first), else the default soname. */
AOTR_HIDDEN aotr_status aotr_driver_open(aotr_backend backend, const char *library,
                                         aotr_driver **out);
AOTR_HIDDEN void aotr_driver_close(aotr_driver *d);
AOTR_HIDDEN aotr_backend aotr_driver_backend(const aotr_driver *d);
/* "gfx942" (target features dropped) or "sm_90". */
AOTR_HIDDEN aotr_status aotr_driver_device_arch(aotr_driver *d, int32_t device, char *arch,
                                                size_t capacity);
/* Load a code object on `device` and get `symbol` from it (opting in to
 * `shared` bytes of dynamic shared memory where the API needs it). The
 * module stays loaded until aotr_driver_close. */
AOTR_HIDDEN aotr_status aotr_driver_load(aotr_driver *d, int32_t device, const void *image,
                                         size_t size, const char *symbol, uint32_t shared,
                                         void **function);
/* The device's compute units (multiProcessorCount); AOTR_UNSUPPORTED when
 * the driver lacks the query. */
AOTR_HIDDEN aotr_status aotr_driver_compute_units(aotr_driver *d, int32_t device, int32_t *out);
/* Launch with the packed argument buffer (natural alignment, as the kernel
 * declares its parameters), through the launch API's "extra" array. */
AOTR_HIDDEN aotr_status aotr_driver_launch(aotr_driver *d, int32_t device, void *function,
                                           const uint32_t grid[3], uint32_t block_x,
                                           uint32_t shared, void *stream, void *args,
                                           size_t args_size);
/* Global scratch of one launch, allocated and freed in the order of `stream`
 * (CUDA's cuMemAllocAsync / cuMemFreeAsync; the HIP path has none). */
AOTR_HIDDEN aotr_status aotr_driver_scratch_alloc(aotr_driver *d, int32_t device, size_t bytes,
                                                  void *stream, uint64_t *ptr);
AOTR_HIDDEN void aotr_driver_scratch_free(aotr_driver *d, uint64_t ptr, void *stream);
/* In the order of `stream` on `device`, on either backend (CUDA: in the
 * device's primary context): device memory (CUDA: from the scratch pool),
 * byte fills, 2D copies (rows of `width` bytes, `pitch` bytes apart;
 * addresses in the unified address space, device or host) and stream
 * queries. Used by stage.c (zero-padded copies) and device_ops.c (the public
 * aotr_copy_2d & co.). AOTR_DRIVER_UNAVAILABLE where the driver lacks the
 * function. */
AOTR_HIDDEN aotr_status aotr_driver_mem_alloc(aotr_driver *d, int32_t device, size_t bytes,
                                              void *stream, uint64_t *ptr);
AOTR_HIDDEN aotr_status aotr_driver_mem_free(aotr_driver *d, int32_t device, uint64_t ptr,
                                             void *stream);
AOTR_HIDDEN aotr_status aotr_driver_memset(aotr_driver *d, int32_t device, uint64_t ptr, int value,
                                           size_t bytes, void *stream);
AOTR_HIDDEN aotr_status aotr_driver_copy_2d(aotr_driver *d, int32_t device, uint64_t dst,
                                            size_t dst_pitch, uint64_t src, size_t src_pitch,
                                            size_t width, size_t height, void *stream);
/* AOTR_BACKEND_HOST (driver_host.c): the caller's launcher, host memory. */
typedef struct aotr_host_launcher {
    aotr_host_launch_fn launch;
    void *user;
    int32_t compute_units;
} aotr_host_launcher;
AOTR_HIDDEN aotr_status aotr_driver_open_host(const aotr_host_launcher *launcher,
                                              aotr_driver **out);
/* The host driver's launcher (NULL for a GPU driver). */
AOTR_HIDDEN const aotr_host_launcher *aotr_driver_host(const aotr_driver *d);
AOTR_HIDDEN aotr_status aotr_host_launch(const aotr_host_launcher *h, const char *key,
                                         const uint32_t grid[3], const uint64_t *args,
                                         size_t num_args);
AOTR_HIDDEN aotr_status aotr_host_mem_alloc(size_t bytes, uint64_t *ptr);
AOTR_HIDDEN void aotr_host_mem_free(uint64_t ptr);
AOTR_HIDDEN void aotr_host_memset(uint64_t ptr, int value, size_t bytes);
AOTR_HIDDEN void aotr_host_copy_2d(uint64_t dst, size_t dst_pitch, uint64_t src, size_t src_pitch,
                                   size_t width, size_t height);
/* The calling thread's current device (CUDA: its context's; 0 with none). */
AOTR_HIDDEN aotr_status aotr_driver_current_device(aotr_driver *d, int32_t *device);
AOTR_HIDDEN aotr_status aotr_driver_stream_capturing(aotr_driver *d, int32_t device, void *stream,
                                                     int *capturing);
AOTR_HIDDEN aotr_status aotr_driver_stream_synchronize(aotr_driver *d, int32_t device,
                                                       void *stream);
/* The runtime's driver (opened on first use, as for a device). */
AOTR_HIDDEN aotr_status aotr_runtime_driver(aotr_runtime *rt, aotr_driver **out);

/* ------------------------ runtime.c, kernel_tables.c, launch.c and callers */
/* The value of every kernel argument name (slots.h numbers the names, the
 * kernels and their argument lists); a launch packs the ones a kernel
 * declares, in its order. */
typedef union aotr_arg_value {
    void *p;
    int32_t i32;
    int64_t i64;
    float f32;
} aotr_arg_value;

typedef struct aotr_device aotr_device;
typedef struct aotr_launchable aotr_launchable;

/* The device's state (arch, archive, driver, kernel tables), initialised on
 * first use; the status of a failed initialisation is kept and returned
 * again with its message. */
AOTR_HIDDEN aotr_status aotr_runtime_device(aotr_runtime *rt, int32_t device, aotr_device **out);
/* varlen.c: a variable-length batch placed by seq_starts_q/k or seqlens_k
 * (the params ask for it when struct_size covers them and one is given). */
AOTR_HIDDEN int aotr_varlen_fwd_places(const aotr_attn_fwd_params *p);
AOTR_HIDDEN int aotr_varlen_bwd_places(const aotr_attn_bwd_params *p);
/* What the checks see of a placed problem: cu_seqlens_q stands in for an
 * absent cu_seqlens_k (K's sequences come from seq_starts_k and seqlens_k),
 * and a side's rows bound its longest sequence when max_seqlen is 0. */
AOTR_HIDDEN void aotr_placed_problem(aotr_attn_problem *p, const aotr_tensor *starts_k,
                                     const aotr_tensor *lens_k);
/* What the kernels' CU_Q, CU_K and varlen take for one call: the problem's
 * own cu_seqlens and 0/1, or vectors assembled on the stream (freed by
 * aotr_placement_end, which returns `st` or the free's failure). */
typedef struct aotr_placement {
    aotr_runtime *rt;
    int32_t device;
    void *stream;
    int32_t word;
    void *cu_q, *cu_k;
    void *block;
} aotr_placement;
AOTR_HIDDEN aotr_status aotr_placement_begin(aotr_runtime *rt, int32_t device, void *stream,
                                             const aotr_attn_problem *p,
                                             const aotr_tensor *starts_q,
                                             const aotr_tensor *starts_k, const aotr_tensor *lens_k,
                                             aotr_placement *pl);
AOTR_HIDDEN aotr_status aotr_placement_end(aotr_placement *pl, aotr_status st);
/* -- request helpers shared by the entry points (attention_check.c and
 * attention_values.c define them; kvcache.c uses them too) -------------- */

static inline int aotr_present(const aotr_tensor *t) { return t->data != NULL; }
/* AOTR_NEEDS_LAYOUT naming `name` unless aotr_layout_ok(t). */
AOTR_HIDDEN aotr_status aotr_need_layout(const aotr_tensor *t, const char *name);
/* 1 where a logsumexp (or Delta) meets the kernels' layout: a 16-byte
 * aligned base and a unit last stride (free where that dim has one row), its
 * other strides free; then `strides` holds its (z, h) strides, z = 0 for a
 * packed (heads, total_q) one. */
AOTR_HIDDEN int aotr_lse_layout(const aotr_tensor *lse, int varlen, int64_t strides[2]);
/* The (x, y, z) grid of `blocks` row blocks times `programs` (batch x heads)
 * programs, y capped at 65535 and the rest along z; AOTR_UNSUPPORTED when it
 * cannot be launched. */
AOTR_HIDDEN aotr_status aotr_launch_grid(uint64_t blocks, int64_t programs, uint32_t grid[3]);
/* ALiBi slopes: fp32 (heads,) or (batch, heads), 4-byte aligned; their (z, h)
 * strides (z = 0 for per-head slopes). */
AOTR_HIDDEN aotr_status aotr_alibi_strides(const aotr_tensor *slopes, int64_t batch, int64_t heads,
                                           int64_t strides[2]);

/* What a call needs of a kernel variant beyond dtype and head dim. */
enum {
    AOTR_PICK_BIAS = 1,
    AOTR_PICK_DROPOUT = 2,
    /* softcap / ALiBi: only the masked-head-dim (general) variants have them */
    AOTR_PICK_SCORE_MODS = 4,
};
/* The kernel for a call (functional key + seqlen bucket), or NULL with an
 * AOTR_UNSUPPORTED message naming what the archive lacks. `features`: a
 * combination of AOTR_PICK_*. */
AOTR_HIDDEN const aotr_launchable *aotr_device_pick(aotr_device *dev, int kernel_id,
                                                    aotr_dtype dtype, int32_t head_dim,
                                                    unsigned features, int64_t seqlen_q,
                                                    int64_t seqlen_k);
/* The device's driver and its index there. */
AOTR_HIDDEN aotr_driver *aotr_device_driver(aotr_device *dev, int32_t *index);

/* stage.c: zero-padded copies of the tensors of a call whose head dim is not
 * a multiple of 8, in device memory of the call's stream. add() swaps a
 * tensor slot for its copy's view (its last dim `width` elements, rows
 * 16-element aligned, the other dims in the original's memory order);
 * begin() allocates, zeroes and fills the inputs' copies; end() copies the
 * outputs back (only their real head dim) if `st` is AOTR_OK and frees.
 * `output`: 0 an input, 1 an output, 2 scratch (contiguous, never copied),
 * 3 an output whose rows the kernels may leave unwritten (copied in too, so
 * that those rows come back as they were). */
#define AOTR_STAGE_MAX 8
typedef struct aotr_stage {
    aotr_device *dev;
    void *stream;
    uint64_t base;
    int count;
    struct {
        aotr_tensor *slot;
        aotr_tensor orig;
        int output;
        size_t offset;
    } t[AOTR_STAGE_MAX];
    size_t bytes;
} aotr_stage;
AOTR_HIDDEN void aotr_stage_init(aotr_stage *s, aotr_device *dev, void *stream);
AOTR_HIDDEN aotr_status aotr_stage_add(aotr_stage *s, aotr_tensor *slot, const char *name,
                                       int output, int64_t width);
AOTR_HIDDEN aotr_status aotr_stage_begin(aotr_stage *s);
AOTR_HIDDEN aotr_status aotr_stage_end(aotr_stage *s, aotr_status st);
/* The head dim the kernels run for a real one: the next multiple of 8. */
static inline int64_t aotr_kernel_head_dim(int64_t d) { return (d + 7) / 8 * 8; }

/* The device's compute units (CUs / SMs), 0 when the driver cannot say. */
AOTR_HIDDEN int32_t aotr_device_compute_units(aotr_device *dev);
AOTR_HIDDEN int32_t aotr_launchable_block_m(const aotr_launchable *k);
/* 1 if kernel `k` declares the argument of `slot` (kernels of older images
 * may lack arguments added since). */
AOTR_HIDDEN int aotr_launchable_declares(const aotr_launchable *k, int slot);
AOTR_HIDDEN int32_t aotr_launchable_block_n(const aotr_launchable *k);
/* Check the divisibility assumptions of `k` against `values`
 * (AOTR_NEEDS_LAYOUT naming the argument). */
AOTR_HIDDEN aotr_status aotr_launchable_check(const aotr_launchable *k,
                                              const aotr_arg_value *values);
/* Pack `values` in the kernel's order and launch (loading the code object
 * on first use). */
AOTR_HIDDEN aotr_status aotr_device_launch(aotr_runtime *rt, aotr_device *dev,
                                           const aotr_launchable *k, const uint32_t grid[3],
                                           void *stream, const aotr_arg_value *values);

#endif /* AOTR_INTERNAL_H */
