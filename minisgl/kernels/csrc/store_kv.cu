// K/V store on the GPU: copy the new tokens' K and V rows into their slots of one layer's pool.
//
//   k, v          [N, Hkv, D]   rows may be strided (views into the qkv projection); heads contiguous
//   loc           [N] int64     the slot of each row
//   k_cache, v_cache [S, Hkv, D] contiguous: slot s starts at s * Hkv * D
//   stream        the caller's CUDA stream (torch's current stream, so CUDA-graph capture records it)
//
// It is a pure copy, so the only things that matter are wide loads and stores: every row, stride
// and base address is checked to be a multiple of 16 bytes (then one thread moves 16 bytes at a
// time), else 8, 4, 2. One block per token; its threads stride over the K row, then the V row.
//
// An FP8 (e4m3fn) cache with bf16/fp16 rows: each value is divided by its KV head's scale
// (k_scale, v_scale: float32 [Hkv], powers of two, so the division is exact), rounded to nearest-even
// and saturated to +-448 on the way, as torch's divide-clamp-cast is (``KVPool.quantize``), so
// quantizing costs no kernel of its own.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdint>

namespace {

using tvm::ffi::TensorView;

struct alignas(8) Vec8 { uint32_t a, b; };

template <typename V>
__global__ void store_rows(const char* __restrict__ k, const char* __restrict__ v, int64_t k_stride,
                           int64_t v_stride, const int64_t* __restrict__ loc, char* __restrict__ k_cache,
                           char* __restrict__ v_cache, int64_t row_bytes) {
  const int64_t t = blockIdx.x;
  const int64_t slot = loc[t];
  const int64_t n = row_bytes / sizeof(V);
  const V* ks = reinterpret_cast<const V*>(k + t * k_stride);
  const V* vs = reinterpret_cast<const V*>(v + t * v_stride);
  V* kd = reinterpret_cast<V*>(k_cache + slot * row_bytes);
  V* vd = reinterpret_cast<V*>(v_cache + slot * row_bytes);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    kd[i] = ks[i];
    vd[i] = vs[i];
  }
}

__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }

template <typename Src>
__global__ void store_rows_fp8(const Src* __restrict__ k, const Src* __restrict__ v, int64_t k_stride,
                               int64_t v_stride, const int64_t* __restrict__ loc,
                               __nv_fp8_storage_t* __restrict__ k_cache, __nv_fp8_storage_t* __restrict__ v_cache,
                               const float* __restrict__ k_scale, const float* __restrict__ v_scale, int64_t row,
                               int64_t head_dim) {
  const int64_t t = blockIdx.x;
  const int64_t slot = loc[t];
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    const int64_t h = i / head_dim;
    const float kq = __fdiv_rn(to_float(k[t * k_stride + i]), k_scale[h]);
    const float vq = __fdiv_rn(to_float(v[t * v_stride + i]), v_scale[h]);
    k_cache[slot * row + i] = __nv_cvt_float_to_fp8(kq, __NV_SATFINITE, __NV_E4M3);
    v_cache[slot * row + i] = __nv_cvt_float_to_fp8(vq, __NV_SATFINITE, __NV_E4M3);
  }
}

char* base(const TensorView& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }

int64_t row_bytes_of(const TensorView& t) {
  int64_t n = t.dtype().bits / 8;
  for (int i = 1; i < t.ndim(); ++i) n *= t.size(i);
  return n;
}

bool rows_contiguous(const TensorView& t) {  // every dim after the first is packed
  int64_t expect = 1;
  for (int i = t.ndim() - 1; i >= 1; --i) {
    if (t.size(i) != 1 && t.stride(i) != expect) return false;
    expect *= t.size(i);
  }
  return true;
}

}  // namespace

