/*
 * libaotriton_rocm: ahead-of-time compiled FlashAttention kernels (Triton)
 * for AMD ROCm GPUs (and the NVIDIA sm_90 test target), behind a plain C ABI.
 *
 * The library reads the kernel archives (`<arch>.aotr`) that the
 * aotriton-rocm packages install, picks the kernel and config for a request,
 * packs its arguments and launches it through the HIP runtime or the CUDA
 * driver that the process has already loaded (dlopen; nothing is linked at
 * build time).
 *
 * Conventions
 * - Every function that can fail returns an aotr_status; on failure
 *   aotr_last_error() holds a message for the calling thread that says what
 *   went wrong and what to do. Nothing aborts the process.
 * - Structs passed in start with `struct_size` (set it to sizeof the struct
 *   you compiled against): later releases of one ABI line only append
 *   fields, and treat the fields a caller did not pass as zero.
 * - Tensors are described by aotr_tensor (device address, dtype, sizes and
 *   strides in elements). Nothing is copied or allocated on the device: a
 *   tensor whose layout the kernels cannot read in place is reported with
 *   AOTR_NEEDS_LAYOUT and the caller makes a copy that meets
 *   aotr_layout_ok().
 *
 * ABI: the soname is libaotriton_rocm.so.<ABI line> (e.g. .so.0.1); point
 * releases of one line keep every symbol, prototype and struct prefix.
 */
#ifndef AOTRITON_ROCM_H
#define AOTRITON_ROCM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define AOTR_API __attribute__((visibility("default")))
#else
#define AOTR_API
#endif

#define AOTR_VERSION_MAJOR 0
#define AOTR_VERSION_MINOR 1
#define AOTR_VERSION_PATCH 0
#define AOTR_ABI_LINE "0.1"

typedef enum aotr_status {
    AOTR_OK = 0,
    /* The caller broke the contract (NULL pointer, struct_size, rank, ...). */
    AOTR_INVALID_ARGUMENT = 1,
    /* A well-formed request the kernels do not cover: use another
     * implementation (torch's own kernel, for instance). */
    AOTR_UNSUPPORTED = 2,
    /* A tensor's layout breaks the assumptions the kernels were compiled
     * with (unit last stride, 16-byte aligned base, strides divisible by 16
     * elements): copy it into a layout that meets aotr_layout_ok(), call again. */
    AOTR_NEEDS_LAYOUT = 3,
    /* No kernel archive is installed for the device's arch. */
    AOTR_NOT_FOUND = 4,
    /* An archive is unreadable, truncated or corrupted. */
    AOTR_ARCHIVE_INVALID = 5,
    /* An archive is for another arch, ABI line or backend than the file
     * name, the device or this library. */
    AOTR_IDENTITY_MISMATCH = 6,
    /* The process has no usable HIP runtime / CUDA driver. */
    AOTR_DRIVER_UNAVAILABLE = 7,
    /* A driver call (module load, launch) failed. */
    AOTR_DRIVER_ERROR = 8,
    AOTR_OUT_OF_MEMORY = 9
} aotr_status;

/* The calling thread's message for the last failure ("" if none). */
AOTR_API const char *aotr_last_error(void);
/* "AOTR_OK", "AOTR_UNSUPPORTED", ...; "AOTR_UNKNOWN_STATUS" otherwise. */
AOTR_API const char *aotr_status_name(aotr_status status);
/* "0.1.0" and "0.1". */
AOTR_API const char *aotr_version(void);
AOTR_API const char *aotr_abi_line(void);

typedef enum aotr_dtype {
    AOTR_DTYPE_INVALID = 0,
    AOTR_FP16 = 1,
    AOTR_BF16 = 2,
    AOTR_FP32 = 3,
    AOTR_INT32 = 4,
    AOTR_INT64 = 5
} aotr_dtype;

#define AOTR_MAX_RANK 4

typedef struct aotr_tensor {
    void *data;    /* device address; NULL marks an optional tensor absent */
    int32_t dtype; /* aotr_dtype */
    int32_t rank;  /* 0..AOTR_MAX_RANK */
    int64_t sizes[AOTR_MAX_RANK];
    int64_t strides[AOTR_MAX_RANK]; /* in elements */
} aotr_tensor;

