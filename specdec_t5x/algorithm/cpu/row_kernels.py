"""The row kernels of the decode path on x86-64 CPUs (kernels/row_kernels.cc), per logits row.

`row_argmax`: jnp.argmax's index and whether the row holds a NaN or an infinity, in one
pass (sampling.argmax_checked: XLA:CPU runs both reductions several times slower);
`row_softmax`: the same pass and the temperature softmax with a vectorised exp
(sampling.standardize); `row_sample`: an inverse-CDF draw per row (sampling.sample). At a
sampled decode's one to gamma + 1 rows per call they cost about half XLA's chains of small
reductions. A function traced now uses them where modes.row_kernel() says so.
"""

from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.cpu import build


def row_argmax(x: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """x [..., V] float32 -> (index [...] int32, nonfinite [...] bool), one pass per row: the
  index is jnp.argmax's (the first maximum; the first NaN when the row holds one), the flag
  says the row holds a NaN or an infinity."""
  build.require('The CPU row kernels')
  out = (jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32),
         jax.ShapeDtypeStruct(x.shape[:-1], jnp.bool_))
  return jax.ffi.ffi_call(build.ROW_ARGMAX, out, vmap_method='sequential')(
      x.astype(jnp.float32))


def row_softmax(x: jax.Array, inv_temperature) -> Tuple[jax.Array, jax.Array]:
  """x [..., V] float32, inv_temperature: 1 / temperature > 0, a float32 scalar (a run-time
  value of the program: SamplingConfig.values) -> (probabilities [..., V] float32,
  nonfinite [...] bool): `row_argmax`'s pass (its flag, and the maximum at its index), then
  the softmax of (x - max) * inv_temperature (entries at the maximum exactly 0 before the
  exp), in two more vectorised passes per row (kernels/row_kernels.cc RowSoftmax)."""
  build.require('The CPU row kernels')
  out = (jax.ShapeDtypeStruct(x.shape, jnp.float32),
         jax.ShapeDtypeStruct(x.shape[:-1], jnp.bool_))
  return jax.ffi.ffi_call(build.ROW_SOFTMAX, out, vmap_method='sequential')(
      x.astype(jnp.float32), jnp.asarray(inv_temperature, jnp.float32).reshape(()))


def row_sample(probs: jax.Array, u: jax.Array) -> jax.Array:
  """probs [b, V] (>= 0, any total), u [b] in (0, 1] -> [b] int32: per row the first index
  whose cumulative mass reaches u * total, never one of probability 0
  (kernels/row_kernels.cc RowSample: block sums in one vectorised pass, then a running sum
  inside one block)."""
  build.require('The CPU row kernels')
  out = jax.ShapeDtypeStruct(probs.shape[:1], jnp.int32)
  return jax.ffi.ffi_call(build.ROW_SAMPLE, out, vmap_method='sequential')(
      probs.astype(jnp.float32), u.astype(jnp.float32))
