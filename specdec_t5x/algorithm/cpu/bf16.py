"""bfloat16 arithmetic (bfloat16 x bfloat16 -> float32) for bfloat16 models on x86-64 CPUs
with AVX-512 BF16.

T5X runs its models with dtype='bfloat16': bfloat16 activations and weights, float32
accumulation (a TPU's MXU), each dot's result rounded to bfloat16. In kernel mode
'packed_bf16' (modes.MODES), a network.Transformer whose T5Config.dtype is bfloat16
decodes its bfloat16 Dense layers (all but the float32 `logits_dense`) with
kernels/matmul_dp.cc's `PanelMatmulDp`: `vdpbf16ps` over the weights cast to bfloat16 once
and packed into pair panels (`pack_pairs`), the activations cast to bfloat16, the float32
sums rounded to the layer's dtype (`layer`), as XLA rounds the dot's result. The float32
logits (a Dense or the tied embedding) keep float32 arithmetic, unless bfloat16 holds their
weights exactly (a model restored from a bfloat16 checkpoint): their bfloat16 inputs'
products are then exact, and they get pair panels too (float32 logits, summed in pair
order). modes.panel_format says which layer gets which.

Exactness: each output element is one chain over the contraction's pairs (x[2i], x[2i+1]),
in order, from zero; a pair adds fma(x[2i+1], w[2i+1], acc), then fma(x[2i], w[2i], .) --
the odd element first -- with bfloat16 denormal inputs read as zero and float32 denormal
results flushed to zero (shared/bench/vdpbf16ps_order.cc measured the order bitwise). The
chain is the same in every tile, so a row's result is bitwise that of a one-row call
(tests/test_cpu_bf16.py, with a numpy reference of that chain). It is not XLA:CPU's dot,
whose float32 sums run in another order: the two differ by float32 rounding before the
bfloat16 rounding, so now and then by one bfloat16 step.

Where the CPU lacks avx512_bf16 (/proc/cpuinfo), the mode falls back to 'packed''s kernels
(XLA's bfloat16 dot for the bfloat16 layers), with one log line (modes.pair_arithmetic).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.cpu import build, modes
from specdec_t5x.algorithm.cpu.f32 import PANEL

PAIR_PANEL = 2 * PANEL  # bfloat16 values per pair-panel row (kernels/matmul_dp.cc)


def pack_pairs(w: jax.Array) -> jax.Array:
  """Kernel [K, N] -> bfloat16 pair panels [ceil(N / 16), ceil(K / 2), 32]:
  q[j, i, 2 c + h] = bfloat16(w[2 i + h, 16 j + c]), zero beyond K and N."""
  k, n = w.shape
  panels, pairs = -(-n // PANEL), -(-k // 2)
  w = jnp.pad(w.astype(jnp.bfloat16), ((0, 2 * pairs - k), (0, panels * PANEL - n)))
  return (w.reshape(pairs, 2, panels, PANEL).transpose(2, 0, 3, 1)
          .reshape(panels, pairs, PAIR_PANEL))


def matmul(x: jax.Array, packed: jax.Array, features: int) -> jax.Array:
  """bfloat16(x) [..., K] @ the pair-packed [K, features] kernel -> [..., features] float32
  (the float32 sums: the caller rounds them to its dtype)."""
  k = x.shape[-1]
  if (packed.ndim != 3 or packed.shape[-1] != PAIR_PANEL or packed.dtype != jnp.bfloat16
      or packed.shape[1] != -(-k // 2)
      or not 0 <= packed.shape[0] * PANEL - features < PANEL):
    raise ValueError(f'x {x.shape} and pair panels {packed.shape} do not make a '
                     f'[..., {features}] product.')
  if build.status()[0] and not modes.cpu_has_dpbf16():
    raise RuntimeError('The bfloat16 CPU matmul is unavailable (the CPU lacks avx512_bf16); '
                       'decode without the pair panels.')
  build.require('The bfloat16 CPU matmul', '; decode without the pair panels')
  x = x.astype(jnp.bfloat16)
  if k % 2:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, 1)])
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (features,), jnp.float32)
  return jax.ffi.ffi_call(build.PANEL_MATMUL_DP, out, vmap_method='sequential')(x, packed)


def layer(x: jax.Array, packed: jax.Array, features: int, dtype) -> jax.Array:
  """A layer of `dtype` on pair panels (matmul.apply): `matmul` rounded to `dtype`. A
  bfloat16 layer casts x to bfloat16 (as XLA's bfloat16 dot). A float32 layer (logits)
  gets pair panels only where bfloat16 holds its weights exactly in a bfloat16 network, and
  must get bfloat16 x: its products are then exact, only summed in pair order."""
  if jnp.dtype(dtype) != jnp.bfloat16 and x.dtype != jnp.bfloat16:
    raise ValueError(f'A {jnp.dtype(dtype)} layer on pair panels needs bfloat16 inputs, '
                     f'got {x.dtype}.')
  return matmul(x, packed, features).astype(dtype)
