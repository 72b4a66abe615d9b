// One vector of float32 lanes, for the instruction set this library is compiled for. jit.py builds one
// library per level, each with its own flags, and the flags alone pick the code below:
//
//   level      flags                       VF                     lanes  registers
//   avx512     -march=native (has avx512f) __m512                 16     32
//   avx2       -march=haswell              __m256                  8     16 (AVX2 + FMA + F16C)
//   portable   none (the target's base)    GCC/Clang vector ext.   8     SSE2 on x86-64, NEON on aarch64
//
// Every kernel is written once against this interface (vload, vfma, vsum, vexp, ...). Contracts that
// hold on every level, which the tests check on each level the machine can run:
//   * vfma(a, b, c) = a * b + c: one rounding (FMA) on avx512/avx2; on portable two (a product and a
//     sum: no FMA in the x86-64 base, and -ffp-contract=off keeps an aarch64 compiler from fusing), so
//     a portable result is the same bits on x86-64 and aarch64.
//   * vsum and vmaxall reduce the lanes in one fixed order per level: a sum never depends on how many
//     rows a kernel was given (batch invariance).
//   * vexp: 2^n * p(r) with the same steps on every level; within ~1 ulp of expf, 0 below -87, inf
//     above ~88.7. avx512 and avx2 give the same bits (the same fused steps), portable its own.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace minisgl {

#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
constexpr int kLanes = 16;
using VF = __m512;

inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vset(float a) { return _mm512_set1_ps(a); }
inline VF vadd(VF a, VF b) { return _mm512_add_ps(a, b); }
inline VF vsub(VF a, VF b) { return _mm512_sub_ps(a, b); }
inline VF vmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF vdiv(VF a, VF b) { return _mm512_div_ps(a, b); }
inline VF vmax(VF a, VF b) { return _mm512_max_ps(a, b); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF vfnma(VF a, VF b, VF c) { return _mm512_fnmadd_ps(a, b, c); }
inline __mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VF vload(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(first(n), p); }  // past n: 0
inline VF bf16_lanes(__m256i b) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)); }
inline VF vload(const uint16_t* p) { return bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VF vload(const uint16_t* p, int64_t n) { return bf16_lanes(_mm256_maskz_loadu_epi16(first(n), p)); }
inline float vsum(VF a) { return _mm512_reduce_add_ps(a); }
inline float vmaxall(VF a) { return _mm512_reduce_max_ps(a); }
inline VF vzero_below(VF a, VF x, float lim) {  // 0 where x < lim, else a
  return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, _mm512_set1_ps(lim), _CMP_LT_OQ), a);
}
inline VF vround_even(VF a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VF vpow2i(VF n) {  // 2^n for integral n in [-126, 127]: the exponent field
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline __m512i vbits(VF a) { return _mm512_castps_si512(a); }
using VI = __m512i;
inline VF vfrombits(VI b) { return _mm512_castsi512_ps(b); }
inline VI vset_i(int32_t a) { return _mm512_set1_epi32(a); }
inline VI vand_i(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI vor_i(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI vadd_i(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI vshr_i(VI a, int s) { return _mm512_srli_epi32(a, s); }
inline VI vselect_nan(VF x, VI if_nan, VI other) {
  return _mm512_mask_mov_epi32(other, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), if_nan);
}
inline void vstore(float* p, VF a) { _mm512_storeu_ps(p, a); }
inline void vstore(float* p, VF a, int64_t n) { _mm512_mask_storeu_ps(p, first(n), a); }
inline void vstore(uint16_t* p, VF a) {  // a holds bf16 values (vround): their top halves
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(vbits(a), 16)));
}
inline void vstore(uint16_t* p, VF a, int64_t n) {
  _mm256_mask_storeu_epi16(p, first(n), _mm512_cvtepi32_epi16(_mm512_srli_epi32(vbits(a), 16)));
}

#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
constexpr int kLanes = 8;
using VF = __m256;
using VI = __m256i;

inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vset(float a) { return _mm256_set1_ps(a); }
inline VF vadd(VF a, VF b) { return _mm256_add_ps(a, b); }
inline VF vsub(VF a, VF b) { return _mm256_sub_ps(a, b); }
inline VF vmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF vdiv(VF a, VF b) { return _mm256_div_ps(a, b); }
inline VF vmax(VF a, VF b) { return _mm256_max_ps(a, b); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF vfnma(VF a, VF b, VF c) { return _mm256_fnmadd_ps(a, b, c); }
inline VI first(int64_t n) {  // lanes < n all ones (maskload/maskstore read the top bit)
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n < 8 ? n : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VF vload(const float* p, int64_t n) { return _mm256_maskload_ps(p, first(n)); }
inline VF bf16_lanes(__m128i b) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16)); }
inline VF vload(const uint16_t* p) { return bf16_lanes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VF vload(const uint16_t* p, int64_t n) {  // no masked 16-bit loads in AVX2: through a zeroed copy
  alignas(16) uint16_t tmp[8] = {};
  std::memcpy(tmp, p, (n < 8 ? n : 8) * sizeof(uint16_t));
  return bf16_lanes(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}
inline float vsum(VF a) {  // (lo + hi) halves, then pairs: a fixed tree
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vmaxall(VF a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VF vzero_below(VF a, VF x, float lim) { return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(lim), _CMP_LT_OQ), a); }
inline VF vround_even(VF a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VF vpow2i(VF n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline VI vbits(VF a) { return _mm256_castps_si256(a); }
inline VF vfrombits(VI b) { return _mm256_castsi256_ps(b); }
inline VI vset_i(int32_t a) { return _mm256_set1_epi32(a); }
inline VI vand_i(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI vor_i(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI vadd_i(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI vshr_i(VI a, int s) { return _mm256_srli_epi32(a, s); }
inline VI vselect_nan(VF x, VI if_nan, VI other) {
  return _mm256_blendv_epi8(other, if_nan, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
}
inline void vstore(float* p, VF a) { _mm256_storeu_ps(p, a); }
inline void vstore(float* p, VF a, int64_t n) { _mm256_maskstore_ps(p, first(n), a); }
inline __m128i bf16_halves(VF a) {  // the top 16 bits of each lane, packed (values <= 0xFFFF: no saturation)
  const __m256i h = _mm256_srli_epi32(vbits(a), 16);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08));
}
inline void vstore(uint16_t* p, VF a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_halves(a)); }
inline void vstore(uint16_t* p, VF a, int64_t n) {
  alignas(16) uint16_t tmp[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(tmp), bf16_halves(a));
  std::memcpy(p, tmp, (n < 8 ? n : 8) * sizeof(uint16_t));
}

#else
// Portable: 8 float32 lanes as a GCC/Clang vector type; the compiler maps each operation onto the
// target's vectors (2 SSE2 registers on x86-64, 2 NEON registers on aarch64). No intrinsics.
constexpr const char* kIsa = "portable";
constexpr int kLanes = 8;
typedef float VF __attribute__((vector_size(32)));
typedef int32_t VI __attribute__((vector_size(32)));
typedef uint32_t VU __attribute__((vector_size(32)));
typedef uint16_t VH __attribute__((vector_size(16)));

inline VF vzero() { return VF{}; }
inline VF vset(float a) { return VF{} + a; }
inline VF vadd(VF a, VF b) { return a + b; }
inline VF vsub(VF a, VF b) { return a - b; }
inline VF vmul(VF a, VF b) { return a * b; }
inline VF vdiv(VF a, VF b) { return a / b; }
inline VI vbits(VF a) { return (VI)a; }  // a cast between vector types of one size keeps the bits
inline VF vfrombits(VI b) { return (VF)b; }
inline VF vselect(VI mask, VF a, VF b) { return vfrombits((mask & vbits(a)) | (~mask & vbits(b))); }
inline VF vmax(VF a, VF b) { return vselect(a > b, a, b); }  // b where either is NaN, as maxps
inline VF vfma(VF a, VF b, VF c) { return a * b + c; }  // two roundings: see the top of this file
inline VF vfnma(VF a, VF b, VF c) { return c - a * b; }
inline VF vload(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline VF vload(const float* p, int64_t n) {
  VF v = {};
  std::memcpy(&v, p, (n < 8 ? n : 8) * sizeof(float));
  return v;
}
inline VF bf16_lanes(VH h) { return vfrombits(__builtin_convertvector(h, VI) << 16); }
inline VF vload(const uint16_t* p) {
  VH h;
  std::memcpy(&h, p, sizeof(h));
  return bf16_lanes(h);
}
inline VF vload(const uint16_t* p, int64_t n) {
  VH h = {};
  std::memcpy(&h, p, (n < 8 ? n : 8) * sizeof(uint16_t));
  return bf16_lanes(h);
}
inline float vsum(VF a) {  // the same tree as the avx2 level's
  const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  return (s0 + s2) + (s1 + s3);
}
inline float vmaxall(VF a) {
  float m = a[0];
  for (int i = 1; i < 8; ++i) m = a[i] > m ? a[i] : m;
  return m;
}
inline VF vzero_below(VF a, VF x, float lim) { return vfrombits(vbits(a) & ~(x < vset(lim))); }
inline VF vround_even(VF a) {  // |a| < 2^22: adding 1.5 * 2^23 rounds to an integer (to even)
  const VF magic = vset(12582912.0f);
  return (a + magic) - magic;
}
inline VF vpow2i(VF n) { return vfrombits((__builtin_convertvector(n, VI) + 127) << 23); }
inline VI vset_i(int32_t a) { return VI{} + a; }
inline VI vand_i(VI a, VI b) { return a & b; }
inline VI vor_i(VI a, VI b) { return a | b; }
inline VI vadd_i(VI a, VI b) { return a + b; }
inline VI vshr_i(VI a, int s) { return (VI)((VU)a >> s); }  // logical (unsigned lanes)
inline VI vselect_nan(VF x, VI if_nan, VI other) {
  const VI nan = x != x;
  return (nan & if_nan) | (~nan & other);
}
inline void vstore(float* p, VF a) { std::memcpy(p, &a, sizeof(a)); }
inline void vstore(float* p, VF a, int64_t n) { std::memcpy(p, &a, (n < 8 ? n : 8) * sizeof(float)); }
inline void vstore(uint16_t* p, VF a, int64_t n) {
  const VH h = __builtin_convertvector(vshr_i(vbits(a), 16), VH);
  std::memcpy(p, &h, (n < 8 ? n : 8) * sizeof(uint16_t));
}
inline void vstore(uint16_t* p, VF a) { vstore(p, a, 8); }
#endif

// exp(x) lane by lane: x = n ln2 + r, |r| <= ln2 / 2, p(r) a degree-7 Taylor polynomial (relative error
// < 2e-7, about an ulp), times 2^n. 2^n is applied in two halves (2^(n - n/2) * 2^(n/2), each a normal
// float for n in [-126, 128]), so p * 2^n is rounded once, as AVX-512's scalef rounds it. Below -87 the
// result is 0 (expf's would be denormal or 0), above 88.7 inf.
inline VF vexp(VF x) {
  const VF low = vset(-87.0f);
  const VF xc = vmax(x, low);
  const VF n = vround_even(vmul(xc, vset(1.44269504088896341f)));
  VF r = vfnma(n, vset(0.693145751953125f), xc);  // ln2 in two parts: n * the first is exact
  r = vfnma(n, vset(1.428606765330187e-06f), r);
  VF p = vset(1.0f / 5040);
  p = vfma(p, r, vset(1.0f / 720));
  p = vfma(p, r, vset(1.0f / 120));
  p = vfma(p, r, vset(1.0f / 24));
  p = vfma(p, r, vset(1.0f / 6));
  p = vfma(p, r, vset(0.5f));
  p = vfma(p, r, vset(1.0f));
  p = vfma(p, r, vset(1.0f));
  const VF half = vround_even(vmul(n, vset(0.5f)));  // n/2 rounded: |half|, |n - half| <= 64
  p = vmul(vmul(p, vpow2i(half)), vpow2i(vsub(n, half)));
  return vzero_below(p, x, -87.0f);
}

// lanes of float32 rounded to T's values (round to nearest even for bfloat16, as from_f), as float32
inline VF vround(VF x, float) { return x; }
inline VF vround(VF x, uint16_t) {
  const VI b = vbits(x);
  const VI odd = vand_i(vshr_i(b, 16), vset_i(1));
  const VI top = vset_i(static_cast<int32_t>(0xFFFF0000u));
  const VI r = vand_i(vadd_i(b, vadd_i(vset_i(0x7FFF), odd)), top);
  return vfrombits(vselect_nan(x, vand_i(vor_i(b, vset_i(0x400000)), top), r));  // NaN stays NaN (quiet)
}

}  // namespace minisgl
