// Small-batch matmul with float32 arithmetic for the cached decode path on x86-64 CPUs
// (AVX2 + FMA), as an XLA FFI custom call. Built and registered by algorithm/cpu/build.py;
// see algorithm/cpu/f32.py.
//
//   y[M, N] = x[M, K] @ w[K, N], with w packed once into panels p[NP, K, 16]
//   (NP = ceil(N / 16), p[j, k, c] = w[k, 16 j + c], zero beyond N).
//
// Two weight formats, one set of tiles: float32 panels, and bfloat16 panels for weights
// that bfloat16 holds exactly (a model restored from a bfloat16 checkpoint), with
// p[j, k, 2 i + h] = w[k, 16 j + 8 h + i]: one 32-byte load holds both halves of a row of
// the panel, each 32-bit lane i the bfloat16 bits of columns i (low) and 8 + i (high), and
// a shift / a mask turn them into the very float32 values (bfloat16 is float32's top half).
// The products are then bitwise those of the float32 panels, for half the bytes read: at
// decode time the weights' bytes, not the multiply-adds, bound a call.
//
// Why: at decode time M is the batch times 1..gamma+1 positions, and XLA:CPU's GEMM packs
// the weights on every call; with pre-packed panels every weight is read once, in order,
// and reused by all M rows from registers. Exactness: every output element is one chain of
// fused multiply-adds over k = 0..K-1, in order, from 0 -- whatever M and whatever tile
// computes it -- so a row's result does not depend on the other rows in the call (a 1-row
// call and a (gamma+1)-row call give bitwise the same numbers for the same row).

#include "common.h"

namespace {

// A panel row's 16 weights as two float32 registers (columns 0-7, 8-15), per format.
struct F32Panels {
  using T = float;
  static inline void Load(const float* pk, __m256* lo, __m256* hi) {
    *lo = _mm256_loadu_ps(pk);
    *hi = _mm256_loadu_ps(pk + 8);
  }
};

struct Bf16Panels {
  using T = uint16_t;
  static inline void Load(const uint16_t* pk, __m256* lo, __m256* hi) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pk));
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536)));
  }
};

// The tiles below are written out register by register: GCC keeps an array of __m256
// accumulators in memory (a store per fma), so a template over the tile size is 2x slower.
// They are templates over the weight format W only (W::Load inlines).

// 4 rows x 1 panel: 8 accumulators.
template <class W>
void Tile4x1(const float* x, int64_t K, const typename W::T* p, float* y, int64_t N,
             int64_t ncols) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
  __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  for (int64_t k = 0; k < K; ++k) {
    const typename W::T* pk = p + k * kPanel;
    Prefetch(pk);
    __m256 w0, w1;
    W::Load(pk, &w0, &w1);
    __m256 b = _mm256_broadcast_ss(x + k);
    a00 = _mm256_fmadd_ps(b, w0, a00); a01 = _mm256_fmadd_ps(b, w1, a01);
    b = _mm256_broadcast_ss(x + K + k);
    a10 = _mm256_fmadd_ps(b, w0, a10); a11 = _mm256_fmadd_ps(b, w1, a11);
    b = _mm256_broadcast_ss(x + 2 * K + k);
    a20 = _mm256_fmadd_ps(b, w0, a20); a21 = _mm256_fmadd_ps(b, w1, a21);
    b = _mm256_broadcast_ss(x + 3 * K + k);
    a30 = _mm256_fmadd_ps(b, w0, a30); a31 = _mm256_fmadd_ps(b, w1, a31);
  }
  alignas(32) float buf[4 * kPanel];
  _mm256_store_ps(buf, a00); _mm256_store_ps(buf + 8, a01);
  _mm256_store_ps(buf + 16, a10); _mm256_store_ps(buf + 24, a11);
  _mm256_store_ps(buf + 32, a20); _mm256_store_ps(buf + 40, a21);
  _mm256_store_ps(buf + 48, a30); _mm256_store_ps(buf + 56, a31);
  Store(buf, kPanel, 4, y, N, ncols);
}

