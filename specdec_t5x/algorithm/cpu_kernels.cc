// Small-batch float32 matmul for the cached decode path on x86-64 CPUs (AVX2 + FMA), as an
// XLA FFI custom call, a one-pass argmax / nonfinite check per logits row (RowArgmax), the
// sampled decode's softmax per row on top of it (RowSoftmax), an inverse-CDF draw per row
// (RowSample), and a decode call's cached attention, one query at a time (CachedAttention).
// Built and registered by cpu_kernels.py; see its docstring.
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

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 16;     // columns per panel: two 8-float AVX registers
constexpr int64_t kPrefetch = 1024;  // weights ahead of the current k (64 rows of one panel)
constexpr int64_t kChunk = 12;     // panels shared by all row groups while still in cache

template <class T>
inline void Prefetch(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
}

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

// Copies `ncols` (<= width) leading columns of `rows` accumulated rows to y.
inline void Store(const float* buf, int64_t width, int64_t rows, float* y, int64_t ldy,
                  int64_t ncols) {
  for (int64_t r = 0; r < rows; ++r) std::copy(buf + r * width, buf + r * width + ncols, y + r * ldy);
}

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

// Panels [0, num_panels) in chunks of kChunk, `chunk(p0, p1)` each: chunks are claimed from
// a shared counter by the calling thread and by tasks on XLA's intra-op pool. The caller only
// waits for chunks another thread has claimed (and so is running): a task that never gets a
// thread leaves its work to the caller, never a deadlock. The job outlives the call in tasks
// that start late (they find nothing left, so `chunk` is never called after the return).
template <class F>
void ShareChunks(ffi::ThreadPool& pool, int64_t num_panels, F chunk) {
  struct Job {
    F chunk;
    int64_t num_panels, num_chunks;
    std::atomic<int64_t> next{0}, done{0};
    Job(F f, int64_t n)
        : chunk(std::move(f)), num_panels(n), num_chunks((n + kChunk - 1) / kChunk) {}
    void Run() {
      for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < num_chunks;) {
        chunk(c * kChunk, std::min(num_panels, (c + 1) * kChunk));
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto job = std::make_shared<Job>(std::move(chunk), num_panels);
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), job->num_chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([job] { job->Run(); });
  job->Run();
  while (job->done.load(std::memory_order_acquire) < job->num_chunks) _mm_pause();
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

// Per row of x [..., V]: the index of its first maximum -- of its first NaN when it holds
// one, as jnp.argmax, which counts NaN as the largest -- and whether it holds a NaN or an
// infinity. One vectorised pass for the maximum and the flag (NaNs ignored by the maximum,
// seen by x * 0 being NaN), one that stops at the first lane equal to it.
void ArgmaxRow(const float* p, int64_t V, int32_t* out, bool* bad) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 top8 = _mm256_set1_ps(-INFINITY), odd8 = zero;
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 v = _mm256_loadu_ps(p + i);
    top8 = _mm256_max_ps(v, top8);  // a NaN in v leaves top8 as it was
    const __m256 z = _mm256_mul_ps(v, zero);  // NaN exactly where v is NaN or infinite
    odd8 = _mm256_or_ps(odd8, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, top8);
  float top = -INFINITY;
  for (float l : lanes) top = l > top ? l : top;
  bool odd = _mm256_movemask_ps(odd8) != 0;
  for (; i < V; ++i) {
    top = p[i] > top ? p[i] : top;
    odd |= !std::isfinite(p[i]);
  }
  int64_t at = -1;
  if (odd) {
    for (int64_t j = 0; j < V && at < 0; ++j) if (std::isnan(p[j])) at = j;
  }
  if (at < 0) {
    const __m256 t = _mm256_set1_ps(top);
    int64_t j = 0;
    for (; j + 8 <= V; j += 8) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + j), t, _CMP_EQ_OQ));
      if (mask) { at = j + __builtin_ctz(mask); break; }
    }
    for (; at < 0 && j < V; ++j) if (p[j] == top) at = j;
  }
  *out = static_cast<int32_t>(at);
  *bad = odd;
}

