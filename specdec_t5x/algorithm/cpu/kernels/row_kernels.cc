// The row kernels of the decode path on x86-64 CPUs: a one-pass argmax / nonfinite check per
// logits row (RowArgmax), the sampled decode's softmax per row on top of it (RowSoftmax) and
// an inverse-CDF draw per row (RowSample). Built and registered by algorithm/cpu/build.py;
// see algorithm/cpu/row_kernels.py.

#include "common.h"

namespace {

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

}  // namespace

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
