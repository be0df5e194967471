"""What `generate` checks before and after a decode: its inputs (token ids in range, the
decoder prompt's shape, a draft tree's settings against the draft) and its outputs' flags
(dropped cache writes, non-finite logits), raised on the host with what to look at."""

from __future__ import annotations

from typing import Optional

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.stats import DecodeStats


def is_traced(x) -> bool:
  return isinstance(x, jax.core.Tracer)


def encoder_inputs(x, vocab_size: Optional[int]) -> jax.Array:
  """[batch, length] integer ids -> int32; concrete inputs must lie in [0, vocab_size).

  Out-of-range ids would otherwise be clamped or wrapped by the embedding lookup (and
  int64 ids >= 2**31 wrap to other ids in the int32 cast): silent garbage. Traced inputs
  (generate called under jit) cannot be inspected and are not checked.
  """
  arr = np.asarray(x) if not isinstance(x, jax.Array) else x
  if arr.ndim != 2:
    raise ValueError(f'encoder_input_tokens must be a 2-D [batch, length] int array, '
                     f'got shape {tuple(arr.shape)}.')
  if not jnp.issubdtype(arr.dtype, jnp.integer):
    raise ValueError(f'encoder_input_tokens must hold integer token ids, got dtype {arr.dtype}.')
  if 0 in arr.shape:
    raise ValueError(f'encoder_input_tokens is empty (shape {tuple(arr.shape)}): give at '
                     'least one row of at least one token.')
  if not is_traced(arr):
    limit = vocab_size or 2 ** 31
    lo, hi = int(arr.min()), int(arr.max())  # On device for jax arrays, sharded or not.
    if lo < 0 or hi >= limit:
      host = np.asarray(arr)
      row, col = (int(i) for i in np.argwhere((host < 0) | (host >= limit))[0])
      raise ValueError(
          f'encoder_input_tokens[{row}, {col}] = {int(host[row, col])} is not a token id of '
          f'this model: ids must lie in [0, {limit}) ('
          + ('the target vocab_size' if vocab_size else 'int32') + '; 0 = padding). '
          'Tokenize with the model\'s vocabulary.')
  return jnp.asarray(arr, jnp.int32)


def decoder_prompt(prompt, batch: int, max_len: int) -> jax.Array:
  """decoder_prompt [batch, P <= max_len] integer ids -> int32."""
  if (np.ndim(prompt) != 2 or np.shape(prompt)[0] != batch or np.shape(prompt)[1] > max_len
      or not jnp.issubdtype(jnp.result_type(prompt), jnp.integer)):
    raise ValueError(f'decoder_prompt must be [batch={batch}, P <= max_decode_length='
                     f'{max_len}] integer ids, got shape {np.shape(prompt)}.')
  return jnp.asarray(prompt, jnp.int32)


def cache_writes(stats: DecodeStats) -> None:
  """Raises if a model call's cache writes were dropped (a cache sized too small for the
  decode: a bug, never a setting; every row's later tokens would be suspect). Inside an
  outer trace (T5X's infer jits the model) the check runs on the host when the program
  does (a callback), and the program fails with this error."""
  flags = stats['skipped_cache_writes']
  if is_traced(flags):
    jax.debug.callback(_raise_if_skipped, flags)
  else:
    _raise_if_skipped(flags)


def host_value(array) -> np.ndarray:
  """`array` on the host, whole: gathered from every process when it spans devices of
  others (a multi-host decode; a collective, so every process calls it alike)."""
  if isinstance(array, jax.Array) and not array.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(array)


def _raise_if_skipped(flags) -> None:
  if bool(np.any(host_value(flags))):
    raise RuntimeError('A decode call\'s cache writes did not fit the decode cache and were '
                       'dropped, so its tokens are not the models\' (the caches hold '
                       'decode.core.cache_length positions). This is a bug of specdec_t5x; '
                       'please report it with the settings and models used.')


def finite(stats: DecodeStats) -> None:
  """Raises if a decoding row met NaN/inf logits (its tokens would be garbage/padding)."""
  for who, key, hint in (
      ('target', 'nonfinite_target_logits', 'the target params (checkpoint, '
       'CHECKPOINT_DTYPE: float16 overflows) and its inputs'),
      ('draft', 'nonfinite_draft_logits', 'the draft params (checkpoint, dtype)')):
    flags = stats[key]
    if is_traced(flags):
      continue
    rows = np.flatnonzero(host_value(flags))
    if rows.size:
      raise FloatingPointError(
          f'The {who} model produced NaN or infinite logits for batch rows '
          f'{rows.tolist()[:10]}; no tokens are returned for them. Check {hint}.')


def draft_tree(config: DecodeConfig, draft_reads_features: bool, speculative: bool,
               draft_is_model: bool = True, draft_columns: Optional[int] = None) -> Optional[str]:
  """Why a draft tree cannot be verified with these settings (None: it can).
  `draft_is_model`: the draft is a T5 model (network.Transformer); its calls take a tree,
  as a feature head's do (what draft_tree_width's draft tree calls need). `draft_columns`:
  the ids a head with a reduced draft vocabulary drafts over (its siblings and a dynamic
  tree's levels come from them)."""
  if not config.tree:
    return None
  what = ' and '.join(name for name in ('copy_branch', 'draft_siblings', 'draft_tree_width')
                      if getattr(config, name))
  if not speculative:
    return f'{what} needs a draft (it proposes the tree\'s first branch).'
  if config.draft_tree_width and not (draft_reads_features or draft_is_model):
    return (f'{what} grows the tree with draft tree calls: the draft must be a T5 model '
            '(network.Transformer) or a feature head, not an n-gram or a copy draft.')
  if draft_columns is not None and config.draft_tree_width > draft_columns:
    return (f'draft_tree_width must be <= the {draft_columns} ids of the head\'s reduced '
            f'draft vocabulary (a level\'s first node has no more children), got '
            f'{config.draft_tree_width}.')
  if draft_columns is not None and max(config.draft_siblings, default=0) >= draft_columns:
    return (f'draft_siblings must be < the {draft_columns} ids of the head\'s reduced draft '
            f'vocabulary at every depth, got {config.draft_siblings}.')
  return None
