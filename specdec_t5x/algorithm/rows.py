"""Per-row windows of batched buffers at per-row offsets (sequence buffers, KV caches).

Each batch row reads or writes its own window along axis 1. Under `vmap` XLA lowers that
to a gather / scatter, whose per-call cost shows on XLA:CPU at batch 1 (about 16 us per
cache write, on every layer of every decoder call); a batch of one row takes the plain
dynamic slice instead. The values are the same either way.

On the CPU backend a decode cache keeps 16-bit float values as their bits (`storage_dtype`,
`store`, `load`): XLA:CPU computes 16-bit float ops in float32, so a write into a bfloat16
buffer converts the whole buffer to float32 and back on every call, while a write of the
same bits into a uint16 buffer is in place.

A decode cache (a dict) records a call whose writes did not fit under SKIPPED
(`note_writes`, read back by `writes_skipped`): the network's calls and a tree's
compaction write through `update_all`, and the loops report the flag.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.cpu import modes

_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def storage_dtype(dtype) -> jnp.dtype:
  """The dtype a decode cache keeps values of `dtype` in: uint16 bits for a 16-bit float on
  the CPU backend (modes.cpu_forms), else `dtype`."""
  dtype = jnp.dtype(dtype)
  return jnp.dtype(jnp.uint16) if dtype in _HALF and modes.cpu_forms() else dtype


def store(x: jax.Array, buffer: jax.Array) -> jax.Array:
  """x's values in `buffer`'s dtype: for a uint16 buffer holding 16-bit float bits, x (a
  16-bit float) bitcast; otherwise x cast."""
  if buffer.dtype == jnp.uint16 and jnp.issubdtype(x.dtype, jnp.floating):
    if x.dtype not in _HALF:
      raise ValueError(f'A uint16 cache holds 16-bit float bits; got {x.dtype} values.')
    return jax.lax.bitcast_convert_type(x, jnp.uint16)
  return x.astype(buffer.dtype)


def load(buffer: jax.Array, dtype) -> jax.Array:
  """`buffer`'s values as `dtype` (a 16-bit float read back from its uint16 bits)."""
  if buffer.dtype == jnp.uint16 and jnp.dtype(dtype) in _HALF:
    return jax.lax.bitcast_convert_type(buffer, dtype)
  return buffer.astype(dtype)


def window(x: jax.Array, start: jax.Array, size: int) -> jax.Array:
  """x [b, S, ...], start [b] -> [b, size, ...]: row r's x[r, start[r]:start[r] + size]."""
  if x.shape[0] == 1:
    return jax.lax.dynamic_slice_in_dim(x, start[0], size, axis=1)
  return jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size, axis=0))(x, start)


def update(x: jax.Array, new: jax.Array, start: jax.Array, axis: int = 1) -> jax.Array:
  """x [b, ...], new [b, ...] (k along `axis`, else x's sizes), start [b] -> x with row
  r's [start[r], start[r] + k) along `axis` replaced by new[r] (cast to x's dtype; a
  cache of 16-bit float bits takes `store`'s bits)."""
  if jnp.issubdtype(new.dtype, jnp.floating) and not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f'Writing {new.dtype} values into a {x.dtype} buffer would cast them; '
                     f'write rows.store(values, buffer).')
  new = new.astype(x.dtype)
  if x.shape[0] == 1:
    return jax.lax.dynamic_update_slice_in_dim(x, new, start[0], axis=axis)
  return jax.vmap(lambda row, u, s: jax.lax.dynamic_update_slice_in_dim(row, u, s, axis - 1))(
      x, new, start)


def update_all(xs, news, start: jax.Array, axes):
  """`update` of several buffers at the same per-row offsets, each along its own axis,
  written in place: -> (the updated buffers (a tuple), fits: scalar bool).

  The writes sit inside a `lax.cond`, taken when every row's window fits (`fits`). The
  decode loops size their caches so that it always does (decode/core.py's cache_length); if it
  ever does not, the buffers come back unchanged and `fits` is False, which the caches
  record (`note_writes`) and `generate` raises on: never a silent skip. The branch
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


SKIPPED = 'skipped_writes'  # a decode cache's scalar bool: some call's writes did not fit


def note_writes(cache: dict, new_layers, fits) -> dict:
  """`cache` with its layers replaced by `new_layers` and SKIPPED set when any of `fits`
  (the calls' update_all flags) is False: the writes were dropped, and the decode that
  carried this cache is wrong (the loops report it, generate raises)."""
  skipped = cache[SKIPPED]
  for ok in fits:
    skipped = skipped | ~ok
  return dict(cache, layers=new_layers, **{SKIPPED: skipped})


def writes_skipped(cache) -> jax.Array:
  """Scalar bool: `cache` records a call whose writes did not fit (`note_writes`); caches
  that record nothing (test stubs, other models) never do."""
  if isinstance(cache, dict) and SKIPPED in cache:
    return cache[SKIPPED]
  return jnp.zeros((), bool)
