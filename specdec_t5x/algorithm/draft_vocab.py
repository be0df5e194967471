"""A draft's reduced vocabulary: the token ids of its logits columns (EAGLE-3's commonest ids).

A draft head may have logits over a few ids only (feature_draft.FeatureDraftConfig's
draft_vocab). The loops then draft over its columns (decode/drafting.py), tree builders
map columns to ids (trees/build.py), and the draft's distributions are widened to the
whole vocabulary once per step, for the verifier (`full_distributions`: every other id has
probability 0, so the acceptance rule is unchanged).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class DraftVocabulary(NamedTuple):
  """The token ids of a draft's logits columns, when they are not the whole vocabulary."""
  ids: jax.Array  # [Vd] int32, increasing: column j's token id
  columns: jax.Array  # [V] int32: each token id's column, or Vd (an id never drafted)


def draft_vocabulary(ids: Sequence[int], vocab_size: int) -> DraftVocabulary:
  """Increasing ids in [0, vocab_size) -> their DraftVocabulary (numpy arrays)."""
  ids = np.asarray(ids, np.int32)
  columns = np.full((vocab_size,), len(ids), np.int32)
  columns[ids] = np.arange(len(ids), dtype=np.int32)
  return DraftVocabulary(ids, columns)


def full_distributions(q, vocab: Optional[DraftVocabulary]):
  """q [..., Vd] over the draft's columns -> [..., V] over the vocabulary (0 off its ids):
  a gather through `columns` with one zero appended (XLA:CPU runs a scatter as a scalar
  loop)."""
  if vocab is None:
    return q
  zero = jnp.zeros(q.shape[:-1] + (1,), q.dtype)
  return jnp.take(jnp.concatenate([q, zero], axis=-1), jnp.asarray(vocab.columns), axis=-1)