ffi::Error RowArgmax(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::S32> index,
                     ffi::ResultBuffer<ffi::PRED> nonfinite) {
  const auto dims = x.dimensions();
  if (dims.size() == 0 || dims.back() == 0 || dims.back() > INT32_MAX) {
    return ffi::Error::InvalidArgument("row_argmax needs rows of 1 .. 2^31 - 1 entries");
  }
  const int64_t V = dims.back(), rows = x.element_count() / V;
  for (int64_t r = 0; r < rows; ++r) {
    ArgmaxRow(x.typed_data() + r * V, V, index->typed_data() + r, nonfinite->typed_data() + r);
  }
  return ffi::Error::Success();
}

// exp(v) for v <= 0 (NaN-free), 8 lanes: v = n ln2 + r with n = round(v / ln2) (rounded
// by adding 1.5 * 2^23, which leaves n in the low mantissa bits), |r| <= ln2 / 2 (ln2 in
// two parts, so r is exact to float precision), exp(r) by its Taylor series to r^7
// (truncation below 1e-8 relative), times 2^n built in the exponent bits. Below -87.3
// (2^n would leave float's normal range) the result is 0, as are exp's denormals after a
// softmax's rounding to float.
inline __m256 ExpNonPositive(__m256 v) {
  const __m256 low = _mm256_set1_ps(-87.3f), magic = _mm256_set1_ps(12582912.0f);
  const __m256 underflow = _mm256_cmp_ps(v, low, _CMP_LT_OQ);
  v = _mm256_max_ps(v, low);
  const __m256 shifted = _mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 n = _mm256_sub_ps(shifted, magic);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v);  // ln2's high part: exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);       // ln2 - high part
  __m256 y = _mm256_set1_ps(1.0f / 5040.0f);
  for (float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) {
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
  }
  // shifted's bits are those of 1.5 * 2^23 plus n: add the exponent bias, shift into place.
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(127 - 0x4B400000)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(bits)));
}

