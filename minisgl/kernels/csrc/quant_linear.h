// y = x w^T with w in GGUF's block formats, de-quantized in registers (the TVM FFI entry points are
// quant_linear.cc; the Python side and the rounding rules of the quantizer: minisgl/quant/cpu_int.py).
// Blocks of 32 weights along a row (K % 32 == 0), each with its own scale:
//
//   Q8_0  qs int8  [N, K]       d     fp16 [N, K/32]      w = d * q
//   Q4_1  qs uint8 [N, K/2]     (d,m) fp16 [N, K/32, 2]   w = d * q + m,  q in [0, 15]; byte j of a
//         block's 16 holds element j in its low nibble and element j + 16 in its high one (GGUF's order)
//
// A de-quantized weight is exact in float32 (d * q: 11 + 8 bits), and d * q + m is rounded once
// whether or not the sum is fused, so every level gives the reference de-quantizer's float32 values
// bit for bit. Up to small_linear's kSmallRows rows of x (a decode step) each weight row and its scales
// are read once, front to back (OpenMP over output rows), for kQuantTile rows of x at a time, and each
// dot product is summed as small_linear.h's float32 kernel sums it (kU interleaved accumulators,
// reduced in one fixed order). Past them (more arithmetic per weight), kTileN weight rows at a time are
// de-quantized to x's dtype in a per-thread buffer and small_linear's tiles multiply them. So for
// float32 x the result is small_linear's on the de-quantized weight, bit for bit, for any rows, and a
// row's result does not depend on how many rows came with it. bfloat16 x: the streaming rows multiply
// the float32 weight (x widened), the tiles its bf16 rounding (bf16 dot products where the CPU has
// them), so a row's bits can change between kSmallRows rows and more; the output is rounded once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_common.h"
#include "small_linear.h"

namespace minisgl {
namespace quant_detail {

constexpr int64_t kBlock = 32;
constexpr int kQuantTile = 4;
constexpr int kVecs = kBlock / kLanes;  // vectors per block: 2 (avx512) or 4
constexpr int kAcc = linear_detail::kU;  // accumulators per sum: small_linear's, so its order

inline float half_to_f(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact
    const float f = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  const uint32_t bits = sign | (e == 31 ? 0x7F800000u : (e + 112u) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// kLanes signed bytes as float32 lanes; kLanes unsigned bytes as int32 lanes; int32 lanes to float32
#if defined(__AVX512F__)
inline VF vload_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline VI vload_u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VF vcvt(VI a) { return _mm512_cvtepi32_ps(a); }
#elif defined(__AVX2__) && defined(__FMA__)
inline VF vload_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline VI vload_u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VF vcvt(VI a) { return _mm256_cvtepi32_ps(a); }
#else
typedef int8_t VB __attribute__((vector_size(8)));
typedef uint8_t VUB __attribute__((vector_size(8)));
inline VF vload_i8(const uint8_t* p) {
  VB b;
  std::memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, VF);
}
inline VI vload_u8(const uint8_t* p) {
  VUB b;
  std::memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, VI);
}
inline VF vcvt(VI a) { return __builtin_convertvector(a, VF); }
#endif

// The v-th kLanes weights of one block, de-quantized; s: the block's scales as float32
template <int Bits>
struct Block;
template <>
struct Block<8> {
  static constexpr int64_t kBytes = 32, kScales = 1;
  static VF get(const uint8_t* q, const float* s, int v) { return vmul(vset(s[0]), vload_i8(q + v * kLanes)); }
};
template <>
struct Block<4> {
  static constexpr int64_t kBytes = 16, kScales = 2;
  static VF get(const uint8_t* q, const float* s, int v) {
    const int e = v * kLanes;  // elements 0-15: low nibbles of bytes 0-15; 16-31: their high nibbles
    const VI b = vload_u8(q + e % 16);
    return vfma(vset(s[0]), vcvt(e >= 16 ? vshr_i(b, 4) : vand_i(b, vset_i(15))), vset(s[1]));  // b < 256
  }
};

// a block's scales as float32 (F16C's one instruction each where the level has it)
template <int Bits>
inline void block_scales(const uint16_t* h, float* s) {
  for (int i = 0; i < Block<Bits>::kScales; ++i) s[i] = half_to_f(h[i]);
}

// out[m * N] = dot(x[m], w) for MT rows of x and one quantized weight row (q, its fp16 scales h)
template <int Bits, int MT, typename OT>
void dot_rows(const float* x, const uint8_t* q, const uint16_t* h, OT* out, int64_t K, int64_t N) {
  using B = Block<Bits>;
  VF acc[MT][kAcc];
#pragma GCC unroll 4
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 2
    for (int u = 0; u < kAcc; ++u) acc[m][u] = vzero();
  for (int64_t b = 0; b < K / kBlock; ++b) {
    float s[2];
    block_scales<Bits>(h + b * B::kScales, s);
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      const VF w = B::get(q + b * B::kBytes, s, v);
      const int64_t k = b * kBlock + v * kLanes;
#pragma GCC unroll 4
      for (int m = 0; m < MT; ++m) acc[m][v % kAcc] = vfma(vload(x + m * K + k), w, acc[m][v % kAcc]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MT; ++m) {
#pragma GCC unroll 2
    for (int u = 1; u < kAcc; ++u) acc[m][0] = vadd(acc[m][0], acc[m][u]);
    out[m * N] = from_f<OT>(vsum(acc[m][0]));
  }
}

template <int Bits, typename OT>
void run(const float* x, const uint8_t* q, const uint16_t* scales, OT* out, int64_t M, int64_t K, int64_t N,
         int threads) {
  using B = Block<Bits>;
  const int64_t row_bytes = K / kBlock * B::kBytes, row_scales_n = K / kBlock * B::kScales;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* qn = q + n * row_bytes;
    const uint16_t* s = scales + n * row_scales_n;
    for (int64_t m0 = 0; m0 < M; m0 += kQuantTile) {  // the row stays in L1 between passes
      const float* xm = x + m0 * K;
      OT* om = out + m0 * N + n;
      switch (std::min<int64_t>(kQuantTile, M - m0)) {
        case 4: dot_rows<Bits, 4, OT>(xm, qn, s, om, K, N); break;
        case 3: dot_rows<Bits, 3, OT>(xm, qn, s, om, K, N); break;
        case 2: dot_rows<Bits, 2, OT>(xm, qn, s, om, K, N); break;
        default: dot_rows<Bits, 1, OT>(xm, qn, s, om, K, N); break;
      }
    }
  }
}

// n rows of weight blocks (q, scales from their first) de-quantized into out [n, K], rounded to T
template <int Bits, typename T>
void dequant_rows(const uint8_t* q, const uint16_t* scales, T* out, int64_t blocks) {
  using B = Block<Bits>;
  for (int64_t b = 0; b < blocks; ++b) {
    float s[2];
    block_scales<Bits>(scales + b * B::kScales, s);
    for (int v = 0; v < kVecs; ++v) vstore(out + b * kBlock + v * kLanes, vround(B::get(q + b * B::kBytes, s, v), T{}));
  }
}

// Past small_linear's streaming rows: kTileN weight rows at a time de-quantized to T in a buffer of
// the thread (L1-sized), then multiplied by small_linear's tiles as a dense weight (xs: x as it takes it)
template <int Bits, typename XT, typename T>
void tiled(const XT* xs, const uint8_t* q, const uint16_t* scales, T* out, int64_t M, int64_t K, int64_t N,
           int threads) {
  using B = Block<Bits>;
  constexpr int64_t NT = linear_detail::kTileN;
  static_assert(NT <= 4, "the switch below lists block widths 4 to 1");
  const int64_t row_blocks = K / kBlock;
#pragma omp parallel num_threads(threads)
  {
    std::vector<T> buf(NT * K);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < (N + NT - 1) / NT; ++t) {
      const int64_t n = t * NT, rows = std::min<int64_t>(NT, N - n);
      dequant_rows<Bits, T>(q + n * row_blocks * B::kBytes, scales + n * row_blocks * B::kScales, buf.data(),
                            rows * row_blocks);
      switch (rows) {
        case 4: linear_detail::tiles<XT, T, T, 4>(xs, buf.data(), out + n, M, K, N); break;
        case 3: linear_detail::tiles<XT, T, T, 3>(xs, buf.data(), out + n, M, K, N); break;
        case 2: linear_detail::tiles<XT, T, T, 2>(xs, buf.data(), out + n, M, K, N); break;
        default: linear_detail::tiles<XT, T, T, 1>(xs, buf.data(), out + n, M, K, N); break;
      }
    }
  }
}

}  // namespace quant_detail

