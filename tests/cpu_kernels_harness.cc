// A standalone driver of the CPU kernels' cores (minisgl/kernels/csrc/*.h), without TVM FFI or torch,
// so that they can run where Python cannot: an aarch64 build of it runs under qemu-user in CI
// (tests/test_cpu_isa.py), and natively for each x86 level. It reads cases from a file the host wrote,
// runs each kernel on them and writes every output, in order, to another file; the host compares them
// with the same kernels' outputs through TVM FFI and with torch.
//
//   cpu_kernels_harness IN OUT      prints the level it was built for ("portable" on aarch64)
//
// A case: int64 op, int64 dtype (0 float32, 1 bfloat16), the op's int64 sizes, one float64 (eps or scale,
// 0 where unused), then its input arrays, raw, in the order below. Outputs: the arrays named after "->".
//   1 linear     M K N threads          x[M,K] w[N,K]                        -> out[M,N]
//   2 rmsnorm    n d                    x[n,d] w[d]                          -> out[n,d]
//   3 add_norm   n d                    x[n,d] res[n,d] w[d]                 -> x[n,d] res[n,d]
//   4 silu       n h                    x[n,2h]                              -> out[n,h]
//   5 rope       n heads d positions    pos[n] int64, x[n,heads*d], cs[positions,d] float32 -> x
//   6 attend     B H Hkv D S Lmax thr   q[B,H,D] k[S,Hkv,D] v[S,Hkv,D] slots[B,Lmax] int64 lens[B] int32
//                                                                            -> out[B,H,D]
//   7 qlinear    bits M K N threads     x[M,K] qs (int8 [N,K] / uint8 [N,K/2]) scales fp16 (1 / 2 per 32)
//                                                                            -> out[M,N]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu_fused.h"
#include "paged_decode.h"
#include "quant_linear.h"
#include "small_linear.h"

namespace {

using namespace minisgl;

FILE* in;
FILE* out;

int64_t next() {
  int64_t v;
  if (std::fread(&v, sizeof v, 1, in) != 1) {
    std::fprintf(stderr, "truncated input\n");
    std::exit(2);
  }
  return v;
}

template <typename T>
std::vector<T> array(int64_t n) {
  std::vector<T> a(n);
  if (n > 0 && std::fread(a.data(), sizeof(T), n, in) != static_cast<size_t>(n)) {
    std::fprintf(stderr, "truncated array\n");
    std::exit(2);
  }
  return a;
}

template <typename T>
void emit(const std::vector<T>& a) {
  std::fwrite(a.data(), sizeof(T), a.size(), out);
}

template <typename T>
void run(int64_t op, const std::vector<int64_t>& z, double param) {
  const float f = static_cast<float>(param);
  switch (op) {
    case 1: {
      const int64_t M = z[0], K = z[1], N = z[2];
      auto x = array<T>(M * K), w = array<T>(N * K);
      std::vector<T> o(M * N);
      linear<T>(x.data(), w.data(), o.data(), M, K, N, static_cast<int>(z[3]));
      emit(o);
      break;
    }
    case 2: {
      const int64_t n = z[0], d = z[1];
      auto x = array<T>(n * d), w = array<T>(d);
      std::vector<T> o(n * d);
      rmsnorm_rows(x.data(), w.data(), o.data(), n, d, f);
      emit(o);
      break;
    }
    case 3: {
      const int64_t n = z[0], d = z[1];
      auto x = array<T>(n * d), res = array<T>(n * d), w = array<T>(d);
      add_rmsnorm_rows(x.data(), res.data(), w.data(), n, d, f);
      emit(x);
      emit(res);
      break;
    }
    case 4: {
      const int64_t n = z[0], h = z[1];
      auto x = array<T>(n * 2 * h);
      std::vector<T> o(n * h);
      silu_rows(x.data(), o.data(), n, h);
      emit(o);
      break;
    }
    case 5: {
      const int64_t n = z[0], heads = z[1], d = z[2], positions = z[3];
      auto pos = array<int64_t>(n);
      auto x = array<T>(n * heads * d);
      auto cs = array<float>(positions * d);
      rope_rows(x.data(), heads * d, heads, d, n, pos.data(), cs.data(), d);
      emit(x);
      break;
    }
    case 6: {
      const int64_t B = z[0], H = z[1], Hkv = z[2], D = z[3], S = z[4], Lmax = z[5];
      auto q = array<T>(B * H * D), k = array<T>(S * Hkv * D), v = array<T>(S * Hkv * D);
      auto slots = array<int64_t>(B * Lmax);
      auto lens = array<int32_t>(B);
      std::vector<T> o(B * H * D);
      attend<T>(q.data(), H * D, k.data(), v.data(), slots.data(), Lmax, lens.data(), o.data(), B, H, Hkv, D, f,
                static_cast<int>(z[6]));
      emit(o);
      break;
    }
    case 7: {
      const int64_t M = z[1], K = z[2], N = z[3];
      const bool q8 = z[0] == 8;
      auto x = array<T>(M * K);
      auto qs = array<uint8_t>(q8 ? N * K : N * K / 2);
      auto sc = array<uint16_t>(N * K / 32 * (q8 ? 1 : 2));
      std::vector<T> o(M * N);
      (q8 ? qlinear<8, T> : qlinear<4, T>)(x.data(), qs.data(), sc.data(), o.data(), M, K, N, static_cast<int>(z[4]));
      emit(o);
      break;
    }
    default:
      std::fprintf(stderr, "unknown op %lld\n", static_cast<long long>(op));
      std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
    return 2;
  }
  in = std::fopen(argv[1], "rb");
  out = std::fopen(argv[2], "wb");
  if (in == nullptr || out == nullptr) {
    std::perror("open");
    return 2;
  }
  static const int kSizes[] = {0, 4, 2, 2, 2, 4, 7, 5};  // int64 sizes of each op
  int64_t op;
  while (std::fread(&op, sizeof op, 1, in) == 1) {
    if (op < 1 || op > 7) {
      std::fprintf(stderr, "unknown op %lld\n", static_cast<long long>(op));
      return 2;
    }
    const int64_t dtype = next();
    std::vector<int64_t> z(kSizes[op]);
    for (auto& v : z) v = next();
    double param;
    if (std::fread(&param, sizeof param, 1, in) != 1) return 2;
    if (dtype == 0) {
      run<float>(op, z, param);
    } else {
      run<uint16_t>(op, z, param);
    }
  }
  std::fclose(out);
  std::printf("%s\n", kIsa);
  return 0;
}