// 3 rows x 1 panel: 6 accumulators.
template <class W>
void Tile3x1(const float* x, int64_t K, const typename W::T* p, float* y, int64_t N,
             int64_t ncols) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  for (int64_t k = 0; k < K; ++k) {
    const typename W::T* pk = p + k * kPanel;
    Prefetch(pk);
    __m256 w0, w1;
    W::Load(pk, &w0, &w1);
    __m256 b = _mm256_broadcast_ss(x + k);
    a00 = _mm256_fmadd_ps(b, w0, a00); a01 = _mm256_fmadd_ps(b, w1, a01);
    b = _mm256_broadcast_ss(x + K + k);
    a10 = _mm256_fmadd_ps(b, w0, a10); a11 = _mm256_fmadd_ps(b, w1, a11);
    b = _mm256_broadcast_ss(x + 2 * K + k);
    a20 = _mm256_fmadd_ps(b, w0, a20); a21 = _mm256_fmadd_ps(b, w1, a21);
  }
  alignas(32) float buf[3 * kPanel];
  _mm256_store_ps(buf, a00); _mm256_store_ps(buf + 8, a01);
  _mm256_store_ps(buf + 16, a10); _mm256_store_ps(buf + 24, a11);
  _mm256_store_ps(buf + 32, a20); _mm256_store_ps(buf + 40, a21);
  Store(buf, kPanel, 3, y, N, ncols);
}

// 2 rows x 2 consecutive panels: 8 accumulators.
template <class W>
void Tile2x2(const float* x, int64_t K, const typename W::T* p, float* y, int64_t N,
             int64_t ncols) {
  const int64_t ps = K * kPanel;
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
  __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  for (int64_t k = 0; k < K; ++k) {
    const typename W::T* pk = p + k * kPanel;
    Prefetch(pk); Prefetch(pk + ps);
    __m256 w0, w1, w2, w3;
    W::Load(pk, &w0, &w1);
    W::Load(pk + ps, &w2, &w3);
    __m256 b = _mm256_broadcast_ss(x + k);
    a00 = _mm256_fmadd_ps(b, w0, a00); a01 = _mm256_fmadd_ps(b, w1, a01);
    a02 = _mm256_fmadd_ps(b, w2, a02); a03 = _mm256_fmadd_ps(b, w3, a03);
    b = _mm256_broadcast_ss(x + K + k);
    a10 = _mm256_fmadd_ps(b, w0, a10); a11 = _mm256_fmadd_ps(b, w1, a11);
    a12 = _mm256_fmadd_ps(b, w2, a12); a13 = _mm256_fmadd_ps(b, w3, a13);
  }
  alignas(32) float buf[4 * kPanel];
  _mm256_store_ps(buf, a00); _mm256_store_ps(buf + 8, a01);
  _mm256_store_ps(buf + 16, a02); _mm256_store_ps(buf + 24, a03);
  _mm256_store_ps(buf + 32, a10); _mm256_store_ps(buf + 40, a11);
  _mm256_store_ps(buf + 48, a12); _mm256_store_ps(buf + 56, a13);
  Store(buf, 2 * kPanel, 2, y, N, ncols);
}

// 1 row x 4 consecutive panels: 8 accumulators (one row alone would wait on one chain).
template <class W>
void Tile1x4(const float* x, int64_t K, const typename W::T* p, float* y, int64_t ncols) {
  const int64_t ps = K * kPanel;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    const typename W::T* pk = p + k * kPanel;
    Prefetch(pk); Prefetch(pk + ps); Prefetch(pk + 2 * ps); Prefetch(pk + 3 * ps);
    const __m256 b = _mm256_broadcast_ss(x + k);
    __m256 w0, w1;
    W::Load(pk, &w0, &w1);
    a0 = _mm256_fmadd_ps(b, w0, a0); a1 = _mm256_fmadd_ps(b, w1, a1);
    W::Load(pk + ps, &w0, &w1);
    a2 = _mm256_fmadd_ps(b, w0, a2); a3 = _mm256_fmadd_ps(b, w1, a3);
    W::Load(pk + 2 * ps, &w0, &w1);
    a4 = _mm256_fmadd_ps(b, w0, a4); a5 = _mm256_fmadd_ps(b, w1, a5);
    W::Load(pk + 3 * ps, &w0, &w1);
    a6 = _mm256_fmadd_ps(b, w0, a6); a7 = _mm256_fmadd_ps(b, w1, a7);
  }
  alignas(32) float buf[4 * kPanel];
  _mm256_store_ps(buf, a0); _mm256_store_ps(buf + 8, a1); _mm256_store_ps(buf + 16, a2);
  _mm256_store_ps(buf + 24, a3); _mm256_store_ps(buf + 32, a4); _mm256_store_ps(buf + 40, a5);
  _mm256_store_ps(buf + 48, a6); _mm256_store_ps(buf + 56, a7);
  Store(buf, 4 * kPanel, 1, y, 0, ncols);
}

