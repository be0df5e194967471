"""A decode call's cached attention on x86-64 CPUs (kernels/attention.cc), one query at a
time, in one call instead of XLA:CPU's ~6 small instructions per query
(layers.Attention.attend_cached): in float32 (`cached_attention`) and, for bfloat16
networks in kernel mode 'packed_bf16', with T5X's bfloat16 roundings
(`cached_attention_bf16`, modes.pair_attention)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.cpu import build


def cached_attention(q: jax.Array, k_t: jax.Array, v: jax.Array, bias: jax.Array) -> jax.Array:
  """The softmax attention of a cached decode call, one query at a time
  (kernels/attention.cc CachedAttention): q [B, Q, H, D], k_t [B, H, D, S], v [B, H, S, D],
  bias [1 or B, 1 or H, 1 or Q, S] (masks folded in) -> context [B, Q, H, D] float32. Each
  query's context is computed alone, so it is bitwise the same in a call of one query or of
  many; it agrees with XLA's einsum / softmax / einsum to float32 rounding. A score row
  holding a NaN or an infinity gives a NaN context."""
  build.require('The CPU row kernels')
  bias = jnp.asarray(bias, jnp.float32)
  if bias.ndim != 4:
    raise ValueError(f'cached_attention: bias must be 4-d [B, H, Q, S], got {bias.shape}.')
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jax.ffi.ffi_call(build.CACHED_ATTENTION, out, vmap_method='sequential')(
      q.astype(jnp.float32), k_t.astype(jnp.float32), v.astype(jnp.float32), bias)


def cached_attention_bf16(q: jax.Array, k_t: jax.Array, v: jax.Array, bias: jax.Array,
                          float32_logits: bool = False) -> jax.Array:
  """`cached_attention` for bfloat16 networks, with T5X's bfloat16 casts
  (kernels/attention.cc CachedAttentionBf16): q bfloat16, k_t / v bfloat16 or a decode
  cache's uint16 bits of bfloat16 (rows.storage_dtype), bias rounded to bfloat16 here ->
  context [B, Q, H, D] float32 (round it to bfloat16). Scores, softmax and weights rounded
  to bfloat16 where T5X's bfloat16 ops round them (`float32_logits`: the weights only); a
  query's context is bitwise the same in a call of one query or of many."""
  build.require('The CPU row kernels')
  bias = jnp.asarray(bias)
  if bias.ndim != 4:
    raise ValueError(f'cached_attention_bf16: bias must be 4-d [B, H, Q, S], got '
                     f'{bias.shape}.')
  if not float32_logits:
    bias = bias.astype(jnp.bfloat16)
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jax.ffi.ffi_call(build.CACHED_ATTENTION_BF16, out, vmap_method='sequential')(
      q.astype(jnp.bfloat16), k_t, v, bias.astype(jnp.float32), f32_logits=bool(float32_logits))
