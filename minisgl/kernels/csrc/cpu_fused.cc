// Element-wise steps of a decoder layer on the CPU, each one pass over its rows instead of the 3-16
// small torch ops it replaces (at batch 1 a decode step is ~1,000 such ops, each costing more in
// dispatch than in arithmetic). Each rounds where the torch version in minisgl/layers rounds, so in
// bfloat16 it produces the same values up to the order of a sum:
//
//   rmsnorm(x, w, out, eps)                 out = w * dtype(x / rms(x))      (the rms in float32)
//   fused_add_rmsnorm(x, res, w, eps)       res = dtype(x + res); x = rmsnorm(res)      (in place)
//   silu_and_mul(x, out)                    out = dtype(silu(gate)) * up, x = [gate | up]
//   rope(pos, q, k, cos_sin, head_dim)      q, k rotated in place, "rotate half" pairs (i, i + d/2);
//                                           cos_sin [max_pos, d] float32 = [cos | sin], read in dtype
//
// Rows are [tokens, features] and contiguous; float32 or bfloat16. The kernels: cpu_fused.h.
#include <cstdint>

#include "cpu_fused.h"
#include "ffi_common.h"

namespace {

using namespace minisgl;
using tvm::ffi::TensorView;

template <typename T>
void rmsnorm_t(const TensorView& x, const TensorView& w, const TensorView& out, float eps) {
  rmsnorm_rows(ptr<T>(x), ptr<T>(w), ptr<T>(out), x.size(0), x.size(1), eps);
}

template <typename T>
void fused_add_rmsnorm_t(const TensorView& x, const TensorView& res, const TensorView& w, float eps) {
  add_rmsnorm_rows(ptr<T>(x), ptr<T>(res), ptr<T>(w), x.size(0), x.size(1), eps);
}

template <typename T, typename P>
void rope_t(const TensorView& pos, const TensorView& q, const TensorView& k, const TensorView& cos_sin, int64_t d) {
  for (const TensorView* x : {&q, &k})
    rope_rows(ptr<T>(*x), x->size(1), x->size(1) / d, d, x->size(0), ptr<P>(pos), ptr<float>(cos_sin), d);
}

void check_rows(const TensorView& t, const char* name) {
  TVM_FFI_ICHECK(t.ndim() == 2 && dense(t)) << name << " must be 2-D and contiguous";
  TVM_FFI_ICHECK(is_f32(t.dtype()) || is_bf16(t.dtype())) << name << " must be float32 or bfloat16";
}

void check_same(const TensorView& a, const TensorView& b, const char* what) {
  TVM_FFI_ICHECK(a.dtype() == b.dtype()) << what << " must share a dtype";
}

}  // namespace

void rmsnorm(TensorView x, TensorView w, TensorView out, double eps) {
  check_rows(x, "x");
  check_same(x, w, "x and w");
  check_same(x, out, "x and out");
  TVM_FFI_ICHECK(w.ndim() == 1 && w.size(0) == x.size(1) && dense(w)) << "w must be [features]";
  TVM_FFI_ICHECK(dense(out) && out.size(0) == x.size(0) && out.size(1) == x.size(1)) << "out must be like x";
  if (is_f32(x.dtype())) {
    rmsnorm_t<float>(x, w, out, static_cast<float>(eps));
  } else {
    rmsnorm_t<uint16_t>(x, w, out, static_cast<float>(eps));
  }
}

void fused_add_rmsnorm(TensorView x, TensorView res, TensorView w, double eps) {
  check_rows(x, "x");
  check_same(x, res, "x and residual");
  check_same(x, w, "x and w");
  TVM_FFI_ICHECK(dense(res) && res.size(0) == x.size(0) && res.size(1) == x.size(1)) << "residual: like x";
  TVM_FFI_ICHECK(w.ndim() == 1 && w.size(0) == x.size(1) && dense(w)) << "w must be [features]";
  if (is_f32(x.dtype())) {
    fused_add_rmsnorm_t<float>(x, res, w, static_cast<float>(eps));
  } else {
    fused_add_rmsnorm_t<uint16_t>(x, res, w, static_cast<float>(eps));
  }
}

void silu_and_mul(TensorView x, TensorView out) {
  check_rows(x, "x");
  check_rows(out, "out");
  check_same(x, out, "x and out");
  TVM_FFI_ICHECK(x.size(0) == out.size(0) && x.size(1) == 2 * out.size(1)) << "x must be [tokens, 2 * out features]";
  if (is_f32(x.dtype())) {
    silu_rows(ptr<float>(x), ptr<float>(out), out.size(0), out.size(1));
  } else {
    silu_rows(ptr<uint16_t>(x), ptr<uint16_t>(out), out.size(0), out.size(1));
  }
}

void rope(TensorView pos, TensorView q, TensorView k, TensorView cos_sin, int64_t head_dim) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_same(q, k, "q and k");
  TVM_FFI_ICHECK(pos.ndim() == 1 && dense(pos) && pos.size(0) == q.size(0) && k.size(0) == q.size(0))
      << "positions must be [tokens], q and k [tokens, heads * head_dim]";
  TVM_FFI_ICHECK(head_dim % 2 == 0 && q.size(1) % head_dim == 0 && k.size(1) % head_dim == 0) << "bad head_dim";
  TVM_FFI_ICHECK(cos_sin.ndim() == 2 && dense(cos_sin) && is_f32(cos_sin.dtype()) && cos_sin.size(1) == head_dim)
      << "cos_sin must be float32 [max_position, head_dim]";
  TVM_FFI_ICHECK(is_index(pos)) << "positions must be int32 or int64";
  const int64_t max_pos = cos_sin.size(0);
  for (int64_t t = 0; t < pos.size(0); ++t) {  // an index past the table would read out of bounds
    const int64_t p = index_at(pos, t);
    TVM_FFI_ICHECK(p >= 0 && p < max_pos) << "position " << p << " outside the rotary table (" << max_pos << ")";
  }
  const bool f32 = is_f32(q.dtype());
  if (pos.dtype().bits == 64) {
    f32 ? rope_t<float, int64_t>(pos, q, k, cos_sin, head_dim) : rope_t<uint16_t, int64_t>(pos, q, k, cos_sin, head_dim);
  } else {
    f32 ? rope_t<float, int32_t>(pos, q, k, cos_sin, head_dim) : rope_t<uint16_t, int32_t>(pos, q, k, cos_sin, head_dim);
  }
}
