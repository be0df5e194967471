"""bfloat16 x bfloat16 -> float32 products for bfloat16 models on x86-64 CPUs (AVX-512 BF16).

T5X runs its models with dtype='bfloat16': bfloat16 activations and weights, float32
accumulation (a TPU's MXU), each dot's result rounded to bfloat16. In kernel mode
'packed_bf16' (cpu_kernels.MODES), a network.Transformer whose T5Config.dtype is bfloat16
decodes its bfloat16 Dense layers (all but the float32 `logits_dense`) with cpu_kernels.cc's
`PanelMatmulDp`: `vdpbf16ps` over the weights cast to bfloat16 once and packed into pair
panels (`pack_pairs`), the activations cast to bfloat16, the float32 sums rounded to the
layer's dtype (layers.Dense), as XLA rounds the dot's result. The float32 layers (logits,
tied embedding) keep mode 'packed''s kernel, unless bfloat16 holds their weights exactly (a
model restored from a bfloat16 checkpoint): their bfloat16 inputs' products are then exact,
and they get pair panels too (float32 logits, summed in pair order).

Exactness: each output element is one chain over the contraction's pairs (x[2i], x[2i+1]),
in order, from zero; a pair adds fma(x[2i+1], w[2i+1], acc), then fma(x[2i], w[2i], .) --
the odd element first -- with bfloat16 denormal inputs read as zero and float32 denormal
results flushed to zero (shared/bench/vdpbf16ps_order.cc measured the order bitwise). The
chain is the same in every tile, so a row's result is bitwise that of a one-row call
(tests/test_cpu_bf16.py, with a numpy reference of that chain). It is not XLA:CPU's dot,
whose float32 sums run in another order: the two differ by float32 rounding before the
bfloat16 rounding, so now and then by one bfloat16 step.

Where the CPU lacks avx512_bf16 (/proc/cpuinfo), the mode falls back to 'packed''s kernels
(XLA's bfloat16 dot for the bfloat16 layers), with one log line.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import cpu_info, cpu_kernels

MODE = 'packed_bf16'
PAIR_PANEL = 2 * cpu_kernels.PANEL  # bfloat16 values per pair-panel row (cpu_kernels.cc)


def _cpu_has_dpbf16() -> bool:
  """The CPU runs vdpbf16ps on 512-bit registers (AVX-512 F, BW and BF16)."""
  return {'avx512f', 'avx512bw', 'avx512_bf16'} <= cpu_info.cpu_flags()


@functools.lru_cache(maxsize=None)
def _log_once(why: str) -> None:
  logging.warning('specdec_t5x: kernel mode %r falls back to mode \'packed\' (%s): XLA '
                  'computes the bfloat16 layers.', MODE, why)


def serves(mode, dtype) -> bool:
  """Whether a network of `dtype` decoding in kernel `mode` (None: the default) gets pair
  panels for its bfloat16 layers: mode 'packed_bf16', dtype bfloat16, the packed kernels
  enabled, a CPU with AVX-512 BF16 (checked each call; the fallback logged once)."""
  if (cpu_kernels.check_mode(mode or cpu_kernels.default_mode()) != MODE
      or jnp.dtype(dtype) != jnp.bfloat16 or not cpu_kernels.enabled(MODE)):
    return False
  if not _cpu_has_dpbf16():
    _log_once('the CPU lacks avx512_bf16')
    return False
  return True


def serves_attention(dtype) -> bool:
  """Whether a cached attention of `dtype` traced now runs `cached_attention`: `serves` in
  the kernel mode of the decode being traced (cpu_kernels.traced_mode), with the row
  kernels on (cpu_kernels.row_kernel: the CPU forms)."""
  return (jnp.dtype(dtype) == jnp.bfloat16 and cpu_kernels.row_kernel()
          and serves(cpu_kernels.traced_mode(), dtype))


def pack_pairs(w: jax.Array) -> jax.Array:
  """Kernel [K, N] -> bfloat16 pair panels [ceil(N / 16), ceil(K / 2), 32]:
  q[j, i, 2 c + h] = bfloat16(w[2 i + h, 16 j + c]), zero beyond K and N."""
  k, n = w.shape
  panels, pairs = -(-n // cpu_kernels.PANEL), -(-k // 2)
  w = jnp.pad(w.astype(jnp.bfloat16), ((0, 2 * pairs - k), (0, panels * cpu_kernels.PANEL - n)))
  return (w.reshape(pairs, 2, panels, cpu_kernels.PANEL).transpose(2, 0, 3, 1)
          .reshape(panels, pairs, PAIR_PANEL))


def is_pairs(packed: jax.Array) -> bool:
  """The packed kernel is pair panels (pack_pairs), not cpu_kernels.pack's."""
  return packed.ndim == 3 and packed.shape[-1] == PAIR_PANEL and packed.dtype == jnp.bfloat16