/* 1 if the kernels can read/write `t` in place: unit last-dim stride,
 * 16-byte aligned base address, every other stride a multiple of 16. */
AOTR_API int aotr_layout_ok(const aotr_tensor *t);

/* ---------------------------------------------------------------- archives */

typedef struct aotr_archive aotr_archive;

/* Open `<arch>.aotr`: reads the header and index (code objects are read,
 * decompressed and sha256-checked on first use), and checks the archive's
 * identity: format version, manifest arch == file name, ABI line == this
 * library's. */
AOTR_API aotr_status aotr_archive_open(const char *path, aotr_archive **out);
AOTR_API void aotr_archive_close(aotr_archive *archive);
AOTR_API const char *aotr_archive_path(const aotr_archive *archive);
/* Manifest fields: "arch", "abi_version", "package_version", "backend",
 * "rocm_profile", "build_inputs_hash", ...; NULL when absent or not a string. */
AOTR_API const char *aotr_archive_manifest_string(const aotr_archive *archive, const char *key);
AOTR_API size_t aotr_archive_kernel_count(const aotr_archive *archive);
/* Check the whole blob region and every code object against the index. */
AOTR_API aotr_status aotr_archive_verify(aotr_archive *archive);

/* Where the archive of `arch` is, in this order: `dir` (if not NULL), the
 * directories in AOTRITON_ROCM_ARCHIVE_DIR, the image packages installed
 * beside this library (wheel: site-packages/aotriton_rocm_<arch>/; conda:
 * <prefix>/share/aotriton-rocm/). Writes the path (NUL-terminated). */
AOTR_API aotr_status aotr_find_archive(const char *arch, const char *dir, char *path,
                                       size_t path_capacity);

/* ----------------------------------------------------------------- runtime */

typedef enum aotr_backend {
    AOTR_BACKEND_AUTO = 0, /* from the archive's manifest */
    AOTR_BACKEND_HIP = 1,
    AOTR_BACKEND_CUDA = 2,
    /* The caller runs the kernels (the CPU interpreter of the kernel
     * sources): the runtime plans each call as it does for a GPU, with
     * host memory, and hands every launch to `host_launch`. */
    AOTR_BACKEND_HOST = 3
} aotr_backend;

/* AOTR_BACKEND_HOST: one planned launch. `key` is the kernel record's key;
 * `args` holds one 64-bit word per argument of the record, in its order
 * (the trailing scratch pointers included): pointers as addresses, i32
 * sign-extended, fp32 as its bits in the low 32, i64 as is. Return 0 when
 * the kernel ran; anything else fails the call with AOTR_DRIVER_ERROR. */
typedef int32_t (*aotr_host_launch_fn)(void *user, const char *key, const uint32_t grid[3],
                                       const uint64_t *args, size_t num_args);

typedef struct aotr_runtime_options {
    uint32_t struct_size;
    /* Searched before everything else for `<arch>.aotr` (may be NULL). */
    const char *archive_dir;
    /* The driver library to use instead of the one already loaded in the
     * process (libamdhip64.so / libcuda.so.1); may be NULL. */
    const char *driver_library;
    /* aotr_backend: AUTO takes the backend of an added archive, else the
     * HIP runtime or CUDA driver the process has loaded. */
    int32_t backend;
    /* AOTR_BACKEND_HOST only: the kernel records as an archive's index
     * holds them (JSON: {"manifest": {...}, "kernels": [...]}, records
     * without code objects, manifest arch "host"), and the launcher. The
     * runtime copies the index. */
    const char *host_index;
    size_t host_index_size;
    aotr_host_launch_fn host_launch;
    void *host_user;
    /* What the host stands in for when a split count is chosen (compute
     * units); 0: none, so no call is split unless asked. */
    int32_t host_compute_units;
} aotr_runtime_options;

typedef struct aotr_runtime aotr_runtime;

/* A runtime serves every device of the process; thread-safe. `options` may
 * be NULL (defaults). */
AOTR_API aotr_status aotr_runtime_create(const aotr_runtime_options *options, aotr_runtime **out);
AOTR_API void aotr_runtime_destroy(aotr_runtime *runtime);
/* Use this archive for its arch (instead of searching). The archive's arch
 * must match the device it is used on. */