// The sampled decode's distribution per logits row, and RowArgmax's nonfinite flag:
// s = x - x[argmax] (so s <= 0, and 0 at the maxima), v = s * (1 / temperature) where
// s < 0 and 0 elsewhere, a NaN s included (as the XLA form: a row holding a NaN, or only
// -inf, gives the uniform distribution; one holding +inf, the uniform over its +infs),
// probabilities exp(v) / sum exp(v). Two more vectorised passes after the argmax's.
ffi::Error RowSoftmax(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> inverse,
                      ffi::ResultBuffer<ffi::F32> probs, ffi::ResultBuffer<ffi::PRED> nonfinite) {
  const auto dims = x.dimensions();
  if (dims.size() == 0 || dims.back() == 0 || dims.back() > INT32_MAX) {
    return ffi::Error::InvalidArgument("row_softmax needs rows of 1 .. 2^31 - 1 entries");
  }
  if (inverse.element_count() != 1) {
    return ffi::Error::InvalidArgument("row_softmax needs one 1 / temperature");
  }
  // A run-time value of the program (sampling.SamplingConfig.values), checked on the host.
  const float inv_temperature = inverse.typed_data()[0];
  if (!(inv_temperature > 0.0f)) {  // +inf allowed: a temperature below float's range
    return ffi::Error::InvalidArgument("row_softmax needs 1 / temperature > 0");
  }
  const int64_t V = dims.back(), rows = x.element_count() / V;
  const float inv_t = inv_temperature;  // a product, not a division: <= 1 ulp apart
  const __m256 zero = _mm256_setzero_ps(), inv_t8 = _mm256_set1_ps(inv_t);
  // The sum: float lanes over 16 vectors at a time, those partial sums added in double
  // (float lanes over a whole row would drift by a few units in the last place, and every
  // probability with them).
  const auto add8 = [](__m256d* sum, __m256 y) {
    sum[0] = _mm256_add_pd(sum[0], _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
    sum[1] = _mm256_add_pd(sum[1], _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = x.typed_data() + r * V;
    float* e = probs->typed_data() + r * V;
    int32_t at;
    ArgmaxRow(p, V, &at, nonfinite->typed_data() + r);
    const __m256 top = _mm256_set1_ps(p[at]);
    __m256d sum4[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    while (i + 8 <= V) {
      __m256 part = zero;
      for (const int64_t end = std::min(V - 7, i + 128); i < end; i += 8) {
        const __m256 s = _mm256_sub_ps(_mm256_loadu_ps(p + i), top);
        const __m256 v = _mm256_and_ps(_mm256_cmp_ps(s, zero, _CMP_LT_OQ), _mm256_mul_ps(s, inv_t8));
        const __m256 y = ExpNonPositive(v);
        _mm256_storeu_ps(e + i, y);
        part = _mm256_add_ps(part, y);
      }
      add8(sum4, part);
    }
    if (i < V) {  // the ragged tail through the same lanes, padded with v = -inf (exp 0)
      alignas(32) float tail[8];
      for (int64_t k = 0; k < 8; ++k) {
        const float s = i + k < V ? p[i + k] - p[at] : -INFINITY;
        tail[k] = s < 0.0f ? s * inv_t : 0.0f;  // the padding: -inf * inv_t = -inf
      }
      _mm256_store_ps(tail, ExpNonPositive(_mm256_load_ps(tail)));
      for (int64_t k = 0; i + k < V; ++k) e[i + k] = tail[k];
      add8(sum4, _mm256_load_ps(tail));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(sum4[0], sum4[1]));
    const double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);  // >= 1: exp(0) = 1
    const float inv = static_cast<float>(1.0 / sum);
    const __m256 inv8 = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= V; i += 8) _mm256_storeu_ps(e + i, _mm256_mul_ps(_mm256_loadu_ps(e + i), inv8));
    for (; i < V; ++i) e[i] *= inv;
  }
  return ffi::Error::Success();
}

// Per row of probs [b, V] (>= 0, any total) and u [b] in (0, 1]: the first index whose
// cumulative mass reaches u * total, never an entry of probability 0 (where rounding leaves
// the cumulative sum a hair short, the last positive entry), 0 for a row without mass.
// Blocks of 64 entries: their sums in one vectorised pass, the block reaching the mass
// found among them, the entry by a running sum inside it.
ffi::Error RowSample(ffi::Buffer<ffi::F32> probs, ffi::Buffer<ffi::F32> u,
                     ffi::ResultBuffer<ffi::S32> index) {
  const auto dims = probs.dimensions();
  if (dims.size() != 2 || dims[1] == 0 || dims[1] > INT32_MAX || u.element_count() != dims[0]) {
    return ffi::Error::InvalidArgument("row_sample needs probs [b, 1 .. 2^31 - 1] and u [b]");
  }
  constexpr int64_t kBlock = 64;
  const int64_t V = dims[1], rows = dims[0], blocks = (V + kBlock - 1) / kBlock;
  std::unique_ptr<float[]> cum(new float[blocks]);
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = probs.typed_data() + r * V;
    float total = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
      float block = 0.0f;
      if (hi - lo == kBlock) {
        __m256 a = _mm256_loadu_ps(p + lo);
        for (int64_t k = lo + 8; k < hi; k += 8) a = _mm256_add_ps(a, _mm256_loadu_ps(p + k));
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, a);
        for (float l : lanes) block += l;
      } else {
        for (int64_t k = lo; k < hi; ++k) block += p[k];
      }
      total += block;
      cum[b] = total;
    }
    const float mass = u.typed_data()[r] * total;
    int64_t b = 0;
    while (b < blocks - 1 && cum[b] < mass) ++b;
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    float left = mass - (b > 0 ? cum[b - 1] : 0.0f), run = 0.0f;
    int64_t at = -1, last = lo;
    for (int64_t k = lo; k < hi; ++k) {
      if (p[k] > 0.0f) last = k;
      run += p[k];
      if (at < 0 && run >= left && p[k] > 0.0f) at = k;
    }
    index->typed_data()[r] = static_cast<int32_t>(at >= 0 ? at : last);
  }
  return ffi::Error::Success();
}

