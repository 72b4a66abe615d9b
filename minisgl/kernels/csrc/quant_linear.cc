// TVM FFI entry points of the block-quantized linear layer (the kernels: quant_linear.h). The format
// follows from qs's dtype: int8 [N, K] is Q8_0 (scales fp16 [N, K/32]), uint8 [N, K/2] is Q4_1 (scales
// fp16 [N, K/32, 2]: d, m).
#include <algorithm>
#include <cstdint>

#include "ffi_common.h"
#include "quant_linear.h"

namespace {

using tvm::ffi::TensorView;

// 8 (Q8_0) or 4 (Q4_1), after checking qs and scales against an [N, K] weight
int quant_bits(const TensorView& qs, const TensorView& scales, int64_t& N, int64_t& K) {
  using namespace minisgl;
  TVM_FFI_ICHECK(qs.ndim() == 2 && dense(qs) && dense(scales)) << "qs must be a contiguous 2-D tensor, scales contiguous";
  const DLDataType qt = qs.dtype(), st = scales.dtype();
  const bool q8 = qt.code == kDLInt && qt.bits == 8, q4 = qt.code == kDLUInt && qt.bits == 8;
  TVM_FFI_ICHECK(q8 || q4) << "qs must be int8 (Q8_0) or uint8 (Q4_1)";
  TVM_FFI_ICHECK(st.code == kDLFloat && st.bits == 16) << "scales must be float16";
  N = qs.size(0);
  K = q8 ? qs.size(1) : 2 * qs.size(1);
  TVM_FFI_ICHECK(K % quant_detail::kBlock == 0) << "K (" << K << ") must be a multiple of 32";
  int64_t count = 1;
  for (int i = 0; i < scales.ndim(); ++i) count *= scales.size(i);
  TVM_FFI_ICHECK(count == N * K / 32 * (q8 ? 1 : 2)) << "scales must hold " << (q8 ? 1 : 2) << " per block of 32";
  return q8 ? 8 : 4;
}

}  // namespace

void quant_linear(TensorView x, TensorView qs, TensorView scales, TensorView out, int64_t threads) {
  using namespace minisgl;
  int64_t N, K;
  const int bits = quant_bits(qs, scales, N, K);
  TVM_FFI_ICHECK(x.ndim() == 2 && out.ndim() == 2 && dense(x) && dense(out)) << "x, out must be contiguous 2-D";
  const int64_t M = x.size(0);
  TVM_FFI_ICHECK(x.size(1) == K) << "x has " << x.size(1) << " features, the weight " << K;
  TVM_FFI_ICHECK(out.size(0) == M && out.size(1) == N) << "out must be [" << M << ", " << N << "]";
  const DLDataType dt = x.dtype();
  TVM_FFI_ICHECK(dt == out.dtype()) << "x and out must share a dtype";
  const int n = static_cast<int>(std::max<int64_t>(1, threads));
  const uint8_t* q = ptr<uint8_t>(qs);
  const uint16_t* s = ptr<uint16_t>(scales);
  if (is_f32(dt)) {
    (bits == 8 ? minisgl::qlinear<8, float> : minisgl::qlinear<4, float>)(ptr<float>(x), q, s, ptr<float>(out), M, K, N, n);
  } else if (is_bf16(dt)) {
    (bits == 8 ? minisgl::qlinear<8, uint16_t> : minisgl::qlinear<4, uint16_t>)(ptr<uint16_t>(x), q, s, ptr<uint16_t>(out), M,
                                                                        K, N, n);
  } else {
    TVM_FFI_THROW(TypeError) << "quant_linear supports float32 and bfloat16";
  }
}

void dequantize(TensorView qs, TensorView scales, TensorView out, int64_t threads) {
  using namespace minisgl;
  int64_t N, K;
  const int bits = quant_bits(qs, scales, N, K);
  TVM_FFI_ICHECK(out.ndim() == 2 && dense(out) && out.size(0) == N && out.size(1) == K)
      << "out must be a contiguous [" << N << ", " << K << "]";
  const int n = static_cast<int>(std::max<int64_t>(1, threads));
  const uint8_t* q = ptr<uint8_t>(qs);
  const uint16_t* s = ptr<uint16_t>(scales);
  if (is_f32(out.dtype())) {
    (bits == 8 ? minisgl::dequantize_blocks<8, float> : minisgl::dequantize_blocks<4, float>)(q, s, ptr<float>(out), N, K, n);
  } else if (is_bf16(out.dtype())) {
    (bits == 8 ? minisgl::dequantize_blocks<8, uint16_t> : minisgl::dequantize_blocks<4, uint16_t>)(q, s, ptr<uint16_t>(out), N, K, n);
  } else {
    TVM_FFI_THROW(TypeError) << "dequantize writes float32 or bfloat16";
  }
}
