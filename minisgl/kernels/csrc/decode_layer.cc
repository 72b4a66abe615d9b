// One decoder layer of a CPU decode step (one new token per request, a few requests) in one call: the
// CPU's counterpart of a CUDA graph. The Python layer launches ~20 torch ops and 4 kernels per layer,
// ~160 us of dispatch at batch 1 against ~300 us of weight streaming; here the same steps run back to
// back in C++, through the same kernels the Python path calls one by one (included below, so it is
// their code, not a copy), and round where it rounds:
//
//   first layer: residual = x                else: residual = dtype(x + residual)
//   x = rmsnorm(residual, ln1)
//   qkv = x w_qkv^T;  q, k per-head rmsnorm (Qwen3: q_norm/k_norm non-empty);  rope(q, k)
//   k_pool[out_loc], v_pool[out_loc] = k, v;  a = attention(q, pool, slots, lens)
//   residual = dtype(a w_o^T + residual);  x = rmsnorm(residual, ln2)
//   x = silu_and_mul(x w_gate_up^T) w_down^T
//
// x, residual [n, hidden] are updated in place. The rest as in paged_decode.cc and cpu_fused.cc.
#include "cpu_fused.cc"
#include "paged_decode.cc"
#include "quant_linear.cc"
#include "small_linear.cc"

namespace {

using namespace minisgl;
using tvm::ffi::TensorView;

constexpr int64_t kParallelRows = 8;

// out = x w^T for one of the layer's linear weights: dense (s empty), or Q8_0 / Q4_1 blocks (w int8 /
// uint8, s their fp16 scales: quant_linear.h)
// a weight's input features: Q4_1 blocks (uint8) hold two a byte
inline int64_t in_features(const TensorView& w, const TensorView& s) {
  return s.numel() > 0 && w.dtype().code == kDLUInt ? 2 * w.size(1) : w.size(1);
}

template <typename T>
void product(const T* x, const TensorView& w, const TensorView& s, T* out, int64_t M, int64_t K, int64_t N, int nt) {
  if (s.numel() == 0) {
    linear<T>(x, ptr<T>(w), out, M, K, N, nt);
  } else if (w.dtype().code == kDLInt) {
    qlinear<8, T>(x, ptr<uint8_t>(w), ptr<uint16_t>(s), out, M, K, N, nt);
  } else {
    qlinear<4, T>(x, ptr<uint8_t>(w), ptr<uint16_t>(s), out, M, K, N, nt);
  }
}

template <typename T>
void layer(const TensorView& x, const TensorView& res, bool first, const int64_t* pos, const float* cs, int64_t d,
           const TensorView& ln1, const TensorView& w_qkv, const T* q_norm, const T* k_norm,
           const TensorView& k_pool, const TensorView& v_pool, const int64_t* out_loc, const TensorView& slots,
           const TensorView& lens, const TensorView& w_o, const TensorView& ln2, const TensorView& w_gate_up,
           const TensorView& w_down, const TensorView* sc, int64_t heads, int64_t kv_heads, float eps, float scale,
           int threads) {
  const int64_t n = x.size(0), hid = x.size(1), width = (heads + 2 * kv_heads) * d;
  const int64_t inter = in_features(w_down, sc[3]);
  T* xp = ptr<T>(x);
  T* rp = ptr<T>(res);
  // the element-wise steps go row by row over the cores from kParallelRows rows on (below it, waking
  // the other threads four times a layer would cost more than the rows take)
  const int par = n >= kParallelRows ? threads : 1;
#pragma omp parallel for num_threads(par)
  for (int64_t t = 0; t < n; ++t) {
    T* xr = xp + t * hid;
    T* rr = rp + t * hid;
    if (first) {
      std::memcpy(rr, xr, hid * sizeof(T));
      norm_row(rr, ptr<T>(ln1), xr, hid, eps);
    } else {
      add_norm_row(xr, rr, ptr<T>(ln1), xr, hid, eps);
    }
  }
  // the step's intermediates, in one buffer kept from call to call: fresh vectors of this size
  // (~0.5 MB at 44 rows) came from mmap, zeroed page by page at every layer
  thread_local std::vector<T> scratch;
  const int64_t need = n * (width + heads * d + hid + 3 * inter);
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  T* const qkv = scratch.data();
  T* const attn = qkv + n * width;
  T* const o = attn + n * heads * d;
  T* const gate_up = o + n * hid;
  T* const act = gate_up + n * 2 * inter;
  product<T>(xp, w_qkv, sc[0], qkv, n, hid, width, threads);
  T* q = qkv;
  T* k = q + heads * d;
  const T* v = k + kv_heads * d;
#pragma omp parallel for num_threads(par)
  for (int64_t t = 0; t < n; ++t) {
    if (q_norm != nullptr) {
      for (int64_t h = 0; h < heads; ++h) norm_row(q + t * width + h * d, q_norm, q + t * width + h * d, d, eps);
      for (int64_t h = 0; h < kv_heads; ++h) norm_row(k + t * width + h * d, k_norm, k + t * width + h * d, d, eps);
    }
    rope_rows(q + t * width, width, heads, d, 1, pos + t, cs, d);
    rope_rows(k + t * width, width, kv_heads, d, 1, pos + t, cs, d);
  }
  T* kp = ptr<T>(k_pool);
  T* vp = ptr<T>(v_pool);
  const int64_t row = kv_heads * d;
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(kp + out_loc[t] * row, k + t * width, row * sizeof(T));
    std::memcpy(vp + out_loc[t] * row, v + t * width, row * sizeof(T));
  }
  attend(static_cast<const T*>(q), width, static_cast<const T*>(kp), static_cast<const T*>(vp), ptr<int64_t>(slots),
         slots.size(1), ptr<int32_t>(lens), attn, n, heads, kv_heads, d, scale, threads);
  product<T>(attn, w_o, sc[1], o, n, heads * d, hid, threads);
#pragma omp parallel for num_threads(par)
  for (int64_t t = 0; t < n; ++t) add_norm_row(o + t * hid, rp + t * hid, ptr<T>(ln2), xp + t * hid, hid, eps);
  product<T>(xp, w_gate_up, sc[2], gate_up, n, hid, 2 * inter, threads);
#pragma omp parallel for num_threads(par)
  for (int64_t t = 0; t < n; ++t) silu_rows(static_cast<const T*>(gate_up) + t * 2 * inter, act + t * inter, 1, inter);
  product<T>(act, w_down, sc[3], xp, n, inter, hid, threads);
}

