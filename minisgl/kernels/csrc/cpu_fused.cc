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
// Rows are [tokens, features] and contiguous; float32 or bfloat16.
#include <cmath>
#include <cstdint>

#include "cpu_common.h"

namespace {

using namespace minisgl;
using tvm::ffi::TensorView;

constexpr int64_t kParallelTokens = 64;  // rows from which the cores share a call

// the value a torch op on T tensors produces: float32 arithmetic, rounded to T
template <typename T>
inline float r(float x) {
  return to_f(from_f<T>(x));
}

template <typename T>
void norm_row(const T* x, const T* w, T* out, int64_t d, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < d; ++i) ss += to_f(x[i]) * to_f(x[i]);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) out[i] = from_f<T>(to_f(w[i]) * r<T>(to_f(x[i]) * inv));
}

// res = dtype(x + res), then out = rmsnorm(res): one row of a residual add + norm (out may be x)
template <typename T>
void add_norm_row(const T* x, T* res, const T* w, T* out, int64_t d, float eps) {
  for (int64_t i = 0; i < d; ++i) res[i] = from_f<T>(to_f(x[i]) + to_f(res[i]));
  norm_row(res, w, out, d, eps);
}

template <typename T>
void rmsnorm_t(const TensorView& x, const TensorView& w, const TensorView& out, float eps) {
  const int64_t n = x.size(0), d = x.size(1);
  const T *xp = ptr<T>(x), *wp = ptr<T>(w);
  T* op = ptr<T>(out);
#pragma omp parallel for if (n >= kParallelTokens)
  for (int64_t t = 0; t < n; ++t) norm_row(xp + t * d, wp, op + t * d, d, eps);
}

template <typename T>
void fused_add_rmsnorm_t(const TensorView& x, const TensorView& res, const TensorView& w, float eps) {
  const int64_t n = x.size(0), d = x.size(1);
  T *xp = ptr<T>(x), *rp = ptr<T>(res);
  const T* wp = ptr<T>(w);
#pragma omp parallel for if (n >= kParallelTokens)
  for (int64_t t = 0; t < n; ++t) add_norm_row(xp + t * d, rp + t * d, wp, xp + t * d, d, eps);
}

// x [n, 2h] = [gate | up] rows -> out [n, h]. exp 16 lanes at a time where the CPU has AVX-512 (within
// an ulp of expf: the bf16 result is torch's but for the rare value on a rounding boundary), the rest
// with expf.
template <typename T>
void silu_rows(const T* xp, T* op, int64_t n, int64_t h) {
#pragma omp parallel for if (n >= kParallelTokens)
  for (int64_t t = 0; t < n; ++t) {
    const T* gate = xp + t * 2 * h;
    const T* up = gate + h;
    T* out = op + t * h;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= h; i += 16) {
      const __m512 g = load16(gate + i, 16);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
      const __m512 s = round16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), T{});
      store16(out + i, round16(_mm512_mul_ps(s, load16(up + i, 16)), T{}));
    }
#endif
    for (; i < h; ++i) {
      const float g = to_f(gate[i]);
      out[i] = from_f<T>(r<T>(g / (1.0f + std::exp(-g))) * to_f(up[i]));
    }
  }
}

// rotates `heads` heads of d elements in place in each of n rows (row t starts at x + t * stride)
template <typename T, typename P>
void rope_rows(T* x, int64_t stride, int64_t heads, int64_t d, int64_t n, const P* pos, const float* cs,
               int64_t width) {
  const int64_t half = d / 2;
#pragma omp parallel for if (n >= kParallelTokens)
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cs + static_cast<int64_t>(pos[t]) * width;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + t * stride + h * d;
      for (int64_t i = 0; i < half; ++i) {
        const float cos = r<T>(c[i]), sin = r<T>(c[half + i]);
        const float x1 = to_f(v[i]), x2 = to_f(v[half + i]);
        v[i] = from_f<T>(r<T>(x1 * cos) - r<T>(x2 * sin));
        v[half + i] = from_f<T>(r<T>(x2 * cos) + r<T>(x1 * sin));
      }
    }
  }
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
