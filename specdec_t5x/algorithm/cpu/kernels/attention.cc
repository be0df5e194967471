// A decode call's cached attention, one query at a time, in float32 (CachedAttention) and with
// T5X's bfloat16 roundings (CachedAttentionBf16). Built and registered by
// algorithm/cpu/build.py; see algorithm/cpu/attention.py.

#include "common.h"

namespace {

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

}  // namespace

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
