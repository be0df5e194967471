// Small-batch float32 matmul for the cached decode path on x86-64 CPUs (AVX2 + FMA), as an
// XLA FFI custom call. Built and registered by cpu_kernels.py; see its docstring.
//
//   y[M, N] = x[M, K] @ w[K, N], with w packed once into panels p[NP, K, 16]
//   (NP = ceil(N / 16), p[j, k, c] = w[k, 16 j + c], zero beyond N).
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
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanel = 16;     // columns per panel: two 8-float AVX registers
constexpr int64_t kPrefetch = 1024;  // floats ahead of the current k (16 rows of one panel)
constexpr int64_t kChunk = 12;     // panels shared by all row groups while still in cache

inline void Prefetch(const float* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
}

// Copies `ncols` (<= width) leading columns of `rows` accumulated rows to y.
inline void Store(const float* buf, int64_t width, int64_t rows, float* y, int64_t ldy,
                  int64_t ncols) {
  for (int64_t r = 0; r < rows; ++r) std::copy(buf + r * width, buf + r * width + ncols, y + r * ldy);
}

// The tiles below are written out register by register: GCC keeps an array of __m256
// accumulators in memory (a store per fma), so a template over the tile size is 2x slower.

// 4 rows x 1 panel: 8 accumulators.
void Tile4x1(const float* x, int64_t K, const float* p, float* y, int64_t N, int64_t ncols) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
  __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  for (int64_t k = 0; k < K; ++k) {
    const float* pk = p + k * kPanel;
    Prefetch(pk);
    const __m256 w0 = _mm256_loadu_ps(pk), w1 = _mm256_loadu_ps(pk + 8);
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
void Tile3x1(const float* x, int64_t K, const float* p, float* y, int64_t N, int64_t ncols) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  for (int64_t k = 0; k < K; ++k) {
    const float* pk = p + k * kPanel;
    Prefetch(pk);
    const __m256 w0 = _mm256_loadu_ps(pk), w1 = _mm256_loadu_ps(pk + 8);
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
void Tile2x2(const float* x, int64_t K, const float* p, float* y, int64_t N, int64_t ncols) {
  const int64_t ps = K * kPanel;
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
  __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  for (int64_t k = 0; k < K; ++k) {
    const float* pk = p + k * kPanel;
    Prefetch(pk); Prefetch(pk + ps);
    const __m256 w0 = _mm256_loadu_ps(pk), w1 = _mm256_loadu_ps(pk + 8);
    const __m256 w2 = _mm256_loadu_ps(pk + ps), w3 = _mm256_loadu_ps(pk + ps + 8);
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
void Tile1x4(const float* x, int64_t K, const float* p, float* y, int64_t ncols) {
  const int64_t ps = K * kPanel;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    const float* pk = p + k * kPanel;
    Prefetch(pk); Prefetch(pk + ps); Prefetch(pk + 2 * ps); Prefetch(pk + 3 * ps);
    const __m256 b = _mm256_broadcast_ss(x + k);
    a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk), a0);
    a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + 8), a1);
    a2 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + ps), a2);
    a3 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + ps + 8), a3);
    a4 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + 2 * ps), a4);
    a5 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + 2 * ps + 8), a5);
    a6 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + 3 * ps), a6);
    a7 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + 3 * ps + 8), a7);
  }
  alignas(32) float buf[4 * kPanel];
  _mm256_store_ps(buf, a0); _mm256_store_ps(buf + 8, a1); _mm256_store_ps(buf + 16, a2);
  _mm256_store_ps(buf + 24, a3); _mm256_store_ps(buf + 32, a4); _mm256_store_ps(buf + 40, a5);
  _mm256_store_ps(buf + 48, a6); _mm256_store_ps(buf + 56, a7);
  Store(buf, 4 * kPanel, 1, y, 0, ncols);
}

// 1 row x 1 panel: the tail of Tile1x4's panel groups.
void Tile1x1(const float* x, int64_t K, const float* p, float* y, int64_t ncols) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (int64_t k = 0; k < K; ++k) {
    const float* pk = p + k * kPanel;
    const __m256 b = _mm256_broadcast_ss(x + k);
    a0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk), a0);
    a1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(pk + 8), a1);
  }
  alignas(32) float buf[kPanel];
  _mm256_store_ps(buf, a0); _mm256_store_ps(buf + 8, a1);
  Store(buf, kPanel, 1, y, 0, ncols);
}

// Columns of panels [p0, p1) (one chunk, still in cache for every row group) for all M rows:
// rows in groups of 4, then the remaining 3, 2 or 1 together.
void Panels(const float* x, const float* p, float* y, int64_t M, int64_t K, int64_t N,
            int64_t p0, int64_t p1) {
  const int64_t ps = K * kPanel;
  auto cols = [&](int64_t j, int64_t panels) { return std::min(panels * kPanel, N - j * kPanel); };
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    for (int64_t j = p0; j < p1; ++j)
      Tile4x1(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, 1));
  if (M - m == 3) {
    for (int64_t j = p0; j < p1; ++j)
      Tile3x1(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, 1));
    return;
  }
  if (M - m == 2) {
    int64_t j = p0;
    for (; j + 2 <= p1; j += 2) Tile2x2(x + m * K, K, p + j * ps, y + m * N + j * kPanel, N, cols(j, 2));
    for (; j < p1; ++j)
      for (int64_t r = m; r < M; ++r) Tile1x1(x + r * K, K, p + j * ps, y + r * N + j * kPanel, cols(j, 1));
    return;
  }
  for (; m < M; ++m) {
    int64_t j = p0;
    for (; j + 4 <= p1; j += 4) Tile1x4(x + m * K, K, p + j * ps, y + m * N + j * kPanel, cols(j, 4));
    for (; j < p1; ++j) Tile1x1(x + m * K, K, p + j * ps, y + m * N + j * kPanel, cols(j, 1));
  }
}

ffi::Error PanelMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> packed,
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
  // Chunks of panels are claimed from a shared counter by the calling thread and by tasks
  // on XLA's intra-op pool. The caller only waits for chunks another thread has claimed (and
  // so is running): a task that never gets a thread leaves its work to the caller, never a
  // deadlock. The job outlives the call in tasks that start late (they find nothing left).
  struct Job {
    const float* x; const float* p; float* y;
    int64_t M, K, N, num_panels, num_chunks;
    std::atomic<int64_t> next{0}, done{0};
    void Run() {
      for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < num_chunks;) {
        Panels(x, p, y, M, K, N, c * kChunk, std::min(num_panels, (c + 1) * kChunk));
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto job = std::make_shared<Job>();
  job->x = x.typed_data(); job->p = packed.typed_data(); job->y = y->typed_data();
  job->M = M; job->K = K; job->N = N; job->num_panels = num_panels;
  job->num_chunks = (num_panels + kChunk - 1) / kChunk;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), job->num_chunks) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([job] { job->Run(); });
  job->Run();
  while (job->done.load(std::memory_order_acquire) < job->num_chunks) _mm_pause();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelMatmul, PanelMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