AOTR_API aotr_status aotr_runtime_add_archive(aotr_runtime *runtime, const char *path);
/* The arch name the runtime uses for `device` ("gfx942", "sm_90"). */
AOTR_API aotr_status aotr_runtime_device_arch(aotr_runtime *runtime, int32_t device, char *arch,
                                              size_t arch_capacity);
/* Launches since creation of `kernel` ("attn_fwd", ...; NULL: all kernels),
 * so that a caller can prove these kernels ran. */
AOTR_API uint64_t aotr_runtime_launch_count(const aotr_runtime *runtime, const char *kernel);

/* --------------------------------------------------------------- attention */

typedef enum aotr_causal_alignment {
    /* Key j visible from query i iff j <= i + (seqlen_k - seqlen_q)
     * (flash-attn, torch's CUDA flash op). */
    AOTR_CAUSAL_BOTTOM_RIGHT = 0,
    /* j <= i (torch's math backend). Equal when seqlen_q == seqlen_k. */
    AOTR_CAUSAL_TOP_LEFT = 1
} aotr_causal_alignment;

/* One attention problem. Dense: q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D),
 * Hq a multiple of Hkv. Variable length: cu_seqlens_q/k given, q (total_q,
 * Hq, D), k/v (total_k, Hkv, D), max_seqlen_q/k the longest sequences.
 * v may have a head dim Dv of its own; out and grad_out then have Dv. */
typedef struct aotr_attn_problem {
    aotr_tensor q, k, v;
    aotr_tensor cu_seqlens_q, cu_seqlens_k; /* int32 (B + 1,), or absent */
    int32_t max_seqlen_q, max_seqlen_k;     /* varlen only */
    /* Additive bias, a (B, Hq, Sq, Sk) view (stride 0 on broadcast dims),
     * of q's dtype; or absent. */
    aotr_tensor bias;
    float scale;     /* softmax scale (e.g. 1/sqrt(D)) */
    float dropout_p; /* in [0, 1) */
    /* Philox seed and offset: int64 device scalars; needed when dropout_p
     * > 0 or a debug mask is written; the backward must get the forward's. */
    aotr_tensor philox_seed, philox_offset;
    int32_t causal;           /* 0 or 1 */
    int32_t causal_alignment; /* aotr_causal_alignment */
    /* Sliding window: key j visible from query i iff
     * i + shift - left <= j <= i + shift + right (shift per causal_alignment)
     * after aotr_attn_window's rule (flash-attn's: a side < 0 or >= seqlen_k
     * is unbounded; causal sets right = 0). */
    int32_t window_left, window_right;
} aotr_attn_problem;

typedef struct aotr_attn_fwd_params {
    uint32_t struct_size;
    int32_t device; /* device index */
    void *stream;   /* hipStream_t / CUstream; NULL: the default stream */
    aotr_attn_problem problem;
    aotr_tensor out; /* like q */
    aotr_tensor lse; /* fp32 (B, Hq, >= Sq), varlen (Hq, total_q): natural log */
    /* Optional (B, Hq, Sq, Sk) contiguous, q's dtype: unnormalised
     * probabilities, negated where dropout dropped them. Variable length:
     * (B, Hq, max_seqlen_q, max_seqlen_k), sequence b at the top left of [b]
     * (the rest untouched). */
    aotr_tensor debug_mask;
    /* ---- appended in 0.1 (absent when struct_size does not cover them;
     * softcap first, so that the struct has no tail padding for a later
     * field to fall into) */
    /* flash-attn's softcap: > 0 replaces each scaled score s by
     * softcap * tanh(s / softcap); 0 (or absent): off. */
    float softcap;
    /* flash-attn's ALiBi: fp32 slopes (Hq,) or (B, Hq) in device memory, or
     * absent. Adds -slope * |i + seqlen_k - seqlen_q - j| to the score of
     * query i and key j (per sequence with cu_seqlens; bottom-right aligned
     * whatever causal_alignment says), after the softcap, before the bias
     * and the masks; the lse is that of the biased scores. */
    aotr_tensor alibi_slopes;
    /* ---- appended in 0.1 (absent when struct_size does not cover them):
     * a variable-length batch whose sequences do not lie end to end as
     * cu_seqlens says. int32 (B,) device vectors, each optional:
     *   seq_starts_q/k[b]: the row of q / of k and v where sequence b starts
     *     (absent: cu_seqlens_q/k[b]; e.g. Transformer Engine's
     *     cu_seqlens_padded);
     *   seqlens_k[b]: sequence b's number of keys (absent: cu_seqlens_k[b + 1]
     *     - cu_seqlens_k[b]; e.g. flash-attn's seqused_k). With seqlens_k and
     *     seq_starts_k given, cu_seqlens_k may be absent.
     * Queries are counted by cu_seqlens_q (B + 1) as before; max_seqlen_q/k
     * bound the lengths (0: the side's rows bound them). The lse is (Hq,
     * rows of q), sequence b's values at its rows; rows of out (and,
     * backward, of the gradients) outside every sequence keep their values.
     * The kernels read the vectors on the device (put together in a few
     * bytes of stream-ordered memory): nothing synchronises, and a graph
     * capture records the call. Like cu_seqlens, the values are trusted. */
    aotr_tensor seq_starts_q, seq_starts_k, seqlens_k;
} aotr_attn_fwd_params;

