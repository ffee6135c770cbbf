/* Workspace and strided copies of one API call (Session), in stream order. */
#include "layer.h"

#include <algorithm>
#include <cstring>

namespace aotriton_rocm_v2 {
namespace {

struct Dim {
  int64_t size, src, dst; /* strides in bytes */
};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Copy `src` into `dst` (same sizes and element type) with 2D copies: rows
 * of the contiguous last dimension (or of single elements), along the
 * largest dimension whose pitches allow it, looping over the others. */
aotr_status copy_views(int32_t device, void *stream, const aotr_tensor &dst,
                       const aotr_tensor &src) {
  aotr_runtime *rt = runtime();
  const int64_t e = static_cast<int64_t>(element_size(src.dtype));
  if (numel(src) == 0) return AOTR_OK;
  const int r = src.rank;
  int64_t width = e;
  int loop_rank = r;
  if (r > 0 && src.strides[r - 1] == 1 && dst.strides[r - 1] == 1) {
    width = src.sizes[r - 1] * e;
    loop_rank = r - 1;
  }
  std::vector<Dim> dims;
  for (int i = 0; i < loop_rank; i++)
    if (src.sizes[i] > 1) dims.push_back({src.sizes[i], src.strides[i] * e, dst.strides[i] * e});
  std::stable_sort(dims.begin(), dims.end(), [](const Dim &a, const Dim &b) {
    return std::llabs(a.src) > std::llabs(b.src);
  });
  /* rows that continue one another in both layouts make one wider row */
  while (!dims.empty() && dims.back().src == width && dims.back().dst == width) {
    width *= dims.back().size;
    dims.pop_back();
  }
  /* merge an outer dimension into the inner one where both layouts allow */
  for (size_t j = dims.size(); j-- > 1;) {
    Dim &outer = dims[j - 1], &inner = dims[j];
    if (outer.src == inner.size * inner.src && outer.dst == inner.size * inner.dst) {
      inner.size *= outer.size;
      dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(j - 1));
    }
  }
  int row = -1;
  for (size_t j = 0; j < dims.size(); j++) {
    const Dim &d = dims[j];
    if (d.src >= width && d.dst >= width &&
        (row < 0 || d.size > dims[static_cast<size_t>(row)].size))
      row = static_cast<int>(j);
  }
  const size_t rows = row < 0 ? 1 : static_cast<size_t>(dims[static_cast<size_t>(row)].size);
  const size_t src_pitch = row < 0 ? static_cast<size_t>(width)
                                   : static_cast<size_t>(dims[static_cast<size_t>(row)].src);
  const size_t dst_pitch = row < 0 ? static_cast<size_t>(width)
                                   : static_cast<size_t>(dims[static_cast<size_t>(row)].dst);
  if (row >= 0) dims.erase(dims.begin() + row);
  std::vector<int64_t> index(dims.size(), 0);
  for (;;) {
    int64_t so = 0, doff = 0;
    for (size_t j = 0; j < dims.size(); j++) {
      so += index[j] * dims[j].src;
      doff += index[j] * dims[j].dst;
    }
    aotr_status st = aotr_copy_2d(rt, device, stream, static_cast<char *>(dst.data) + doff,
                                  dst_pitch, static_cast<const char *>(src.data) + so, src_pitch,
                                  static_cast<size_t>(width), rows);
    if (st != AOTR_OK) return st;
    size_t j = dims.size();
    while (j > 0 && ++index[j - 1] == dims[j - 1].size) index[--j] = 0;
    if (j == 0) return AOTR_OK;
  }
}

/* Packed strides for `t` in the dimension order of its own strides, rows
 * of the last dimension padded to `row` elements. */
void packed_strides(const aotr_tensor &t, int64_t row, int64_t *strides, int64_t *elements) {
  const int r = t.rank;
  if (r == 0) {
    *elements = 1;
    return;
  }
  std::vector<int> order;
  for (int i = 0; i < r - 1; i++) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::llabs(t.strides[a]) < std::llabs(t.strides[b]);
  });
  strides[r - 1] = 1;
  int64_t running = row;
  for (int i : order) {
    strides[i] = running;
    running *= std::max<int64_t>(t.sizes[i], 1);
  }
  *elements = running;
}

}  // namespace

