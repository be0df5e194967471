"""Negligible-cost drafts with the same interface as network.Transformer.

Each draft is a Flax module with `encode`, `init_cache` and `extend`, so `generate` and
the loops in decode/ treat it like a draft model. Their q distributions are real
distributions (standardised like the target's), so speculative sampling stays exact.

* `UnigramDraft`: q(x) from a fixed logit vector `logits [V]`.
* `BigramDraft`: q(x | previous token) from a table `logits [V, V]`, the paper's
  negligible-cost bigram draft.
* `SparseBigramDraft`: the same with the table stored as the top-k successors of each
  token over a unigram back-off (a few MB instead of V^2 floats), built from corpus
  counts by `sparse_bigram` (`ngram_draft` turns params into a draft; their .npz files are
  written and read by specdec_t5x.integration.draft_files).
"""

from __future__ import annotations

from typing import Iterable, Optional

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


class SparseBigramDraft(_CachelessDraft):
  """q(x | prev) = top-k bigram log-probs of `prev`, unigram back-off elsewhere.

  Params: `backoff [V]` log-probs, `ids [V, K]` successor ids, `logits [V, K]` their
  log-probs. The back-off mass is already folded into `backoff` (see `sparse_bigram`), so
  each row is a normalised distribution.
  """
  topk: int = 32

  @nn.compact
  def extend(self, cache, tokens, positions):
    v, k = self.vocab_size, self.topk
    backoff = self.param('backoff', nn.initializers.zeros, (v,), jnp.float32)
    ids = self.param('ids', nn.initializers.zeros, (v, k), jnp.int32)
    logits = self.param('logits', nn.initializers.zeros, (v, k), jnp.float32)
    row_ids, row_logits = jnp.take(ids, tokens, axis=0), jnp.take(logits, tokens, axis=0)
    flat = jnp.broadcast_to(backoff, tokens.shape + (v,)).reshape(-1, v)
    rows = jnp.arange(flat.shape[0])[:, None]
    flat = flat.at[rows, row_ids.reshape(-1, k)].set(row_logits.reshape(-1, k))
    return flat.reshape(tokens.shape + (v,)), cache


def sparse_bigram(sequences: Iterable[Iterable[int]], vocab_size: int, topk: int = 32,
                  smoothing: float = 0.1, bos_id: int = 0) -> dict:
  """Top-k bigram successors per token with a unigram back-off, from token sequences.

  For each previous token the k most frequent successors keep their smoothed bigram
  probability; the remaining mass is spread over all other tokens in proportion to the
  unigram distribution. Returns SparseBigramDraft params (numpy).
  """
  uni = np.exp(ngram_log_probs(sequences, vocab_size, 1, smoothing))  # [V]
  counts = np.zeros((vocab_size, vocab_size), np.float32)
  for seq in sequences:
    seq = np.asarray(list(seq), np.int64)
    if seq.size:
      np.add.at(counts, (np.concatenate([[bos_id], seq[:-1]]), seq), 1.0)
  ids = np.argsort(-counts, axis=1, kind='stable')[:, :topk]  # [V, K]
  top = np.take_along_axis(counts, ids, axis=1) + smoothing
  total = counts.sum(1, keepdims=True) + smoothing * vocab_size
  p_top = top / total  # [V, K]
  rest_uni = 1.0 - np.take_along_axis(np.broadcast_to(uni, counts.shape), ids, axis=1).sum(1)
  rest_mass = 1.0 - p_top.sum(1)  # [V]
  # Back-off row for `prev`: uni * rest_mass / rest_uni; rows differ only by a scale, so
  # store one shared vector and fold each row's scale into its top-k entries instead.
  scale = rest_mass / np.maximum(rest_uni, 1e-12)  # [V]
  backoff = np.log(uni)
  logits = np.log(p_top) - np.log(scale)[:, None]
  return {'backoff': backoff.astype(np.float32), 'ids': ids.astype(np.int32),
          'logits': logits.astype(np.float32)}


def ngram_draft(params: dict, vocab_size: int):
  """-> (module, params) of n-gram draft params: sparse bigram, bigram or unigram.

  The kind is read from the params (`sparse_bigram`'s keys, or the rank of `logits`), so
  a saved draft file need not record it (integration.draft_files reads them).
  """
  if 'ids' in params:
    return SparseBigramDraft(vocab_size, topk=int(params['ids'].shape[1])), params
  if params['logits'].ndim == 1:
    return UnigramDraft(vocab_size), params
  return BigramDraft(vocab_size), params