// 1 row x 1 panel: the tail of Tile1x4's panel groups.
template <class W>
void Tile1x1(const float* x, int64_t K, const typename W::T* p, float* y, int64_t ncols) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b = _mm256_broadcast_ss(x + k);
    __m256 w0, w1;
    W::Load(p + k * kPanel, &w0, &w1);
    a0 = _mm256_fmadd_ps(b, w0, a0);
    a1 = _mm256_fmadd_ps(b, w1, a1);
  }
  alignas(32) float buf[kPanel];
  _mm256_store_ps(buf, a0); _mm256_store_ps(buf + 8, a1);
  Store(buf, kPanel, 1, y, 0, ncols);
}

// AVX-512 tiles for bfloat16 panels and calls of 2 rows or more, where the CPU has
// AVX-512F/BW (a multi-row call is bound by the multiply-adds, not the bytes): one 16-float
// register per panel row. The interleaved layout widens to lanes in the column order
// (0, 8, 1, 9, ..., 7, 15); accumulators keep that order until the store puts them back.
// Each column is still one in-order chain of fused multiply-adds from zero.
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw")))

SPECDEC_AVX512 inline __m512 Widen(const uint16_t* pk) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pk));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// R rows x P consecutive panels. A template over the tile size, unlike the AVX2 tiles: with
// these 32 registers GCC keeps the accumulator array in them (checked in the disassembly).
template <int R, int P>
SPECDEC_AVX512 void Tile512(const float* x, int64_t K, const uint16_t* p, float* y, int64_t N,
                            int64_t ncols) {
  const int64_t ps = K * kPanel;
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < P; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const uint16_t* pk = p + k * kPanel;
    __m512 w[P];
#pragma GCC unroll 8
    for (int j = 0; j < P; ++j) {
      Prefetch(pk + j * ps);
      w[j] = Widen(pk + j * ps);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(x[r * K + k]);
#pragma GCC unroll 8
      for (int j = 0; j < P; ++j) acc[r][j] = _mm512_fmadd_ps(b, w[j], acc[r][j]);
    }
  }
  const __m512i order = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  alignas(64) float buf[R * P * kPanel];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < P; ++j)
      _mm512_store_ps(buf + (r * P + j) * kPanel, _mm512_permutexvar_ps(order, acc[r][j]));
  Store(buf, P * kPanel, R, y, N, ncols);
}

// Read once, when the library loads; SPECDEC_CPU_KERNELS_AVX512=0 keeps the AVX2 tiles (the
// tests run both paths on one machine).
const bool kAvx512 = [] {
  const char* flag = std::getenv("SPECDEC_CPU_KERNELS_AVX512");
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         !(flag && std::string(flag) == "0");
}();

// Panels [p0, p1) of rows [m, m + R) with Tile512<R, P>, the last odd ones with Tile512<R, 1>.
template <int R, int P>
void Rows512(const float* x, const uint16_t* p, float* y, int64_t K, int64_t N, int64_t m,
             int64_t p0, int64_t p1) {
  const int64_t ps = K * kPanel;
  auto cols = [&](int64_t j, int64_t panels) { return std::min(panels * kPanel, N - j * kPanel); };
  int64_t j = p0;
  for (; j + P <= p1; j += P)
    Tile512<R, P>(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, P));
  for (; j < p1; ++j)
    Tile512<R, 1>(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, 1));
}

