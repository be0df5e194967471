"""Draft trees: one cached target call over a tree of candidate tokens, and its compaction.

A draft tree of N nodes per row is `parents` [batch, N] int32: node 0 is the root (the
row's last committed token, fed at the row's position n), parents[:, 0] == -1, and
0 <= parents[:, i] < i for i > 0 (topological order; a chain is [-1, 0, 1, ...]).
`Transformer.extend(..., tree=parents)` feeds the N nodes in one call: node i is written
at the slot a chain call's i-th token takes (positions + 1 + i), but sits at position
positions + depth[i] and attends to the committed prefix and to its own ancestors only
(`attention_layout`, which layers.decode_biases reads), so each node's logits are those of a
chain call over its root-to-node path. After acceptance `compact` moves the accepted path's
keys and values to the slots a chain call over the path writes, and decoding goes on as if
only the path had been fed.

Shapes use T5X's bracket comments: `# [batch, nodes]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import rows


def _concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def check(parents) -> np.ndarray:
  """Validates a concrete tree -> parents as an int32 numpy array [batch, N].

  Raises ValueError (naming the row and node) unless parents is 2-d of integers, N >= 1,
  every root's parent is -1 and every other node's parent is an earlier node.
  """
  arr = np.asarray(parents)
  if arr.ndim != 2 or arr.shape[1] < 1 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f'A draft tree is parents [batch, nodes >= 1] of integers, got shape '
                     f'{arr.shape} and dtype {arr.dtype}.')
  for r, i in zip(*np.nonzero(arr[:, :1] != -1)):
    raise ValueError(f'Draft tree row {r}: node 0 is the root, its parent must be -1, got '
                     f'{arr[r, i]}.')
  earlier = (arr >= 0) & (arr < np.arange(arr.shape[1])[None, :])  # [batch, N]
  for r, i in zip(*np.nonzero(~earlier[:, 1:])):
    raise ValueError(f'Draft tree row {r}: the parent of node {i + 1} must be an earlier node '
                     f'(0..{i}), got {arr[r, i + 1]}.')
  return arr.astype(np.int32)


def _parents(parents) -> jax.Array:
  """parents as int32, validated where concrete (a traced tree is taken as valid)."""
  if _concrete(parents):
    check(parents)
  elif parents.ndim != 2:
    raise ValueError(f'A draft tree is parents [batch, nodes], got shape {parents.shape}.')
  return jnp.asarray(parents, jnp.int32)


def chain(batch: int, n: int) -> jax.Array:
  """The parents [batch, n] of a chain of n tokens: [-1, 0, 1, ..., n - 2] in every row."""
  return jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32) - 1, (batch, n))


def ancestors(parents) -> jax.Array:
  """parents [b, N] -> [b, N, N] bool: [r, i, j] when node j is node i or an ancestor of it.

  Row i is its parent's row plus i itself (parents come first), one step per node.
  """
  parents = _parents(parents)
  b, n = parents.shape
  eye = jnp.eye(n, dtype=bool)
  anc = jnp.broadcast_to(eye, (b, n, n))
  for i in range(1, n):
    above = jnp.take_along_axis(anc, parents[:, i, None, None], axis=1)[:, 0]  # [b, N]
    anc = anc.at[:, i].set(above | eye[i])
  return anc


def depths(parents) -> jax.Array:
  """parents [b, N] -> depth [b, N] int32 (the root 0): the number of strict ancestors."""
  return jnp.sum(ancestors(parents), axis=-1, dtype=jnp.int32) - 1


def attention_layout(parents, positions: jax.Array, num_slots: int):
  """Where a tree call's queries and keys sit, for a decode cache of `num_slots` slots.

  Args:
    parents: [b, N] the tree (node i in slot positions + 1 + i).
    positions: [b] each row's root position.
    num_slots: the cache's slots (slot s holds position s - 1 outside the tree).
  Returns:
    q_pos: [b, N] node i's position, positions + depth[i].
    key_pos: [b, S] each slot's position: positions + depth[j] for tree node j, else s - 1.
    mask: [b, N, S] node i sees the committed prefix (slots 1..positions) and the slots of
      its ancestors and itself, nothing else.
  """
  anc = ancestors(parents)  # [b, N, N]
  b, n = anc.shape[:2]
  depth = jnp.sum(anc, axis=-1, dtype=jnp.int32) - 1  # [b, N]
  slot = jnp.arange(num_slots)[None, :]  # [1, S]
  node = slot - (positions[:, None] + 1)  # [b, S] the tree node a slot holds, if 0..N-1
  in_tree = (node >= 0) & (node < n)
  node = jnp.clip(node, 0, n - 1)
  key_pos = jnp.where(in_tree, positions[:, None] + jnp.take_along_axis(depth, node, axis=1),
                      slot - 1)
  sees = jnp.take_along_axis(anc, jnp.broadcast_to(node[:, None, :], (b, n, num_slots)),
                             axis=2)  # [b, N, S]
  prefix = (slot >= 1) & (slot <= positions[:, None])  # [b, S]
  mask = prefix[:, None, :] | (in_tree[:, None, :] & sees)
  return positions[:, None] + depth, key_pos, mask


def check_path(path) -> np.ndarray:
  """Validates a concrete accepted path [batch, L]: it starts at the root (node 0), its node
  indices increase down the tree (topological order), and once it stops it repeats its last
  node (accept.py's paths end so)."""
  arr = np.asarray(path)
  if arr.ndim != 2 or arr.shape[1] < 1 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f'An accepted path is [batch, length >= 1] node indices, got shape '
                     f'{arr.shape} and dtype {arr.dtype}.')
  step = np.diff(arr, axis=1)
  stopped = np.cumsum(step == 0, axis=1) > 0  # [batch, L - 1]: at or after the first repeat
  bad = (arr[:, 0] != 0) | np.any(step < 0, axis=1) | np.any(stopped & (step != 0), axis=1)
  for r in np.nonzero(bad)[0]:
    raise ValueError(f'Accepted path row {r} must start at the root (node 0), go down the '
                     f'tree (increasing node indices), then repeat its last node, got '
                     f'{arr[r].tolist()}.')
  return arr.astype(np.int32)


def compact(cache, positions: jax.Array, path) -> dict:
  """The decode cache after a tree call at `positions` [b], with the accepted `path` [b, L]
  (node indices, path[:, 0] == 0) moved to where a chain call over the path's tokens writes.

  Per layer, the self-attention keys/values of node path[:, t] (slot positions + 1 +
  path[:, t]) are gathered and written at slot positions + 1 + t, t < L, in place
  (rows.update_all over those L slots only); the cross-attention entries are untouched.
  Those slots then hold bitwise what the chain call would have written; the rest of the
  tree's slots lie beyond the next call's positions, masked. A write that does not fit is
  recorded in the cache, as extend's are (rows.note_writes).
  """
  if _concrete(path):
    check_path(path)
  path = jnp.asarray(path, jnp.int32)
  slots = positions[:, None] + 1 + path  # [b, L]
  new_layers, fits = [], []
  for layer in cache['layers']:
    k = jnp.take_along_axis(layer['k'], slots[:, None, None, :], axis=3)  # [b, h, d, L]
    v = jnp.take_along_axis(layer['v'], slots[:, None, :, None], axis=2)  # [b, h, L, d]
    (k, v), ok = rows.update_all((layer['k'], layer['v']), (k, v), positions + 1, axes=(3, 2))
    new_layers.append(dict(layer, k=k, v=v))
    fits.append(ok)
  return rows.note_writes(cache, new_layers, fits)