// float32 -> the nearest bfloat16 value (ties to even), kept as a float32; NaN stays NaN.
inline __m256 RoundBf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_and_si256(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)),
      _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  return _mm256_blendv_ps(_mm256_castsi256_ps(r), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline float RoundBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// The elements a cached attention reads: float32, or bfloat16 as its bits (uint16_t).
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline float Value(float x) { return x; }
inline float Value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Where a cached attention rounds to bfloat16: nowhere (float32 networks), the softmax's
// weights only (bfloat16 networks with float32 attention logits), or as T5X's bfloat16 ops
// round (scores, score + bias, each difference from the max, its exp, the sum of the exps,
// each weight).
enum class Rounding { kNone, kWeights, kBf16 };

// One query and head of a cached attention: q [D] (float32 values), keys k_t [D, S] (row
// stride S), values v [S, D], bias [S] -> o [D]; `buf` holds S + 8 floats. Each score is one
// chain of D fused multiply-adds in order (4 groups of 8 slots share a sweep over D, so the
// chains overlap in the pipeline without changing any of them); the softmax is max, exp of
// the differences, a sum in slot order and one division per weight (jax.nn.softmax); the
// context per element is one chain of S fused multiply-adds in slot order (64 elements kept
// in registers across the slots). A score row holding a NaN or an infinity gives NaN.
template <typename T>
void AttendQuery(const float* q, const T* kt, const T* v, const float* bias, int64_t D,
                 int64_t S, Rounding rounding, float* buf, float* o) {
  const bool bf16 = rounding == Rounding::kBf16;
  int64_t j = 0;
  for (; j + 32 <= S; j += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D; ++d) {
      const __m256 q8 = _mm256_set1_ps(q[d]);
      const T* row = kt + d * S + j;
      a0 = _mm256_fmadd_ps(q8, Load8(row), a0);
      a1 = _mm256_fmadd_ps(q8, Load8(row + 8), a1);
      a2 = _mm256_fmadd_ps(q8, Load8(row + 16), a2);
      a3 = _mm256_fmadd_ps(q8, Load8(row + 24), a3);
    }
    _mm256_storeu_ps(buf + j, a0);
    _mm256_storeu_ps(buf + j + 8, a1);
    _mm256_storeu_ps(buf + j + 16, a2);
    _mm256_storeu_ps(buf + j + 24, a3);
  }
  for (; j + 8 <= S; j += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      a = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), Load8(kt + d * S + j), a);
    }
    _mm256_storeu_ps(buf + j, a);
  }
  for (; j < S; ++j) {
    float a = 0.0f;
    for (int64_t d = 0; d < D; ++d) a = std::fma(q[d], Value(kt[d * S + j]), a);
    buf[j] = a;
  }
  float top = -INFINITY;
  bool odd = false;
  for (j = 0; j < S; ++j) {
    buf[j] = bf16 ? RoundBf16(RoundBf16(buf[j]) + bias[j]) : buf[j] + bias[j];
    odd |= !std::isfinite(buf[j]);
    top = std::max(top, buf[j]);
  }
  if (odd) {
    std::fill(o, o + D, std::nanf(""));
    return;
  }
  for (j = S; j < S + 8; ++j) buf[j] = -INFINITY;  // a tail lane's exp is 0
  const __m256 top8 = _mm256_set1_ps(top);
  for (j = 0; j < S; j += 8) {
    const __m256 diff = _mm256_sub_ps(_mm256_loadu_ps(buf + j), top8);
    _mm256_storeu_ps(buf + j, bf16 ? RoundBf16(ExpNonPositive(RoundBf16(diff)))
                                   : ExpNonPositive(diff));
  }
  float total = 0.0f;
  for (j = 0; j < S; ++j) total += buf[j];
  if (bf16) total = RoundBf16(total);
  for (j = 0; j < S; ++j) {
    buf[j] = rounding == Rounding::kNone ? buf[j] / total : RoundBf16(buf[j] / total);
  }
  int64_t d = 0;
  for (; d + 64 <= D; d += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (j = 0; j < S; ++j) {
      const __m256 w8 = _mm256_set1_ps(buf[j]);
      const T* vj = v + j * D + d;
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(w8, Load8(vj + 8 * u), acc[u]);
    }
    for (int u = 0; u < 8; ++u) _mm256_storeu_ps(o + d + 8 * u, acc[u]);
  }
  for (; d + 8 <= D; d += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (j = 0; j < S; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(buf[j]), Load8(v + j * D + d), acc);
    }
    _mm256_storeu_ps(o + d, acc);
  }
  for (; d < D; ++d) {
    float acc = 0.0f;
    for (j = 0; j < S; ++j) acc = std::fma(buf[j], Value(v[j * D + d]), acc);
    o[d] = acc;
  }
}

