// Element-wise steps of a decoder layer on the CPU, row by row, on raw pointers (the TVM FFI entry
// points are in cpu_fused.cc, whose header comment states what each computes). Each rounds where the
// torch version in minisgl/layers rounds, so in bfloat16 it produces the same values up to the order
// of a sum or exp's last bit. The norms and rotary are scalar float32 code (the same bits on every
// level); SwiGLU's exponentials are computed a vector at a time (simd.h's vexp, the tail of a row too,
// so no libm call makes one machine's result differ from another's on the portable level).
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu_common.h"

namespace minisgl {

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
void rmsnorm_rows(const T* x, const T* w, T* out, int64_t n, int64_t d, float eps) {
#pragma omp parallel for if (n >= kParallelTokens)
  for (int64_t t = 0; t < n; ++t) norm_row(x + t * d, w, out + t * d, d, eps);
}

template <typename T>
void add_rmsnorm_rows(T* x, T* res, const T* w, int64_t n, int64_t d, float eps) {
#pragma omp parallel for if (n >= kParallelTokens)
  for (int64_t t = 0; t < n; ++t) add_norm_row(x + t * d, res + t * d, w, x + t * d, d, eps);
}

// x [n, 2h] = [gate | up] rows -> out [n, h]: out = dtype(dtype(silu(gate)) * up)
template <typename T>
void silu_rows(const T* xp, T* op, int64_t n, int64_t h) {
#pragma omp parallel for if (n >= kParallelTokens)
  for (int64_t t = 0; t < n; ++t) {
    const T* gate = xp + t * 2 * h;
    const T* up = gate + h;
    T* out = op + t * h;
    for (int64_t i = 0; i < h; i += kLanes) {
      const int64_t m = h - i;  // >= kLanes but at the row's end
      const VF g = m >= kLanes ? vload(gate + i) : vload(gate + i, m);
      const VF s = vround(vdiv(g, vadd(vset(1.0f), vexp(vsub(vzero(), g)))), T{});
      const VF y = vround(vmul(s, m >= kLanes ? vload(up + i) : vload(up + i, m)), T{});
      if (m >= kLanes) {
        vstore(out + i, y);
      } else {
        vstore(out + i, y, m);
      }
    }
  }
}

// rotates `heads` heads of d elements in place in each of n rows (row t starts at x + t * stride),
// "rotate half" pairs (i, i + d/2); cs [positions, d] float32 = [cos | sin], read in T
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

}  // namespace minisgl