// Columns of panels [p0, p1) (one chunk, still in cache for every row group) for all M rows:
// rows in groups of 4 (AVX-512: of 8, the last 2..8 rows in one tile, so a (gamma + 1)-row
// verify call of up to 8 rows reads each weight once), then the remaining 3, 2 or 1 together.
template <class W>
void Panels(const float* x, const typename W::T* p, float* y, int64_t M, int64_t K, int64_t N,
            int64_t p0, int64_t p1) {
  const int64_t ps = K * kPanel;
  auto cols = [&](int64_t j, int64_t panels) { return std::min(panels * kPanel, N - j * kPanel); };
  int64_t m = 0;
  if constexpr (std::is_same_v<W, Bf16Panels>) {
    if (kAvx512 && M >= 2) {
      for (; M - m > 8; m += 8) Rows512<8, 2>(x, p, y, K, N, m, p0, p1);
      switch (M - m) {
        case 8: Rows512<8, 2>(x, p, y, K, N, m, p0, p1); return;
        case 7: Rows512<7, 2>(x, p, y, K, N, m, p0, p1); return;
        case 6: Rows512<6, 2>(x, p, y, K, N, m, p0, p1); return;
        case 5: Rows512<5, 2>(x, p, y, K, N, m, p0, p1); return;
        case 4: Rows512<4, 2>(x, p, y, K, N, m, p0, p1); return;
        case 3: Rows512<3, 2>(x, p, y, K, N, m, p0, p1); return;
        case 2: Rows512<2, 4>(x, p, y, K, N, m, p0, p1); return;
        default: break;  // 1 row left (M = 9, 17, ...): the one-row tiles below
      }
    }
  }
  for (; m + 4 <= M; m += 4)
    for (int64_t j = p0; j < p1; ++j)
      Tile4x1<W>(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, 1));
  if (M - m == 3) {
    for (int64_t j = p0; j < p1; ++j)
      Tile3x1<W>(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, 1));
    return;
  }
  if (M - m == 2) {
    int64_t j = p0;
    for (; j + 2 <= p1; j += 2) Tile2x2<W>(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, 2));
    for (; j < p1; ++j)
      for (int64_t r = m; r < M; ++r) Tile1x1<W>(x + r * K, K, p + j * ps, y + r * N + j * kPanel, cols(j, 1));
    return;
  }
  for (; m < M; ++m) {
    int64_t j = p0;
    for (; j + 4 <= p1; j += 4) Tile1x4<W>(x + m * K, K, p + j * ps, y + m * N + j * kPanel, cols(j, 4));
    for (; j < p1; ++j) Tile1x1<W>(x + m * K, K, p + j * ps, y + m * N + j * kPanel, cols(j, 1));
  }
}

template <class W, ffi::DataType kPacked>
ffi::Error PanelMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<kPacked> packed,
                       ffi::ResultBuffer<ffi::F32> y) {
  const auto dims = packed.dimensions();
  if (dims.size() != 3 || dims[2] != kPanel) {
    return ffi::Error::InvalidArgument("packed weights must have shape [panels, K, 16]");
  }
  const int64_t num_panels = dims[0], K = dims[1];
  if (K == 0 || x.element_count() % K != 0) {
    return ffi::Error::InvalidArgument("x's last dimension must equal the packed K");
  }
  const int64_t M = x.element_count() / K;
  if (M == 0) return ffi::Error::Success();
  const int64_t N = y->element_count() / M;
  if (N > num_panels * kPanel || N <= (num_panels - 1) * kPanel) {
    return ffi::Error::InvalidArgument("output width does not match the packed panels");
  }
  const float* xs = x.typed_data();
  const typename W::T* ps = packed.typed_data();
  float* ys = y->typed_data();
  ShareChunks(pool, num_panels, [=](int64_t p0, int64_t p1) {
    Panels<W>(xs, ps, ys, M, K, N, p0, p1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelMatmul, (PanelMatmul<F32Panels, ffi::F32>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelMatmulBf16, (PanelMatmul<Bf16Panels, ffi::BF16>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