// Checks the shapes of a cached attention call: q [B, Q, H, D], the cache's keys k_t
// [B, H, D, S] (stored transposed), values v [B, H, S, D], an additive bias [1 or B, 1 or H,
// 1 or Q, S] (masks folded in).
template <typename Dims>
bool AttentionShapes(const Dims& qd, const Dims& kd, const Dims& vd, const Dims& bd) {
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || bd.size() != 4) return false;
  const int64_t B = qd[0], H = qd[2], D = qd[3], S = kd[3];
  return kd[0] == B && kd[1] == H && kd[2] == D && vd[0] == B && vd[1] == H && vd[2] == S &&
         vd[3] == D && (bd[0] == 1 || bd[0] == B) && (bd[1] == 1 || bd[1] == H) &&
         (bd[2] == 1 || bd[2] == qd[1]) && bd[3] == S && S > 0;
}

// A cached attention call, one query and head at a time (AttendQuery): q [B, Q, H, D]
// (float32 values in q_values), k_t, v, bias as AttentionShapes -> context [B, Q, H, D]
// float32. What XLA:CPU runs as ~6 small instructions per query and head group is one
// call, and a query's numbers never depend on the other queries of the call (a verify
// window's row is bitwise the one-token step's).
template <typename T, typename Dims>
void Attend(const float* q_values, const Dims& qd, const T* k_t, const T* v,
            const float* bias, const Dims& bd, int64_t S, Rounding rounding, float* out) {
  const int64_t B = qd[0], Q = qd[1], H = qd[2], D = qd[3];
  std::unique_ptr<float[]> buf(new float[S + 8]);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < Q; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        const float* bias_row = bias + (((bd[0] == 1 ? 0 : b) * bd[1] + (bd[1] == 1 ? 0 : h)) *
                                        bd[2] + (bd[2] == 1 ? 0 : i)) * S;
        const int64_t at = ((b * Q + i) * H + h) * D;
        AttendQuery(q_values + at, k_t + (b * H + h) * D * S, v + (b * H + h) * S * D, bias_row,
                    D, S, rounding, buf.get(), out + at);
      }
    }
  }
}

// The cached attention of a float32 network's decode call (AttendQuery, no rounding); it
// agrees with XLA's einsum / softmax / einsum to float32 rounding.
ffi::Error CachedAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k_t,
                           ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> bias,
                           ffi::ResultBuffer<ffi::F32> out) {
  if (!AttentionShapes(q.dimensions(), k_t.dimensions(), v.dimensions(), bias.dimensions())) {
    return ffi::Error::InvalidArgument(
        "cached_attention needs q [B, Q, H, D], k_t [B, H, D, S], v [B, H, S, D] and bias "
        "[1 or B, 1 or H, 1 or Q, S], S >= 1");
  }
  Attend(q.typed_data(), q.dimensions(), k_t.typed_data(), v.typed_data(), bias.typed_data(),
         bias.dimensions(), k_t.dimensions()[3], Rounding::kNone, out->typed_data());
  return ffi::Error::Success();
}

