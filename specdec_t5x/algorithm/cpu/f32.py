"""A packed-weight matmul with float32 arithmetic for the cached decode path on x86-64 CPUs.

At decode time a matmul has M = batch x (1 .. gamma + 1) rows. XLA:CPU's GEMM re-packs the
weights on every such call and its throughput at M = 4 is far from the memory bound, so a
(gamma + 1)-position verify call cost about 1.9x a one-token step on the demo target
(results/cpu_kernels.md). `kernels/matmul_f32.cc` instead reads weights packed ONCE into
16-column panels, in order, and reuses each weight for all rows from registers: a one-token
step and a verify call both run near the cost of reading the weights.

Exactness: every output element is one chain of fused multiply-adds over the contraction
dimension, in order, from zero, whatever the number of rows or the tile that computes it;
a row's result is bitwise independent of the other rows in the call (tests/test_cpu_kernels).
It differs from XLA's dot by float32 rounding only (~1e-6 relative).

Storage dtype: weights that bfloat16 holds exactly (every float32 weight of a model restored
from a bfloat16 checkpoint, such as T5X writes with SaveCheckpointConfig.dtype='bfloat16')
can be stored as bfloat16 panels (`pack(w, bf16_storage=True)`): the kernel widens them back
to the same float32 values, so the products are bitwise those of float32 panels, and a call
reads half the bytes. A one-row call is then still bound by those bytes, a (gamma + 1)-row
verify call by the multiply-adds: where the CPU has AVX-512 (F and BW), calls of 2+ rows on
bfloat16 panels use 16-wide tiles (SPECDEC_CPU_KERNELS_AVX512=0 keeps the AVX2 ones; the
same bits).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.cpu import build

PANEL = 16  # columns per panel (kernels/common.h kPanel)


def holds_in_bf16(w: jax.Array) -> jax.Array:
  """Scalar bool: every entry of float32 `w` is a bfloat16 value (storing it as bfloat16
  loses nothing)."""
  return jnp.all(w.astype(jnp.bfloat16).astype(w.dtype) == w)


def pack(w: jax.Array, bf16_storage: bool = False) -> jax.Array:
  """Kernel [K, N] -> panels [ceil(N / 16), K, 16], zero-padded beyond N: float32, or with
  `bf16_storage` bfloat16 with each panel row's halves interleaved (p[j, k, 2 i + h] =
  w[k, 16 j + 8 h + i], as kernels/matmul_f32.cc reads them). Only for weights that
  `holds_in_bf16`: others would be rounded."""
  k, n = w.shape
  panels = -(-n // PANEL)
  w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, panels * PANEL - n)))
  if not bf16_storage:
    return w.reshape(k, panels, PANEL).transpose(1, 0, 2)
  half = PANEL // 2
  return (w.reshape(k, panels, 2, half).transpose(1, 0, 3, 2).reshape(panels, k, PANEL)
          .astype(jnp.bfloat16))


def matmul(x: jax.Array, packed: jax.Array, features: int) -> jax.Array:
  """x [..., K] @ the packed [K, features] kernel (float32 or bfloat16 panels) ->
  [..., features] float32."""
  if x.shape[-1] != packed.shape[1] or not 0 <= packed.shape[0] * PANEL - features < PANEL:
    raise ValueError(f'x {x.shape} and packed panels {packed.shape} do not make a '
                     f'[..., {features}] product.')
  if packed.dtype not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f'Packed panels must be float32 or bfloat16, got {packed.dtype}.')
  build.require('The packed CPU matmul', '; decode without the packed variables')
  target = build.PANEL_MATMUL_BF16 if packed.dtype == jnp.bfloat16 else build.PANEL_MATMUL
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (features,), jnp.float32)
  return jax.ffi.ffi_call(target, out, vmap_method='sequential')(x.astype(jnp.float32), packed)