// qlinear: out [M, N] = x [M, K] w^T, w in the format of Bits (8: Q8_0, 4: Q4_1); T = float or uint16_t (bf16)
template <int Bits, typename T>
void qlinear(const T* x, const uint8_t* q, const uint16_t* scales, T* out, int64_t M, int64_t K, int64_t N,
                  int threads) {
  const bool tiles = M > linear_detail::kSmallRows;
  if constexpr (std::is_same_v<T, float>) {
    if (tiles) return quant_detail::tiled<Bits, float, T>(x, q, scales, out, M, K, N, threads);
    quant_detail::run<Bits, T>(x, q, scales, out, M, K, N, threads);
  } else {
    if (tiles && linear_detail::kNativeBf16) return quant_detail::tiled<Bits, T, T>(x, q, scales, out, M, K, N, threads);
    thread_local std::vector<float> xf;  // kept from call to call (fresh ones would come from mmap)
    if (static_cast<int64_t>(xf.size()) < M * K) xf.resize(M * K);
    for (int64_t i = 0; i < M * K; ++i) xf[i] = to_f(x[i]);
    if (tiles) return quant_detail::tiled<Bits, float, T>(xf.data(), q, scales, out, M, K, N, threads);
    quant_detail::run<Bits, T>(xf.data(), q, scales, out, M, K, N, threads);
  }
}

// out [N, K] = the de-quantized weight, rounded to T (round to nearest even for bfloat16)
template <int Bits, typename T>
void dequantize_blocks(const uint8_t* q, const uint16_t* scales, T* out, int64_t N, int64_t K, int threads) {
  using namespace quant_detail;
  using B = Block<Bits>;
  const int64_t row_blocks = K / kBlock;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t n = 0; n < N; ++n)
    dequant_rows<Bits, T>(q + n * row_blocks * B::kBytes, scales + n * row_blocks * B::kScales, out + n * K, row_blocks);
}

}  // namespace minisgl
