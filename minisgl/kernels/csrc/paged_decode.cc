// Paged decode attention on the CPU: one query token per request, its keys and values read in
// place from the KV pool through the request's slot list (no gathered copy of K/V).
//
//   q      [B, H, D]        the new tokens' queries (float32 or bfloat16)
//   k, v   [S, Hkv, D]      the pool of one layer, indexed by slot
//   slots  [B, Lmax] int64  slots[b, j] = slot of token j of request b (j < lens[b])
//   lens   [B] int32        tokens each request attends to (its cached sequence + the new one)
//   out    [B, H, D]        softmax(q k^T * scale) v, per request and head (GQA: head h reads kv
//                           head h / (H / Hkv))
//
// Work is split over (request, kv head); the query heads of a group share every K/V row read.
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using tvm::ffi::TensorView;

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) {
  uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline void store(float* p, int64_t i, float x) { p[i] = x; }
inline void store(uint16_t* p, int64_t i, float x) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  p[i] = static_cast<uint16_t>(bits >> 16);
}

template <typename T>
const T* ptr(const TensorView& t) {
  return reinterpret_cast<const T*>(static_cast<const char*>(t.data_ptr()) + t.byte_offset());
}

template <typename T>
void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& slots,
         const TensorView& lens, const TensorView& out, float scale, int threads) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), Lmax = slots.size(1);
  const int64_t G = H / Hkv;
  const T* qp = ptr<T>(q);
  const T* kp = ptr<T>(k);
  const T* vp = ptr<T>(v);
  const int64_t* sp = ptr<int64_t>(slots);
  const int32_t* lp = ptr<int32_t>(lens);
  T* op = const_cast<T*>(ptr<T>(out));
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(threads)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t g = 0; g < Hkv; ++g) {
      const int64_t L = lp[b];
      std::vector<float> qf(G * D), acc(G * D, 0.0f), s(G * L);
      for (int64_t h = 0; h < G; ++h)
        for (int64_t d = 0; d < D; ++d) qf[h * D + d] = load(qp, (b * H + g * G + h) * D + d) * scale;
      for (int64_t j = 0; j < L; ++j) {  // scores: each K row read once for the whole group
        const int64_t base = (sp[b * Lmax + j] * Hkv + g) * D;
        for (int64_t h = 0; h < G; ++h) {
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qf[h * D + d] * load(kp, base + d);
          s[h * L + j] = dot;
        }
      }
      std::vector<float> inv(G);
      for (int64_t h = 0; h < G; ++h) {  // softmax
        float* row = s.data() + h * L;
        const float m = *std::max_element(row, row + L);
        float sum = 0.0f;
        for (int64_t j = 0; j < L; ++j) sum += (row[j] = std::exp(row[j] - m));
        inv[h] = 1.0f / sum;
      }
      for (int64_t j = 0; j < L; ++j) {  // weighted sum of V rows
        const int64_t base = (sp[b * Lmax + j] * Hkv + g) * D;
        for (int64_t h = 0; h < G; ++h) {
          const float w = s[h * L + j];
          for (int64_t d = 0; d < D; ++d) acc[h * D + d] += w * load(vp, base + d);
        }
      }
      for (int64_t h = 0; h < G; ++h)
        for (int64_t d = 0; d < D; ++d) store(op, (b * H + g * G + h) * D + d, acc[h * D + d] * inv[h]);
    }
  }
}

}  // namespace

void paged_decode_attention(TensorView q, TensorView k, TensorView v, TensorView slots, TensorView lens,
                            TensorView out, double scale, int64_t threads) {
  TVM_FFI_ICHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3 && out.ndim() == 3) << "q/k/v/out must be 3-D";
  TVM_FFI_ICHECK(q.IsContiguous() && k.IsContiguous() && v.IsContiguous() && out.IsContiguous()
                 && slots.IsContiguous() && lens.IsContiguous()) << "inputs must be contiguous";
  TVM_FFI_ICHECK(q.size(1) % k.size(1) == 0) << "query heads must be a multiple of KV heads";
  TVM_FFI_ICHECK(slots.dtype().code == kDLInt && slots.dtype().bits == 64) << "slots must be int64";
  TVM_FFI_ICHECK(lens.dtype().code == kDLInt && lens.dtype().bits == 32) << "lens must be int32";
  const DLDataType dt = q.dtype();
  TVM_FFI_ICHECK(dt == k.dtype() && dt == v.dtype() && dt == out.dtype()) << "q, k, v, out must share a dtype";
  const int n = static_cast<int>(std::max<int64_t>(1, threads));
  if (dt.code == kDLFloat && dt.bits == 32) {
    run<float>(q, k, v, slots, lens, out, static_cast<float>(scale), n);
  } else if (dt.code == kDLBfloat && dt.bits == 16) {
    run<uint16_t>(q, k, v, slots, lens, out, static_cast<float>(scale), n);
  } else {
    TVM_FFI_THROW(TypeError) << "paged_decode_attention supports float32 and bfloat16";
  }
}