def matmul(x: jax.Array, packed: jax.Array, features: int) -> jax.Array:
  """bfloat16(x) [..., K] @ the pair-packed [K, features] kernel -> [..., features] float32
  (the float32 sums: the caller rounds them to its dtype)."""
  k = x.shape[-1]
  if (not is_pairs(packed) or packed.shape[1] != -(-k // 2)
      or not 0 <= packed.shape[0] * cpu_kernels.PANEL - features < cpu_kernels.PANEL):
    raise ValueError(f'x {x.shape} and pair panels {packed.shape} do not make a '
                     f'[..., {features}] product.')
  ok, why = cpu_kernels._status()  # pylint: disable=protected-access
  if ok and not _cpu_has_dpbf16():
    ok, why = False, 'the CPU lacks avx512_bf16'
  if not ok:
    raise RuntimeError(f'The bfloat16 CPU matmul is unavailable ({why}); decode without '
                       f'the pair panels.')
  x = x.astype(jnp.bfloat16)
  if k % 2:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, 1)])
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (features,), jnp.float32)
  return jax.ffi.ffi_call(cpu_kernels.TARGET_DP, out, vmap_method='sequential')(x, packed)


def layer(x: jax.Array, packed: jax.Array, features: int, dtype) -> jax.Array:
  """A layer of `dtype` on pair panels (layers.Dense, Embed.attend): `matmul` rounded to
  `dtype`. A bfloat16 layer casts x to bfloat16 (as XLA's bfloat16 dot). A float32 layer
  (logits) gets pair panels only where bfloat16 holds its weights exactly in a bfloat16
  network, and must get bfloat16 x: its products are then exact, only summed in pair order."""
  if jnp.dtype(dtype) != jnp.bfloat16 and x.dtype != jnp.bfloat16:
    raise ValueError(f'A {jnp.dtype(dtype)} layer on pair panels needs bfloat16 inputs, '
                     f'got {x.dtype}.')
  return matmul(x, packed, features).astype(dtype)


def cached_attention(q: jax.Array, k_t: jax.Array, v: jax.Array, bias: jax.Array,
                     float32_logits: bool = False) -> jax.Array:
  """`cpu_kernels.cached_attention` for bfloat16 networks, with T5X's bfloat16 casts
  (cpu_kernels.cc CachedAttentionBf16): q bfloat16, k_t / v bfloat16 or a decode cache's
  uint16 bits of bfloat16 (rows.storage_dtype), bias rounded to bfloat16 here -> context
  [B, Q, H, D] float32 (round it to bfloat16). Scores, softmax and weights rounded to bfloat16 where
  T5X's bfloat16 ops round them (`float32_logits`: the weights only); a query's context
  is bitwise the same in a call of one query or of many."""
  cpu_kernels._require_row_kernels()  # pylint: disable=protected-access
  bias = jnp.asarray(bias)
  if bias.ndim != 4:
    raise ValueError(f'cpu_bf16.cached_attention: bias must be 4-d [B, H, Q, S], got '
                     f'{bias.shape}.')
  if not float32_logits:
    bias = bias.astype(jnp.bfloat16)
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jax.ffi.ffi_call(cpu_kernels.TARGET_ATTENTION_BF16, out, vmap_method='sequential')(
      q.astype(jnp.bfloat16), k_t, v, bias.astype(jnp.float32), f32_logits=bool(float32_logits))