typedef struct aotr_attn_bwd_params {
    uint32_t struct_size;
    int32_t device;
    void *stream;
    aotr_attn_problem problem;          /* the forward's */
    aotr_tensor out, lse;               /* the forward's outputs */
    aotr_tensor grad_out;               /* like out */
    aotr_tensor grad_q, grad_k, grad_v; /* like q, k, v */
    aotr_tensor grad_bias;              /* optional, like the bias view, zeroed by the caller */
    aotr_tensor delta;                  /* workspace: fp32, shaped and strided like lse */
    /* ---- appended in 0.1 (absent when struct_size does not cover them) */
    float softcap;            /* the forward's (see aotr_attn_fwd_params) */
    aotr_tensor alibi_slopes; /* the forward's; the slopes get no gradient */
    /* ---- appended in 0.1 (absent when struct_size does not cover it) */
    /* Optional workspace for the fused backward: fp32, shaped like q, laid
     * out as the kernels assume (aotr_layout_ok), zeroed by the caller.
     * Where the device's image has the fused kernels for the problem
     * (aotr_attn_supported with AOTR_NEED_DQ_ACCUM), one pass over the key
     * blocks computes dK, dV and dQ, summing dQ here in fp32 before it is
     * scaled into grad_q: faster, but the order of that sum varies from run
     * to run (not bitwise deterministic). Absent: the split kernels, which
     * are deterministic. */
    aotr_tensor grad_q_accum;
    /* ---- appended in 0.1 (absent when struct_size does not cover them):
     * the forward's sequence layout (see aotr_attn_fwd_params). */
    aotr_tensor seq_starts_q, seq_starts_k, seqlens_k;
} aotr_attn_bwd_params;

/* The device-independent half of aotr_attn_supported: ranks, dtypes,
 * shapes, head dim, GQA ratio, dropout range, 32-bit limits. Needs no
 * runtime and reads no data (any address works, also host memory). */
AOTR_API aotr_status aotr_attn_check(const aotr_attn_problem *problem);

/* The window sides every call of this library runs with (the one place of
 * the rule): flash-attn's window_size normalisation, as its mha_fwd and
 * torch's _flash_attention_forward apply it. A side < 0 or >= seqlen_k
 * (the keys: max_seqlen_k for packed batches, the cache's capacity for a
 * KV cache) is unbounded, -1; causal then sets the right side to 0. */
AOTR_API void aotr_attn_window(int64_t window_left, int64_t window_right, int32_t causal,
                               int64_t seqlen_k, int32_t *out /* [2]: left, right */);

/* The softmax scale of a call that gives none (the one place of the rule):
 * 1/sqrt(head_dim), torch's and flash-attn's default; 1 for head_dim <= 0.
 * The calls themselves take `scale` as given. */
AOTR_API double aotr_attn_default_scale(int64_t head_dim);

