"""Per-row windows of batched buffers at per-row offsets (sequence buffers, KV caches).

Each batch row reads or writes its own window along axis 1. Under `vmap` XLA lowers that
to a gather / scatter, whose per-call cost shows on XLA:CPU at batch 1 (about 16 us per
cache write, on every layer of every decoder call); a batch of one row takes the plain
dynamic slice instead. The values are the same either way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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


def update_all(xs, news, start: jax.Array, axes):
  """`update` of several buffers at the same per-row offsets, each along its own axis,
  written in place: -> (the updated buffers (a tuple), fits: scalar bool).

  The writes sit inside a `lax.cond`, taken when every row's window fits (`fits`). The
  decode loops size their caches so that it always does (decoding.cache_length); if it
  ever does not, the buffers come back unchanged and `fits` is False, which the caches
  record (layers.note_writes) and `generate` raises on: never a silent skip. The branch
  keeps XLA from fusing a copy of each write into every consumer of the result (the
  attention that reads the cache, and the loop state that carries it): fused twice, a
  write cannot be in place, and the whole buffer is copied on every call (seen with
  batch-1 and single-head shards, whose size-1 dimensions make the consumers reshape).
  """
  xs, news = tuple(xs), tuple(news)
  fits = jnp.all(start >= 0)
  for x, new, axis in zip(xs, news, axes):
    fits &= jnp.all(start + new.shape[axis] <= x.shape[axis])

  def write(buffers):
    return tuple(update(x, new, start, axis) for x, new, axis in zip(buffers, news, axes))

  return jax.lax.cond(fits, write, lambda buffers: buffers, xs), fits
