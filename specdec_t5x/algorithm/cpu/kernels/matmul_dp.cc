// The vdpbf16ps matmul (bfloat16 x bfloat16 -> float32 arithmetic) over pair panels. Built
// and registered by algorithm/cpu/build.py; see algorithm/cpu/bf16.py.

#include "common.h"

namespace {

// bfloat16 x bfloat16 -> float32 products for bfloat16 models (kernel mode 'packed_bf16',
// algorithm/cpu/bf16.py), with AVX-512 BF16's vdpbf16ps. Panels q[NP, K / 2, 32] hold, per pair of
// contraction rows, lane c's two weights side by side: q[j, i, 2 c + h] = w[2 i + h, 16 j + c];
// x [M, K] bfloat16 (K even) is read as 32-bit pairs (x[2 i] low, x[2 i + 1] high). One
// vdpbf16ps lane is two float32 FMAs, the odd element of the pair first, then the even one,
// with bfloat16 denormals read as zero and float32 denormal results flushed to zero
// (measured bitwise: shared/bench/vdpbf16ps_order.cc). Every output element is that chain
// over the pairs i = 0..K/2-1, in order, from zero, whatever M and whatever tile computes
// it: a row's result does not depend on the other rows in the call. Compiled for the
// instruction set by target attributes only (the library keeps -mavx2 -mfma), and run only
// where the CPU has it (kDpbf16; bf16.py checks /proc/cpuinfo before packing for it).
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPanelMatmulDp, PanelMatmulDp,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