bool is_contiguous(const aotr_tensor &t) {
  int64_t expect = 1;
  for (int i = t.rank; i-- > 0;) {
    if (t.sizes[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.sizes[i];
  }
  return true;
}

Session::~Session() {
  for (void *p : blocks_) (void)aotr_free_async(runtime(), device_, stream_, p);
}

aotr_status Session::alloc(size_t bytes, void **ptr) {
  aotr_status st = aotr_alloc_async(runtime(), device_, stream_, bytes ? bytes : 16, ptr);
  if (st == AOTR_OK) blocks_.push_back(*ptr);
  return st;
}

aotr_status Session::copy(const aotr_tensor &dst, const aotr_tensor &src) {
  return copy_views(device_, stream_, dst, src);
}

aotr_status Session::zero(const aotr_tensor &t) {
  return aotr_fill(runtime(), device_, stream_, t.data, 0,
                   static_cast<size_t>(numel(t)) * element_size(t.dtype));
}

aotr_status Session::poison(const aotr_tensor &user) {
  if (!user.data || numel(user) == 0) return AOTR_OK;
  const size_t bytes = static_cast<size_t>(numel(user)) * element_size(user.dtype);
  if (is_contiguous(user)) return aotr_fill(runtime(), device_, stream_, user.data, 0xff, bytes);
  aotr_tensor packed;
  aotr_status st = scratch(&packed, user.dtype, user.rank, user.sizes, false);
  if (st == AOTR_OK) st = aotr_fill(runtime(), device_, stream_, packed.data, 0xff, bytes);
  return st == AOTR_OK ? copy(user, packed) : st;
}

aotr_status Session::scratch(aotr_tensor *t, int32_t dtype, int rank, const int64_t *sizes,
                             bool zero_it) {
  int64_t shape[AOTR_MAX_RANK] = {0, 0, 0, 0};
  for (int i = 0; i < rank; i++) shape[i] = sizes[i]; /* `sizes` may be t's own */
  *t = aotr_tensor{};
  t->dtype = dtype;
  t->rank = rank;
  int64_t n = 1;
  for (int i = rank; i-- > 0;) {
    t->sizes[i] = shape[i];
    t->strides[i] = n;
    n *= sizes[i];
  }
  aotr_status st = alloc(static_cast<size_t>(n) * element_size(dtype), &t->data);
  if (st == AOTR_OK && zero_it) st = zero(*t);
  return st;
}

static aotr_status stage(Session *s, aotr_tensor *t, bool contiguous, aotr_tensor *staged) {
  *staged = *t;
  const int r = t->rank;
  const int64_t last = r > 0 ? t->sizes[r - 1] : 1;
  int64_t elements = 0;
  packed_strides(*t, contiguous ? last : round_up(std::max<int64_t>(last, 1), 16), staged->strides,
                 &elements);
  if (numel(*t) == 0) elements = 0;
  return s->alloc(static_cast<size_t>(elements) * element_size(t->dtype), &staged->data);
}

aotr_status Session::input(aotr_tensor *t, bool contiguous) {
  if (!t->data || aotr_layout_ok(t)) return AOTR_OK;
  aotr_tensor staged;
  aotr_status st = stage(this, t, contiguous, &staged);
  if (st == AOTR_OK) st = copy(staged, *t);
  if (st == AOTR_OK) *t = staged;
  return st;
}

aotr_status Session::output(aotr_tensor *t, bool zero_it, bool contiguous) {
  if (!t->data) return AOTR_OK;
  const bool fits = contiguous ? is_contiguous(*t) && aotr_layout_ok(t) : aotr_layout_ok(t);
  if (fits && !(zero_it && !is_contiguous(*t))) return zero_it ? zero(*t) : AOTR_OK;
  aotr_tensor staged;
  aotr_status st = stage(this, t, contiguous, &staged);
  if (st == AOTR_OK && zero_it) {
    aotr_tensor span = staged; /* the whole padded block */
    int64_t elements = 1;
    for (int i = 0; i < staged.rank; i++)
      if (staged.sizes[i] > 0) elements = std::max(elements, staged.strides[i] * staged.sizes[i]);
    span.rank = 1;
    span.sizes[0] = numel(staged) == 0 ? 0 : elements;
    span.strides[0] = 1;
    st = zero(span);
  }
  if (st == AOTR_OK) {
    outputs_.push_back({staged, *t});
    *t = staged;
  }
  return st;
}

aotr_status Session::inout(aotr_tensor *t) {
  const aotr_tensor user = *t;
  aotr_status st = input(t);
  if (st == AOTR_OK && t->data != user.data) outputs_.push_back({*t, user});
  return st;
}

aotr_status Session::finish() {
  for (const Pending &p : outputs_) {
    aotr_status st = copy(p.user, p.staged);
    if (st != AOTR_OK) return st;
  }
  outputs_.clear();
  return AOTR_OK;
}

aotr_status Session::read_i32(const void *src, size_t count, std::vector<int32_t> *out) {
  out->assign(count, 0);
  if (count == 0) return AOTR_OK;
  const size_t bytes = count * sizeof(int32_t);
  aotr_status st =
      aotr_copy_2d(runtime(), device_, stream_, out->data(), bytes, src, bytes, bytes, 1);
  if (st == AOTR_OK) st = aotr_stream_synchronize(runtime(), device_, stream_);
  return st;
}

}  // namespace aotriton_rocm_v2