enum {
    AOTR_NEED_BACKWARD = 1,   /* the backward kernels must be there too */
    AOTR_NEED_DEBUG_MASK = 2, /* the forward writes a debug mask */
    /* the backward would use aotr_attn_bwd_params.grad_q_accum: AOTR_OK
     * only where the image has the fused backward for the problem */
    AOTR_NEED_DQ_ACCUM = 4,
    /* the image has the philox_state kernel (aotr_philox_state): dropout
     * under graph capture */
    AOTR_NEED_PHILOX_STATE = 8
};

/* AOTR_OK if the kernels cover the request (aotr_attn_check passes and the
 * device's archive has every kernel it needs); AOTR_UNSUPPORTED with the
 * reason in aotr_last_error() otherwise (or the status of a missing or
 * mismatched archive). Launches nothing. `needs`: AOTR_NEED_* flags. */
AOTR_API aotr_status aotr_attn_supported(aotr_runtime *runtime, int32_t device,
                                         const aotr_attn_problem *problem, uint32_t needs);

/* Launch the forward / backward on `stream`. Asynchronous, like any
 * kernel launch. AOTR_UNSUPPORTED / AOTR_NEEDS_LAYOUT launch nothing.
 * A kernel that needs global scratch (on CUDA, the sm_90 forward keeps its
 * TMA descriptors there: a few hundred bytes per program) gets it in
 * `stream`'s order from a memory pool the runtime makes for the device,
 * which keeps up to 64 MiB of freed scratch mapped across synchronisations
 * (cuMemAllocFromPoolAsync; the device's default pool, cuMemAllocAsync,
 * where the driver has no pools), freed with cuMemFreeAsync right after the
 * launch; CUDA-graph capture records both as memory nodes.
 * Head dims 1 to 512. The kernels take multiples of 8; at any other head dim
 * D the call runs at the next multiple of 8 on copies of q, k, v (and out,
 * grad_out) zero-padded to it, made in `stream`'s order in device memory of
 * the same kind (hipMallocAsync on HIP), with 2D copies that need a unit
 * last stride (else AOTR_NEEDS_LAYOUT) but no other layout rule; the
 * outputs are copied back at D and the memory freed in `stream`'s order.
 * Likewise when v's head dim Dv differs from D: the call runs at the next
 * multiple of 8 of the larger one (zero columns add nothing to q.k nor to
 * the outputs' columns, which are copied back at D and Dv).
 * There the backward ignores grad_q_accum (the split kernels run). */
AOTR_API aotr_status aotr_attn_fwd(aotr_runtime *runtime, const aotr_attn_fwd_params *params);
AOTR_API aotr_status aotr_attn_bwd(aotr_runtime *runtime, const aotr_attn_bwd_params *params);

/* The packed rows a variable-length problem's cu_seqlens_q and cu_seqlens_k
 * cover (their last entries), after checking them as flash-attn's callers
 * must give them: starting at 0, non-decreasing, within q's and k's packed
 * rows, no sequence longer than max_seqlen_q/k (AOTR_INVALID_ARGUMENT names
 * the broken rule). Reads both vectors back on the host and synchronises
 * `stream`. While `stream` is being captured nothing is read: AOTR_OK with
 * both counts -1 (the caller answers for the offsets). */
AOTR_API aotr_status aotr_varlen_rows(aotr_runtime *runtime, int32_t device, void *stream,
                                      const aotr_attn_problem *problem, int64_t *rows_q,
                                      int64_t *rows_k);

/* ------------------------------------------------------ attention, KV cache */

/* The most splits of the keys one call may use. */
#define AOTR_MAX_SPLITS 128

