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
// The kernel: paged_decode.h (vector code on every level of simd.h).
#include <algorithm>
#include <cstdint>

#include "ffi_common.h"
#include "paged_decode.h"

using tvm::ffi::TensorView;

void paged_decode_attention(TensorView q, TensorView k, TensorView v, TensorView slots, TensorView lens,
                            TensorView out, double scale, int64_t threads) {
  using namespace minisgl;
  TVM_FFI_ICHECK(q.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3 && out.ndim() == 3) << "q/k/v/out must be 3-D";
  TVM_FFI_ICHECK(dense(q) && dense(k) && dense(v) && dense(out)
                 && dense(slots) && dense(lens)) << "inputs must be contiguous";
  TVM_FFI_ICHECK(q.size(1) % k.size(1) == 0) << "query heads must be a multiple of KV heads";
  TVM_FFI_ICHECK(slots.dtype().code == kDLInt && slots.dtype().bits == 64) << "slots must be int64";
  TVM_FFI_ICHECK(lens.dtype().code == kDLInt && lens.dtype().bits == 32) << "lens must be int32";
  const DLDataType dt = q.dtype();
  TVM_FFI_ICHECK(dt == k.dtype() && dt == v.dtype() && dt == out.dtype()) << "q, k, v, out must share a dtype";
  const int n = static_cast<int>(std::max<int64_t>(1, threads));
  const int64_t B = q.size(0), D = q.size(2), H = q.size(1), Hkv = k.size(1), Lmax = slots.size(1);
  const int64_t* sp = ptr<int64_t>(slots);
  const int32_t* lp = ptr<int32_t>(lens);
  const float sc = static_cast<float>(scale);
  if (is_f32(dt)) {
    attend(ptr<float>(q), H * D, ptr<float>(k), ptr<float>(v), sp, Lmax, lp, ptr<float>(out), B, H, Hkv, D, sc, n);
  } else if (is_bf16(dt)) {
    using B16 = uint16_t;
    attend(ptr<B16>(q), H * D, ptr<B16>(k), ptr<B16>(v), sp, Lmax, lp, ptr<B16>(out), B, H, Hkv, D, sc, n);
  } else {
    TVM_FFI_THROW(TypeError) << "paged_decode_attention supports float32 and bfloat16";
  }
}