// The cached attention of a bfloat16 network (kernel mode 'packed_bf16') with T5X's
// bfloat16 casts: q, k_t, v bfloat16 (k_t and v may be a decode cache's uint16 bits of
// bfloat16), bias float32 holding bfloat16 values; rounded as T5X's bfloat16 ops round
// (Rounding::kBf16), or with `f32_logits` (T5X's float32_attention_logits) the weights only.
// The context is returned in float32: the caller rounds it to bfloat16, as XLA rounds its
// einsum.
ffi::Error CachedAttentionBf16(ffi::AnyBuffer q, ffi::AnyBuffer k_t, ffi::AnyBuffer v,
                               ffi::Buffer<ffi::F32> bias, ffi::ResultBuffer<ffi::F32> out,
                               bool f32_logits) {
  const auto half = [](const ffi::AnyBuffer& a) {
    return a.element_type() == ffi::BF16 || a.element_type() == ffi::U16;
  };
  if (!half(q) || !half(k_t) || !half(v) ||
      !AttentionShapes(q.dimensions(), k_t.dimensions(), v.dimensions(), bias.dimensions())) {
    return ffi::Error::InvalidArgument(
        "cached_attention_bf16 needs bfloat16 q [B, Q, H, D], k_t [B, H, D, S], v [B, H, S, D] "
        "and float32 bias [1 or B, 1 or H, 1 or Q, S], S >= 1");
  }
  const auto* qs = static_cast<const uint16_t*>(q.untyped_data());
  std::unique_ptr<float[]> q_values(new float[q.element_count()]);
  for (size_t n = 0; n < q.element_count(); ++n) q_values[n] = Value(qs[n]);
  Attend(q_values.get(), q.dimensions(), static_cast<const uint16_t*>(k_t.untyped_data()),
         static_cast<const uint16_t*>(v.untyped_data()), bias.typed_data(), bias.dimensions(),
         k_t.dimensions()[3], f32_logits ? Rounding::kWeights : Rounding::kBf16,
         out->typed_data());
  return ffi::Error::Success();
}

// bfloat16 x bfloat16 -> float32 products for bfloat16 models (kernel mode 'packed_bf16',
// cpu_bf16.py), with AVX-512 BF16's vdpbf16ps. Panels q[NP, K / 2, 32] hold, per pair of
// contraction rows, lane c's two weights side by side: q[j, i, 2 c + h] = w[2 i + h, 16 j + c];
// x [M, K] bfloat16 (K even) is read as 32-bit pairs (x[2 i] low, x[2 i + 1] high). One
// vdpbf16ps lane is two float32 FMAs, the odd element of the pair first, then the even one,
// with bfloat16 denormals read as zero and float32 denormal results flushed to zero
// (measured bitwise: shared/bench/vdpbf16ps_order.cc). Every output element is that chain
// over the pairs i = 0..K/2-1, in order, from zero, whatever M and whatever tile computes
// it: a row's result does not depend on the other rows in the call. Compiled for the
// instruction set by target attributes only (the library keeps -mavx2 -mfma), and run only
// where the CPU has it (kDpbf16; cpu_bf16.py checks /proc/cpuinfo before packing for it).
#define SPECDEC_DPBF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

const bool kDpbf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512bf16");

// R rows x P consecutive panels; x as K2 = K / 2 pairs per row.
template <int R, int P>
SPECDEC_DPBF16 void TileDp(const uint32_t* x, int64_t K2, const uint16_t* p, float* y, int64_t N,
                           int64_t ncols) {
  const int64_t ps = K2 * 2 * kPanel;
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < P; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < K2; ++i) {
    const uint16_t* pk = p + i * 2 * kPanel;
    __m512bh w[P];
#pragma GCC unroll 8
    for (int j = 0; j < P; ++j) {
      Prefetch(pk + j * ps);
      w[j] = (__m512bh)_mm512_loadu_si512(pk + j * ps);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * K2 + i]));
#pragma GCC unroll 8
      for (int j = 0; j < P; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], b, w[j]);
    }
  }
  alignas(64) float buf[R * P * kPanel];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < P; ++j) _mm512_store_ps(buf + (r * P + j) * kPanel, acc[r][j]);
  Store(buf, P * kPanel, R, y, N, ncols);
}