/* Attention of queries over a key/value cache (flash-attn's
 * flash_attn_with_kvcache after its append; torch's _flash_attention_forward
 * with seqused_k / block_table / num_splits). fp16/bf16, head dims 1 to 256:
 * at one that is not a multiple of 8, on zero-padded copies of q, the whole
 * caches and out (see aotr_attn_fwd: every call copies the caches), with a
 * workspace of its own; out_partial is then checked but not written.
 *
 * Queries: q (B, Sq, Hq, D) (flash-attn's layout; any strides meeting
 * aotr_layout_ok), or packed (total_q, Hq, D) with cu_seqlens_q and
 * max_seqlen_q. Caches, of q's dtype and head dim, Hq a multiple of Hkv:
 * - dense: (B_cache, S_cache, Hkv, D); batch b reads cache row
 *   cache_batch_idx[b] (or b);
 * - paged (block_table given, int32 (B, max_blocks), unit stride along the
 *   blocks): (num_blocks, page_size, Hkv, D), page_size a multiple of 16;
 *   cache position n of batch b is row n % page_size of block
 *   block_table[b][n / page_size].
 * Batch b attends to the cache positions [k_start[b], k_end[b]) (int32
 * (B,) device vectors; k_start absent: 0). With L = k_end[b] - k_start[b]
 * keys, key j (counted from k_start[b]) is visible from query i iff
 * i + L - Sq - window_left <= j <= i + L - Sq + window_right (-1:
 * unbounded; causal sets window_right = 0): bottom-right aligned per batch.
 * Scores: scale * q.k; softcap > 0: softcap * tanh(s / softcap); with
 * alibi_slopes (fp32 (Hq,) or (B, Hq)) minus slope * |i + L - Sq - j|.
 * Rows that see no key: output 0, lse +inf.
 *
 * Split-KV: num_splits programs share the keys of each query tile (1: no
 * split; 0: chosen from the device's compute units, see
 * aotr_attn_fwd_kvcache_splits). With more than one split the caller
 * passes the workspace (this library allocates no device memory), fp32 and
 * contiguous:
 *   out_partial (B * Hq, splits, Sq, D), lse_partial (B * Hq, splits, Sq)
 * (Sq: max_seqlen_q when packed); it is not read when splits == 1. */
typedef struct aotr_attn_kvcache_params {
    uint32_t struct_size;
    int32_t device;
    void *stream;
    aotr_tensor q;
    aotr_tensor cu_seqlens_q; /* int32 (B + 1,), or absent */
    int32_t max_seqlen_q;     /* packed q only */
    aotr_tensor k_cache, v_cache;
    aotr_tensor k_end;           /* int32 (B,) */
    aotr_tensor k_start;         /* int32 (B,), or absent */
    aotr_tensor cache_batch_idx; /* int32 (B,), or absent; dense caches only */
    aotr_tensor block_table;     /* int32 (B, max_blocks), or absent (dense) */
    aotr_tensor alibi_slopes;    /* fp32 (Hq,) or (B, Hq), or absent */
    float scale;
    float softcap;  /* 0: none */
    int32_t causal; /* 0 or 1 */
    int32_t window_left, window_right;
    int32_t num_splits;      /* 0: automatic; 1 .. AOTR_MAX_SPLITS */
    aotr_tensor out;         /* like q */
    aotr_tensor lse;         /* fp32 (B, Hq, >= Sq); packed: (Hq, total_q) */
    aotr_tensor out_partial; /* workspace, see above */
    aotr_tensor lse_partial;
} aotr_attn_kvcache_params;

/* The number of splits aotr_attn_fwd_kvcache will use for `params` (its
 * num_splits, or with 0 the automatic choice: 1 unless the (batch, kv head,
 * query tile) programs leave the device's compute units idle, then about two
 * programs per compute unit, at least 4 key blocks of the cache's capacity
 * per split, at most AOTR_MAX_SPLITS), so that the caller can size the
 * workspace. Checks the request like aotr_attn_fwd_kvcache, launches nothing;
 * ignores out_partial / lse_partial. */
AOTR_API aotr_status aotr_attn_fwd_kvcache_splits(aotr_runtime *runtime,
                                                  const aotr_attn_kvcache_params *params,
                                                  int32_t *num_splits);

/* Launch the KV-cache forward (and, with splits, the combine) on `stream`.
 * AOTR_UNSUPPORTED / AOTR_NEEDS_LAYOUT / AOTR_INVALID_ARGUMENT launch nothing. */
AOTR_API aotr_status aotr_attn_fwd_kvcache(aotr_runtime *runtime,
                                           const aotr_attn_kvcache_params *params);
/* ------------------------------------------------------------ dropout draws */

/* The draws behind the attention kernels' dropout, for callers that
 * regenerate the mask a forward used (torch's aten::_fill_mem_eff_dropout_mask_).
 * Score e = ((z * H + h) * Sq + i) * Sk + j of a (B, H, Sq, Sk) problem
 * is kept iff u > dropout_p, u in (0, 1] being (the top 24 bits of the first
 * word of Philox-4x32-10 keyed by the seed, at the 128-bit counter with e in
 * its low 64 bits and offset in its high 64 bits, plus one) times 2**-24. */