// a dense weight [rows, cols] like x, or quantized blocks of one (s: their scales; quant_linear.cc checks)
void check_matrix(const TensorView& x, const TensorView& w, const TensorView& s, int64_t rows, int64_t cols,
                  const char* name) {
  if (s.numel() > 0) {
    int64_t n, k;
    quant_bits(w, s, n, k);
    TVM_FFI_ICHECK(n == rows && k == cols) << name << " must hold a [" << rows << ", " << cols << "] matrix";
    return;
  }
  check_same(x, w, name);
  TVM_FFI_ICHECK(w.ndim() == 2 && dense(w) && w.size(0) == rows && w.size(1) == cols)
      << name << " must be a contiguous [" << rows << ", " << cols << "] matrix";
}

}  // namespace

void decode_layer(TensorView x, TensorView residual, bool first, TensorView positions, TensorView cos_sin,
                  TensorView ln1, TensorView w_qkv, TensorView q_norm, TensorView k_norm, TensorView k_pool,
                  TensorView v_pool, TensorView out_loc, TensorView slots, TensorView lens, TensorView w_o,
                  TensorView ln2, TensorView w_gate_up, TensorView w_down, TensorView s_qkv, TensorView s_o,
                  TensorView s_gate_up, TensorView s_down, int64_t heads, int64_t kv_heads, double eps, double scale,
                  int64_t threads) {
  check_rows(x, "x");
  const int64_t n = x.size(0), hid = x.size(1), d = cos_sin.size(1);
  const int64_t inter = in_features(w_down, s_down);
  TVM_FFI_ICHECK(dense(residual) && residual.ndim() == 2 && residual.size(0) == n && residual.size(1) == hid)
      << "residual must be like x";
  TVM_FFI_ICHECK(cos_sin.ndim() == 2 && dense(cos_sin) && is_f32(cos_sin.dtype())) << "cos_sin: float32 table";
  TVM_FFI_ICHECK(heads % kv_heads == 0 && d % 2 == 0) << "bad heads / head_dim";
  for (const TensorView* w : {&ln1, &q_norm, &k_norm, &k_pool, &v_pool, &ln2, &residual})
    check_same(x, *w, "x and every weight, the pool and residual");
  check_matrix(x, w_qkv, s_qkv, (heads + 2 * kv_heads) * d, hid, "w_qkv");
  check_matrix(x, w_o, s_o, hid, heads * d, "w_o");
  check_matrix(x, w_gate_up, s_gate_up, 2 * inter, hid, "w_gate_up");
  check_matrix(x, w_down, s_down, hid, inter, "w_down");
  for (const TensorView* w : {&ln1, &ln2})
    TVM_FFI_ICHECK(w->ndim() == 1 && w->size(0) == hid && dense(*w)) << "norm weights must be [hidden]";
  const bool qk = q_norm.numel() > 0;
  if (qk)
    for (const TensorView* w : {&q_norm, &k_norm})
      TVM_FFI_ICHECK(w->ndim() == 1 && w->size(0) == d && dense(*w)) << "q/k norm weights must be [head_dim]";
  for (const TensorView* p : {&k_pool, &v_pool})
    TVM_FFI_ICHECK(p->ndim() == 3 && dense(*p) && p->size(1) == kv_heads && p->size(2) == d)
        << "the pool must be [slots, kv_heads, head_dim]";
  TVM_FFI_ICHECK(is_index(positions) && dense(positions) && positions.numel() == n) << "positions: [tokens] int";
  TVM_FFI_ICHECK(is_index(out_loc) && dense(out_loc) && out_loc.numel() == n) << "out_loc: [tokens] int";
  TVM_FFI_ICHECK(slots.dtype().code == kDLInt && slots.dtype().bits == 64 && slots.ndim() == 2 && dense(slots)
                 && slots.size(0) == n) << "slots: [requests, max_len] int64, one request per token";
  TVM_FFI_ICHECK(lens.dtype().code == kDLInt && lens.dtype().bits == 32 && dense(lens) && lens.numel() == n)
      << "lens: [requests] int32";
  std::vector<int64_t> pos(n), loc(n);  // read once, checked: an index past the table or the pool
  for (int64_t t = 0; t < n; ++t) {      // would touch other memory
    pos[t] = index_at(positions, t);
    loc[t] = index_at(out_loc, t);
    TVM_FFI_ICHECK(pos[t] >= 0 && pos[t] < cos_sin.size(0)) << "position " << pos[t] << " outside the rotary table";
    TVM_FFI_ICHECK(loc[t] >= 0 && loc[t] < k_pool.size(0)) << "slot " << loc[t] << " outside the pool";
    TVM_FFI_ICHECK(ptr<int32_t>(lens)[t] >= 1 && ptr<int32_t>(lens)[t] <= slots.size(1)) << "bad lens";
  }
  const int nt = static_cast<int>(std::max<int64_t>(1, threads));
  const float fe = static_cast<float>(eps), fs = static_cast<float>(scale);
  const TensorView sc[4] = {s_qkv, s_o, s_gate_up, s_down};
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const T* qn = qk ? ptr<T>(q_norm) : nullptr;
    const T* kn = qk ? ptr<T>(k_norm) : nullptr;
    layer<T>(x, residual, first, pos.data(), ptr<float>(cos_sin), d, ln1, w_qkv, qn, kn, k_pool, v_pool, loc.data(),
             slots, lens, w_o, ln2, w_gate_up, w_down, sc, heads, kv_heads, fe, fs, nt);
  };
  if (is_f32(x.dtype())) {
    go(float{});
  } else {
    go(uint16_t{});
  }
}