// k_scale, v_scale: read only for an FP8 cache (pass any tensor otherwise)
void store_kv(TensorView k_cache, TensorView v_cache, TensorView loc, TensorView k, TensorView v, TensorView k_scale,
              TensorView v_scale, int64_t stream) {
  TVM_FFI_ICHECK(k.ndim() >= 2 && k.ndim() == v.ndim() && k_cache.ndim() == k.ndim() && v_cache.ndim() == k.ndim())
      << "k, v, k_cache, v_cache must be [rows, ...] of the same rank";
  TVM_FFI_ICHECK(k.dtype() == v.dtype() && k_cache.dtype() == v_cache.dtype())
      << "k and v, and the two caches, must share a dtype";
  const bool fp8 = k_cache.dtype().code == kDLFloat8_e4m3fn && k.dtype() != k_cache.dtype();
  const bool half = k.dtype().bits == 16 && (k.dtype().code == kDLBfloat || k.dtype().code == kDLFloat);
  TVM_FFI_ICHECK(k.dtype() == k_cache.dtype() || (fp8 && half))
      << "the caches must have k's dtype, or be float8_e4m3fn for bfloat16/float16 rows";
  TVM_FFI_ICHECK(loc.ndim() == 1 && loc.dtype().code == kDLInt && loc.dtype().bits == 64) << "loc must be 1-D int64";
  TVM_FFI_ICHECK(loc.size(0) == k.size(0) && v.size(0) == k.size(0)) << "loc, k and v must have one row per token";
  TVM_FFI_ICHECK(k_cache.IsContiguous() && v_cache.IsContiguous()) << "the caches must be contiguous";
  TVM_FFI_ICHECK(rows_contiguous(k) && rows_contiguous(v)) << "each row of k and v must be contiguous";
  const int64_t row = row_bytes_of(k), item = k.dtype().bits / 8;
  const int64_t cache_row = fp8 ? row / item : row;
  TVM_FFI_ICHECK(row == row_bytes_of(v) && cache_row == row_bytes_of(k_cache) && cache_row == row_bytes_of(v_cache))
      << "k, v and a cache slot must have the same row size";
  const int64_t n = k.size(0);
  if (n == 0) return;
  char *kp = base(k), *vp = base(v), *kc = base(k_cache), *vc = base(v_cache);
  const int64_t ks = k.stride(0) * item, vs = v.stride(0) * item;
  const int64_t* lp = static_cast<const int64_t*>(static_cast<void*>(base(loc)));
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  if (fp8) {
    const int64_t heads = k.ndim() == 3 ? k.size(1) : 1;
    for (const TensorView* sc : {&k_scale, &v_scale}) {
      TVM_FFI_ICHECK(sc->ndim() == 1 && sc->size(0) == heads && sc->dtype().code == kDLFloat &&
                     sc->dtype().bits == 32 && sc->IsContiguous())
          << "an FP8 cache needs k_scale and v_scale: float32 [kv_heads] (contiguous)";
    }
    const float *ksc = static_cast<const float*>(static_cast<void*>(base(k_scale)));
    const float *vsc = static_cast<const float*>(static_cast<void*>(base(v_scale)));
    const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, cache_row)));
    auto kq = reinterpret_cast<__nv_fp8_storage_t*>(kc), vq = reinterpret_cast<__nv_fp8_storage_t*>(vc);
    if (k.dtype().code == kDLBfloat) {
      store_rows_fp8<<<static_cast<unsigned>(n), threads, 0, s>>>(reinterpret_cast<const __nv_bfloat16*>(kp),
          reinterpret_cast<const __nv_bfloat16*>(vp), k.stride(0), v.stride(0), lp, kq, vq, ksc, vsc, cache_row,
          cache_row / heads);
    } else {
      store_rows_fp8<<<static_cast<unsigned>(n), threads, 0, s>>>(reinterpret_cast<const __half*>(kp),
          reinterpret_cast<const __half*>(vp), k.stride(0), v.stride(0), lp, kq, vq, ksc, vsc, cache_row,
          cache_row / heads);
    }
  } else {
    // the widest access every address and stride is aligned to
    uint64_t bits = static_cast<uint64_t>(row) | ks | vs | reinterpret_cast<uintptr_t>(kp) |
                    reinterpret_cast<uintptr_t>(vp) | reinterpret_cast<uintptr_t>(kc) | reinterpret_cast<uintptr_t>(vc);
    auto launch = [&](auto vec, int64_t width) {
      using V = decltype(vec);
      const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, row / width)));
      store_rows<V><<<static_cast<unsigned>(n), threads, 0, s>>>(kp, vp, ks, vs, lp, kc, vc, row);
    };
    if (bits % 16 == 0) launch(uint4{}, 16);
    else if (bits % 8 == 0) launch(Vec8{}, 8);
    else if (bits % 4 == 0) launch(uint32_t{}, 4);
    else if (bits % 2 == 0) launch(uint16_t{}, 2);
    else launch(uint8_t{}, 1);
  }
  cudaError_t err = cudaGetLastError();
  TVM_FFI_ICHECK(err == cudaSuccess) << "store_kv launch failed: " << cudaGetErrorString(err);
}