typedef struct aotr_dropout_uniform_params {
    uint32_t struct_size;
    int32_t device;
    void *stream;
    /* Contiguous fp32 (B, H, Sq, Sk), 16-byte aligned: receives u per element. */
    aotr_tensor out;
    /* The forward's Philox seed and offset (int64 device scalars). */
    aotr_tensor philox_seed, philox_offset;
    float dropout_p; /* in [0, 1]; only read with encode_keep */
    /* 0: write u; 1: write 0.5 where kept (u > dropout_p), -0.5 where
     * dropped (torch's ROCm encoding of the mask). */
    int32_t encode_keep;
} aotr_dropout_uniform_params;

/* Launch the draws on `stream` (asynchronous). AOTR_UNSUPPORTED when the
 * device's archive has no dropout_uniform kernel (an older image). */
AOTR_API aotr_status aotr_dropout_uniform(aotr_runtime *runtime,
                                          const aotr_dropout_uniform_params *params);

/* A dropout call's (seed, offset) made on the device, for graph capture:
 * the caller's seed and base offset are device scalars that each replay
 * refills (PyTorch's graph-safe RNG state), the call's offset within the
 * graph a number. One kernel on `stream` writes *seed_out = *philox_seed
 * and *offset_out = *philox_offset + offset_add; pass seed_out and
 * offset_out as the attention call's philox_seed and philox_offset. */
typedef struct aotr_philox_state_params {
    uint32_t struct_size;
    int32_t device;
    void *stream;
    aotr_tensor philox_seed, philox_offset; /* int64 device scalars, read */
    int64_t offset_add;
    aotr_tensor seed_out, offset_out; /* int64 device scalars, written */
} aotr_philox_state_params;

/* Launch it (asynchronous). AOTR_UNSUPPORTED when the device's archive has
 * no philox_state kernel (an image built before it). */
AOTR_API aotr_status aotr_philox_state(aotr_runtime *runtime,
                                       const aotr_philox_state_params *params);

/* ----------------------------------------------- stream-ordered device memory */

/* For layers over this library that stage tensors themselves (libaotriton_v2:
 * AOTriton's C++ API takes any strides and its callers ignore errors). Each
 * goes through the runtime's driver (HIP runtime / CUDA driver), in the
 * order of `stream` on `device`; nothing here synchronises but
 * aotr_stream_synchronize. */

/* The device current on the calling thread (hipGetDevice; the device of the
 * current CUDA context). */
AOTR_API aotr_status aotr_current_device(aotr_runtime *runtime, int32_t *device);
/* *capturing = 1 while `stream` is being captured into a graph, else 0. */
AOTR_API aotr_status aotr_stream_capturing(aotr_runtime *runtime, int32_t device, void *stream,
                                           int *capturing);
AOTR_API aotr_status aotr_stream_synchronize(aotr_runtime *runtime, int32_t device, void *stream);
/* Copy `rows` rows of `width` bytes (addresses in the unified address space:
 * device or host memory). */
AOTR_API aotr_status aotr_copy_2d(aotr_runtime *runtime, int32_t device, void *stream, void *dst,
                                  size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                                  size_t rows);
/* Set `bytes` bytes to `value` (0..255). */
AOTR_API aotr_status aotr_fill(aotr_runtime *runtime, int32_t device, void *stream, void *dst,
                               int value, size_t bytes);
/* Device memory allocated and freed in stream order (hipMallocAsync /
 * cuMemAllocAsync; at least 256-byte aligned). */
AOTR_API aotr_status aotr_alloc_async(aotr_runtime *runtime, int32_t device, void *stream,
                                      size_t bytes, void **ptr);
AOTR_API aotr_status aotr_free_async(aotr_runtime *runtime, int32_t device, void *stream,
                                     void *ptr);
/* The device's compute units (CUs / SMs). */
AOTR_API aotr_status aotr_compute_units(aotr_runtime *runtime, int32_t device, int32_t *count);

#ifdef __cplusplus
}
#endif

#endif /* AOTRITON_ROCM_H */
