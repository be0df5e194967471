"""Per-row windows of batched buffers at per-row offsets (sequence buffers, KV caches).

Each batch row reads or writes its own window along axis 1. Under `vmap` XLA lowers that
to a gather / scatter, whose per-call cost shows on XLA:CPU at batch 1 (about 16 us per
cache write, on every layer of every decoder call); a batch of one row takes the plain
dynamic slice instead. The values are the same either way.
"""

from __future__ import annotations

import jax


def window(x: jax.Array, start: jax.Array, size: int) -> jax.Array:
  """x [b, S, ...], start [b] -> [b, size, ...]: row r's x[r, start[r]:start[r] + size]."""
  if x.shape[0] == 1:
    return jax.lax.dynamic_slice_in_dim(x, start[0], size, axis=1)
  return jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size, axis=0))(x, start)


def update(x: jax.Array, new: jax.Array, start: jax.Array, axis: int = 1) -> jax.Array:
  """x [b, ...], new [b, ...] (k along `axis`, else x's sizes), start [b] -> x with row
  r's [start[r], start[r] + k) along `axis` replaced by new[r] (cast to x's dtype)."""
  new = new.astype(x.dtype)
  if x.shape[0] == 1:
    return jax.lax.dynamic_update_slice_in_dim(x, new, start[0], axis=axis)
  return jax.vmap(lambda row, u, s: jax.lax.dynamic_update_slice_in_dim(row, u, s, axis - 1))(
      x, new, start)
