/* libaotriton_v2's internals: AOTriton's C++ API mapped onto the C core
 * (libaotriton_rocm, linked in). Nothing about kernels lives here: the
 * layer translates the params, stages tensors whose layout the kernels
 * cannot read in place, and reports what the core refuses. */
#ifndef AOTRITON_ROCM_V2_LAYER_H
#define AOTRITON_ROCM_V2_LAYER_H

#include <aotriton/flash.h>
#include <aotriton_rocm/aotriton_rocm.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace aotriton_rocm_v2 {

/* The process's runtime (created on first use; NULL with the reason
 * printed when no driver can be opened). */
aotr_runtime *runtime();

/* The device current on the calling thread, prepared on first use: the
 * kernel image found beside this library (or where libaotriton_rocm looks)
 * is added to the runtime. */
aotr_status current_device(int32_t *device);

/* The arch name of `device` ("gfx942", "sm_90"), "" when unknown. */
const char *device_arch(int32_t device);

/* hipSuccess, or the hipError_t of a failed status; prints the core's
 * message (PyTorch ignores the return value: the message is what is left). */
hipError_t report(aotr_status status, const char *what);

/* `status` with `message` as the reason report() prints (the layer's own
 * refusals; the core's carry aotr_last_error()). */
aotr_status fail(aotr_status status, const char *message);

/* A call's variable-length batch as the 0.14 line's varlen_bits word says
 * it (Q's mode in bits 7:0, K's in 15:8, the logsumexp layout in 17:16)
 * with the arrays it reads; the older lines' cu_seqlens, seq_strides and
 * varlen_type are translated to it the way upstream's 0.14 library
 * translates a 0.13 caller's params. */
struct Varlen {
  uint32_t bits = 0; /* 0: dense */
  aotriton::TensorView<1> q0, k0, q1, k1;
};

/* The word of an older line's call: none without cu_seqlens_q; else
 * padded (0x0202) for VarlenType::PaddedVarlen, strided (0x1313) with
 * seq_strides_q, compact (0x0B0B) otherwise. */
uint32_t legacy_varlen_bits(int8_t varlen_type, bool cu_seqlens_q, bool seq_strides_q);

/* The v3 entry points after the version check (v2 calls come here too). */
hipError_t forward(const aotriton::v3::flash::attn_fwd_params &params, void *stream);
hipError_t backward(const aotriton::v3::flash::attn_bwd_params &params, void *stream,
                    bool deterministic);

/* 1 if every call PyTorch admits is covered on `device` (cached). */
bool covers_admitted_calls(int32_t device);

/* The core's element type of an API dtype (AOTR_DTYPE_INVALID if none). */
int32_t core_dtype(aotriton::DType dtype);
size_t element_size(int32_t core_dtype);

template <int Rank>
aotr_tensor core_tensor(const aotriton::TensorView<Rank> &view) {
  aotr_tensor t{};
  t.data = view.data_ptr();
  t.dtype = core_dtype(view.dtype());
  t.rank = Rank;
  for (int i = 0; i < Rank; i++) {
    t.sizes[i] = static_cast<int64_t>(view.size(i));
    t.strides[i] = static_cast<int64_t>(view.stride(i));
  }
  return t;
}

inline int64_t numel(const aotr_tensor &t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; i++) n *= t.sizes[i];
  return n;
}

/* Device memory and copies of one API call, in the order of its stream.
 * Tensors the kernels cannot read in place are replaced by staged copies
 * (16-element aligned rows); staged outputs are copied back by finish().
 * The destructor frees the workspace in stream order. */
class Session {
 public:
  Session(int32_t device, void *stream) : device_(device), stream_(stream) {}
  ~Session();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  int32_t device() const { return device_; }
  void *stream() const { return stream_; }

  aotr_status alloc(size_t bytes, void **ptr);
  /* An input: staged when aotr_layout_ok() fails (contiguous if asked). */
  aotr_status input(aotr_tensor *t, bool contiguous = false);
  /* An output: staged when aotr_layout_ok() fails (or `contiguous` is asked
   * and t is not); zeroed first when `zero`. */
  aotr_status output(aotr_tensor *t, bool zero = false, bool contiguous = false);
  /* An output whose rows the call may leave unwritten: staged like output(),
   * but copied in first, so that those rows come back as they were. */
  aotr_status inout(aotr_tensor *t);
  /* A fresh packed (contiguous) tensor. */
  aotr_status scratch(aotr_tensor *t, int32_t dtype, int rank, const int64_t *sizes, bool zero);
  /* Copy between two views of one shape and dtype. */
  aotr_status copy(const aotr_tensor &dst, const aotr_tensor &src);
  aotr_status zero(const aotr_tensor &t); /* contiguous tensors only */
  /* All bits set (NaN in every float type): what a refused call leaves in
   * its outputs, so that a caller that ignores the error sees it. */
  aotr_status poison(const aotr_tensor &user);
  /* Copy the staged outputs back into the caller's views. */
  aotr_status finish();
  /* `count` int32 values from device memory (synchronises the stream). */
  aotr_status read_i32(const void *src, size_t count, std::vector<int32_t> *out);

 private:
  struct Pending {
    aotr_tensor staged, user;
  };
  int32_t device_;
  void *stream_;
  std::vector<void *> blocks_;
  std::vector<Pending> outputs_;
};

bool is_contiguous(const aotr_tensor &t);

/* An int64 device scalar at `data` (PyTorch passes int64 or uint64). */
aotr_tensor int64_scalar(void *data);

/* The kernels read one Philox offset; under graph capture PyTorch passes a
 * base that each replay refills (*offset) plus the call's offset within the
 * graph (offset2), and the forward wants the values used in `outputs`
 * (seed, offset). Then the philox_state kernel writes (seed, base +
 * offset2) there (workspace where the caller gave none) in stream order,
 * and *seed and *offset are redirected to it. Nothing to do otherwise. */
aotr_status philox_inputs(Session &s, uint64_t offset2, std::pair<void *, void *> outputs,
                          aotr_tensor *seed, aotr_tensor *offset);

}  // namespace aotriton_rocm_v2

#endif
