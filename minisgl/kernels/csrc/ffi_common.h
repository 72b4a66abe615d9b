// What the TVM FFI wrappers of the CPU kernels share: a tensor's data pointer, layout and dtype checks.
#pragma once

#include <tvm/ffi/container/tensor.h>

#include "cpu_common.h"

namespace minisgl {

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
