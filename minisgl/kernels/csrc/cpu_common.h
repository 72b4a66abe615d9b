// What the CPU kernels share: bfloat16 <-> float32 one value at a time, and the vectors of simd.h. No
// TVM FFI here: the kernels' cores take raw pointers, so a standalone harness can run them
// (tests/cpu_kernels_harness.cc; TensorView helpers: ffi_common.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "simd.h"

namespace minisgl {

inline float to_f(float v) { return v; }
inline float to_f(uint16_t b) {  // bfloat16 bits: the top half of a float32
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
T from_f(float x);
template <>
inline float from_f<float>(float x) {
  return x;
}
template <>
inline uint16_t from_f<uint16_t>(float x) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace minisgl