class CopyDraft(nn.Module):
  """Prompt-lookup draft: copies the continuation of the decoded suffix's last match.

  The cache keeps the encoder input tokens and the decoder inputs seen so far (`extend`
  receives every decoder token at its position). For each query position, the longest
  suffix of n = max_ngram..1 decoder tokens that also occurs earlier, in the encoder input
  or in the decoded prefix, proposes the token that followed its most recent occurrence
  (decoded matches count as later than encoder ones): q is one-hot on it (logits 0 / -1e9,
  still one-hot after any temperature / top-k / top-p). Without a match the `fallback`
  draft's logits are used (its cache advances on every call), or uniform logits when it is
  None. q is exactly the distribution the loop samples from, so verification stays exact.

  Params: {'fallback': the fallback's params} (empty without a fallback).
  """
  vocab_size: int
  max_ngram: int = 3
  fallback: Optional[nn.Module] = None

  def encode(self, encoder_input_tokens):
    if self.fallback is None:
      return jnp.zeros(encoder_input_tokens.shape[:1] + (1,), jnp.float32)
    return self.fallback.encode(encoder_input_tokens)

  def init_cache(self, encoded, encoder_input_tokens, max_length: int):
    b = encoder_input_tokens.shape[0]
    inner = {} if self.fallback is None else self.fallback.init_cache(
        encoded, encoder_input_tokens, max_length)
    return {'enc': jnp.asarray(encoder_input_tokens, jnp.int32),  # [b, enc_len]
            'dec': jnp.zeros((b, max_length), jnp.int32),  # [b, max_length] input at t
            'fallback': inner}

  def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens=None,
               enable_dropout: bool = False):
    """Teacher-forced logits [b, len, V] (positions 0..len-1)."""
    b, n = decoder_input_tokens.shape
    encoded = self.encode(encoder_input_tokens)
    cache = self.init_cache(encoded, encoder_input_tokens, n)
    return self.extend(cache, decoder_input_tokens, jnp.zeros((b,), jnp.int32))[0]

  def propose(self, enc, dec, pos):
    """enc [b, L], dec [b, T] (decoder input at each position), pos [b] -> (token [b], found [b]).

    Only dec[:, 1:pos + 1] (tokens after BOS up to the query position) is trusted.
    """
    b, L = enc.shape
    T = dec.shape[1]
    hay = jnp.concatenate([enc, dec], axis=1)  # [b, H]
    H = L + T
    h = jnp.arange(H)[None, :]  # [1, H]
    in_enc = h < L
    t = h - L  # decoder position of a haystack slot
    shifted = [jnp.pad(hay, ((0, 0), (0, k)))[:, k:k + H] for k in range(self.max_ngram + 1)]
    token = jnp.zeros((b,), jnp.int32)
    found = jnp.zeros((b,), bool)
    for n in range(1, self.max_ngram + 1):  # longer matches overwrite shorter ones
      # suffix dec[pos - n + 1 .. pos], all after BOS
      idx = pos[:, None] - n + 1 + jnp.arange(n)[None, :]  # [b, n]
      suffix = jnp.take_along_axis(dec, jnp.clip(idx, 0, T - 1), axis=1)
      suffix_ok = pos - n + 1 >= 1  # [b]
      match = jnp.ones((b, H), bool)
      for k in range(n):
        match &= shifted[k] == suffix[:, k:k + 1]
      cont = shifted[n]  # [b, H]
      enc_ok = in_enc & (h + n < L)
      for k in range(n + 1):
        enc_ok &= shifted[k] != 0  # no padding inside the window or as the continuation
      dec_ok = ~in_enc & (t >= 1) & (t + n <= pos[:, None])  # continuation already known
      match &= (enc_ok | dec_ok) & suffix_ok[:, None]
      last = H - 1 - jnp.argmax(match[:, ::-1], axis=1)  # most recent match
      has = jnp.any(match, axis=1)
      token = jnp.where(has, jnp.take_along_axis(cont, last[:, None], axis=1)[:, 0], token)
      found |= has
    return token, found

  def extend(self, cache, tokens, positions):
    """tokens [b, k] at positions [b].. -> (logits [b, k, V], cache)."""
    b, k = tokens.shape
    dec = cache['dec']
    T = dec.shape[1]
    pos = positions[:, None] + jnp.arange(k)[None, :]  # [b, k]
    write = jnp.where((pos >= 0) & (pos < T), pos, T)  # out of range -> dropped
    dec = dec.at[jnp.arange(b)[:, None], write].set(tokens, mode='drop')
    if self.fallback is None:
      base = jnp.zeros((b, k, self.vocab_size), jnp.float32)
      inner = cache['fallback']
    else:
      base, inner = self.fallback.extend(cache['fallback'], tokens, positions)
      base = base.astype(jnp.float32)
    outs = []
    for i in range(k):
      tok, found = self.propose(cache['enc'], dec, jnp.clip(pos[:, i], 0, T - 1))
      one_hot = jnp.where(jnp.arange(self.vocab_size)[None, :] == tok[:, None], 0.0, -1e9)
      outs.append(jnp.where(found[:, None], one_hot, base[:, i]))
    return jnp.stack(outs, axis=1), {'enc': cache['enc'], 'dec': dec, 'fallback': inner}
