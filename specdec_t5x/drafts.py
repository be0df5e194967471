"""Negligible-cost drafts with the same interface as network.Transformer.

Each draft is a Flax module with `encode`, `init_cache` and `extend`, so `generate` and
the loops in decoding.py treat it like a draft model. Their q distributions are real
distributions (standardised like the target's), so speculative sampling stays exact.

* `UnigramDraft`: q(x) from a fixed logit vector `logits [V]`.
* `BigramDraft`: q(x | previous token) from a table `logits [V, V]`, the paper's
  negligible-cost bigram draft.
"""

from __future__ import annotations

from typing import Iterable

import flax.linen as nn
import jax.numpy as jnp
import numpy as np


class _CachelessDraft(nn.Module):
  """Shared plumbing: no encoder, no cache."""
  vocab_size: int

  def encode(self, encoder_input_tokens):
    return jnp.zeros(encoder_input_tokens.shape[:1] + (1,), jnp.float32)  # [b, 1]

  def init_cache(self, encoded, encoder_input_tokens, max_length: int):
    return {}

  def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens=None,
               enable_dropout: bool = False):
    """Teacher-forced logits [b, len, V], like the Transformer's."""
    return self.extend({}, decoder_input_tokens, None)[0]


class UnigramDraft(_CachelessDraft):
  """A context-free draft: the same q at every position."""

  @nn.compact
  def extend(self, cache, tokens, positions):
    logits = self.param('logits', nn.initializers.zeros, (self.vocab_size,), jnp.float32)
    return jnp.broadcast_to(logits, tokens.shape + (self.vocab_size,)), cache


class BigramDraft(_CachelessDraft):
  """q(x_t | x_{t-1}) from a [V, V] logit table (row = previous token; BOS is 0)."""

  @nn.compact
  def extend(self, cache, tokens, positions):
    table = self.param('logits', nn.initializers.zeros, (self.vocab_size, self.vocab_size),
                       jnp.float32)
    return jnp.take(table, tokens, axis=0), cache  # [b, k, V]


def ngram_log_probs(sequences: Iterable[Iterable[int]], vocab_size: int, order: int,
                    smoothing: float = 0.1, bos_id: int = 0) -> np.ndarray:
  """Add-`smoothing` log-probabilities from token sequences (decoder targets).

  Args:
    sequences: token id sequences, EOS included, without BOS.
    vocab_size: V.
    order: 1 for unigram ([V]) or 2 for bigram ([V, V], row = previous token, BOS = 0).
    smoothing: pseudo-count added to every cell, so q > 0 everywhere.
    bos_id: the decoder's start token, used as the previous token of the first one.

  Returns:
    float32 log-probabilities: [V] for order 1, [V, V] for order 2.
  """
  if order not in (1, 2):
    raise ValueError(f'order must be 1 or 2, got {order}.')
  counts = np.zeros((vocab_size,) * order, np.float64)
  for seq in sequences:
    seq = np.asarray(list(seq), np.int64)
    if seq.size == 0:
      continue
    if np.any(seq < 0) or np.any(seq >= vocab_size):
      raise ValueError(f'token ids must lie in [0, {vocab_size}), got {seq.min()}..{seq.max()}.')
    if order == 1:
      np.add.at(counts, seq, 1.0)
    else:
      prev = np.concatenate([[bos_id], seq[:-1]])
      np.add.at(counts, (prev, seq), 1.0)
  counts += smoothing
  return np.log(counts / counts.sum(axis=-1, keepdims=True)).astype(np.float32)