// Panels [p0, p1) of rows [m, m + R) with TileDp<R, P>, the rest with TileDp<R, P / 2>, ...
// (a chunk's 12 panels for one row: 8 + 4, not 8 + 4 tiles waiting on one chain each).
template <int R, int P>
void RowsDp(const uint32_t* x, const uint16_t* p, float* y, int64_t K2, int64_t N, int64_t m,
            int64_t p0, int64_t p1) {
  const int64_t ps = K2 * 2 * kPanel;
  auto cols = [&](int64_t j, int64_t panels) { return std::min(panels * kPanel, N - j * kPanel); };
  int64_t j = p0;
  for (; j + P <= p1; j += P)
    TileDp<R, P>(x + m * K2, K2, p + j * ps, y + m * N + j * kPanel, N, cols(j, P));
  if constexpr (P > 1) {
    if (j < p1) RowsDp<R, P / 2>(x, p, y, K2, N, m, j, p1);
  }
}

// All M rows of panels [p0, p1): groups of 8, then the last 1..8 rows in one tile (at least
// 8 accumulators each, so no tile waits on one chain).
void PanelsDp(const uint32_t* x, const uint16_t* p, float* y, int64_t M, int64_t K2, int64_t N,
              int64_t p0, int64_t p1) {
  int64_t m = 0;
  for (; M - m > 8; m += 8) RowsDp<8, 2>(x, p, y, K2, N, m, p0, p1);
  switch (M - m) {
    case 8: RowsDp<8, 2>(x, p, y, K2, N, m, p0, p1); break;
    case 7: RowsDp<7, 2>(x, p, y, K2, N, m, p0, p1); break;
    case 6: RowsDp<6, 2>(x, p, y, K2, N, m, p0, p1); break;
    case 5: RowsDp<5, 2>(x, p, y, K2, N, m, p0, p1); break;
    case 4: RowsDp<4, 2>(x, p, y, K2, N, m, p0, p1); break;
    case 3: RowsDp<3, 4>(x, p, y, K2, N, m, p0, p1); break;
    case 2: RowsDp<2, 4>(x, p, y, K2, N, m, p0, p1); break;
    default: RowsDp<1, 8>(x, p, y, K2, N, m, p0, p1); break;
  }
}

ffi::Error PanelMatmulDp(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x,
                         ffi::Buffer<ffi::BF16> packed, ffi::ResultBuffer<ffi::F32> y) {
  if (!kDpbf16) return ffi::Error::Internal("this CPU lacks AVX-512 BF16 (vdpbf16ps)");
  const auto dims = packed.dimensions();
  if (dims.size() != 3 || dims[2] != 2 * kPanel) {
    return ffi::Error::InvalidArgument("pair panels must have shape [panels, K / 2, 32]");
  }
  const int64_t num_panels = dims[0], K2 = dims[1];
  if (K2 == 0 || x.element_count() % (2 * K2) != 0) {
    return ffi::Error::InvalidArgument("x's last dimension must equal the packed K");
  }
  const int64_t M = x.element_count() / (2 * K2);
  if (M == 0) return ffi::Error::Success();
  const int64_t N = y->element_count() / M;
  if (N > num_panels * kPanel || N <= (num_panels - 1) * kPanel) {
    return ffi::Error::InvalidArgument("output width does not match the packed panels");
  }
  const auto* xs = reinterpret_cast<const uint32_t*>(x.untyped_data());
  const auto* ps = reinterpret_cast<const uint16_t*>(packed.untyped_data());
  float* ys = y->typed_data();
  ShareChunks(pool, num_panels, [=](int64_t p0, int64_t p1) {
    PanelsDp(xs, ps, ys, M, K2, N, p0, p1);
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecRowArgmax, RowArgmax,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::PRED>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecRowSoftmax, RowSoftmax,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::PRED>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecRowSample, RowSample,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecCachedAttention, CachedAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecCachedAttentionBf16, CachedAttentionBf16,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("f32_logits"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelMatmulDp, PanelMatmulDp,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
