// TVM FFI entry points of the decode-step linear (the kernel itself: small_linear.h) and of what the
// library was built for.
#include <algorithm>
#include <cstdint>

#include "ffi_common.h"
#include "small_linear.h"

// The level this library was compiled for (simd.h): "avx512", "avx2" or "portable"
tvm::ffi::String isa() { return minisgl::kIsa; }

void small_linear(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView out, int64_t threads) {
  using namespace minisgl;
  TVM_FFI_ICHECK(x.ndim() == 2 && w.ndim() == 2 && out.ndim() == 2) << "x, w, out must be 2-D";
  TVM_FFI_ICHECK(dense(x) && dense(w) && dense(out)) << "x, w, out must be contiguous";
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TVM_FFI_ICHECK(w.size(1) == K) << "x has " << K << " features, w " << w.size(1);
  TVM_FFI_ICHECK(out.size(0) == M && out.size(1) == N) << "out must be [" << M << ", " << N << "]";
  const DLDataType dt = x.dtype();
  TVM_FFI_ICHECK(dt == w.dtype() && dt == out.dtype()) << "x, w, out must share a dtype";
  const int n = static_cast<int>(std::max<int64_t>(1, threads));
  if (is_f32(dt)) {
    linear<float>(ptr<float>(x), ptr<float>(w), ptr<float>(out), M, K, N, n);
  } else if (is_bf16(dt)) {
    linear<uint16_t>(ptr<uint16_t>(x), ptr<uint16_t>(w), ptr<uint16_t>(out), M, K, N, n);
  } else {
    TVM_FFI_THROW(TypeError) << "small_linear supports float32 and bfloat16";
  }
}
