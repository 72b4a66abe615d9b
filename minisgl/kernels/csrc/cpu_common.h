// What the CPU kernels share: bfloat16 <-> float32, a tensor's data pointer, a layout check.
#pragma once

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <cstring>

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

template <typename T>
T* ptr(const tvm::ffi::TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// Laid out row after row with no gaps. Not TensorView::IsContiguous: torch calls a tensor contiguous
// whatever the stride of a dimension of size 1 (a [1, d] row sliced out of a wider one), and so do we.
inline bool dense(const tvm::ffi::TensorView& t) {
  int64_t expect = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != expect) return false;
    expect *= t.size(i);
  }
  return true;
}

inline bool is_index(const tvm::ffi::TensorView& t) {  // positions, slots: int32 or int64
  return t.dtype().code == kDLInt && (t.dtype().bits == 32 || t.dtype().bits == 64);
}
inline int64_t index_at(const tvm::ffi::TensorView& t, int64_t i) {
  return t.dtype().bits == 64 ? ptr<int64_t>(t)[i] : ptr<int32_t>(t)[i];
}

inline bool is_f32(const DLDataType& t) { return t.code == kDLFloat && t.bits == 32; }
inline bool is_bf16(const DLDataType& t) { return t.code == kDLBfloat && t.bits == 16; }

}  // namespace minisgl
