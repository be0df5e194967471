// What every source of the CPU kernels shares (algorithm/cpu/build.py compiles them all into one
// shared library): the includes, the panel width, prefetching, the store of a tile's
// accumulators, the sharing of a call's panels over XLA's intra-op pool, and the vectorised
// exp of the softmaxes. Internal linkage, as when the kernels were one file: each source gets
// its own copy, inlined as before.

#ifndef SPECDEC_T5X_ALGORITHM_CPU_KERNELS_COMMON_H_
#define SPECDEC_T5X_ALGORITHM_CPU_KERNELS_COMMON_H_

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

// Copies `ncols` (<= width) leading columns of `rows` accumulated rows to y.
inline void Store(const float* buf, int64_t width, int64_t rows, float* y, int64_t ldy,
                  int64_t ncols) {
  for (int64_t r = 0; r < rows; ++r) std::copy(buf + r * width, buf + r * width + ncols, y + r * ldy);
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

}  // namespace

#endif  // SPECDEC_T5X_ALGORITHM_CPU_KERNELS_COMMON_H_
