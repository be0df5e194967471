"""How a speculative step drafts: the draft's calls and the sampling of each proposal.

chain.speculative_decode takes a drafter's first call and its `step`, and drafts with
them either unrolled (fixed gamma) or in a while loop (adaptive gamma policies). A token
draft (a model or n-gram table: token_drafter) re-feeds the last verified tokens; a
feature-reading head (feature_draft.py: feature_drafter) re-feeds the last verify
window with the target's features. `s` is the loop's DecodeState.

A draft may have logits over a reduced draft vocabulary (a draft_vocab.DraftVocabulary:
EAGLE-3's commonest ids): it then drafts, and keeps its distributions, over those ids only,
and the loop widens the distributions to the whole vocabulary once per step, for the
verifier (`draft_vocab.full_distributions`; every other id has probability 0, so the rule
is unchanged).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import rows, sampling
from specdec_t5x.algorithm.draft_vocab import DraftVocabulary


def law(logits, cfg: sampling.Settings, vocab: Optional[DraftVocabulary] = None):
  """logits [b, V] (or [b, Vd] over `vocab`'s columns) -> (the draft's argmax id [b] when
  greedy, else None; its sampling distribution over the logits' columns [b, V or Vd] when
  not greedy, else None; nonfinite [b]: the logits hold a NaN or an infinity). Top-k
  larger than the draft vocabulary keeps all of it."""
  if cfg.greedy:
    token, bad = sampling.argmax_checked(logits)
    if vocab is not None:
      token = jnp.asarray(vocab.ids)[token]
    return token, None, bad
  if cfg.topk > logits.shape[-1]:
    cfg = dataclasses.replace(cfg, topk=logits.shape[-1])
  probs, bad = sampling.standardize_checked(logits, cfg)
  return None, probs, bad


def propose(logits, keys, i, cfg: sampling.Settings,
            vocab: Optional[DraftVocabulary] = None):
  """logits [b, V] (or [b, Vd] over `vocab`'s columns) -> (token id [b]: the argmax, or
  drawn with key i of `keys` [b, k, 2]; then `law`'s distribution and nonfinite flags)."""
  token, probs, bad = law(logits, cfg, vocab)
  if token is None:
    key = jax.lax.dynamic_index_in_dim(keys, i, axis=1, keepdims=False)
    token = sampling.sample(key, probs)
    if vocab is not None:
      token = jnp.asarray(vocab.ids)[token]
  return token, probs, bad


def confidence(logits, q):
  """[b, V] -> [b] max probability of the draft's next-token distribution."""
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1) if q is None else q
  return jnp.max(probs, axis=-1)


def token_drafter(draft_fn, s, catch_up_when_behind: bool):
  """A token draft's calls: (logits [b, V] for position n, carry), and step(carry, x [b],
  position [b]) -> (logits [b, V], carry); the carry is the draft cache.

  The first call re-feeds y_{n-2} at n - 1 with y_{n-1} at n (the 2-token catch-up of a
  fully accepted block, whose last draft was never fed): always, or with
  `catch_up_when_behind` only when a row is behind (a lax.cond; else y_{n-1} alone).
  """
  def catch_up(_):
    logits, cache = draft_fn(s.draft_cache, rows.window(s.seq, s.length, 2), s.length - 1)
    return logits[:, 1], cache

  def plain(_):
    logits, cache = draft_fn(s.draft_cache, rows.window(s.seq, s.length + 1, 1), s.length)
    return logits[:, 0], cache

  def step(cache, x, position):
    logits, cache = draft_fn(cache, x[:, None], position)
    return logits[:, 0], cache

  if catch_up_when_behind:
    first = jax.lax.cond(jnp.any(s.draft_behind & ~s.done), catch_up, plain, None)
  else:
    first = catch_up(None)
  return first, step


def feature_pick(s):
  """[b] where the row's last token y_{n-1} sits in the window feature_drafter re-feeds
  (its input there reads the target's feature s.features[:, pick])."""
  return jnp.clip(s.length - s.feature_start - 1, 0, s.features.shape[1] - 1)


def feature_drafter(draft_fn, s):
  """A feature-reading draft's calls (as token_drafter's; the carry is (cache, the
  head's predicted feature [b, 1, E])).

  The first call re-feeds the last verify window, positions f + 1 .. f + gamma + 1 for
  f = feature_start, with the target's features at f .. f + gamma: the accepted prefix
  becomes the head's context, and the output at position n (the row's next) is kept.
  Later calls feed a drafted token with the head's own prediction of the feature before it.
  A finished row (its output ignored) re-feeds one position earlier: its window would end
  at max_len + gamma + 1, one past the caches (which hold the verify windows' positions), and
  a window that does not fit skips every row's cache writes (rows.update_all).
  """
  width = s.features.shape[1]
  pick = feature_pick(s)
  start = s.feature_start + 1 - s.done.astype(jnp.int32)  # [b]
  logits, cache, predicted = draft_fn(s.draft_cache, rows.window(s.seq, start + 1, width),
                                      start, s.features, pick)

  def step(carry, x, position):
    logits, cache, predicted = draft_fn(carry[0], x[:, None], position, carry[1])
    return logits[:, 0], (cache, predicted)

  return (logits[:, 0], (cache, predicted)), step


def draft_block(first, step, s, keys, num_steps, limit, gamma: int,
                 cfg: sampling.Settings, threshold: Optional[float] = None,
                 vocab: Optional[DraftVocabulary] = None):
  """Drafts up to `num_steps` (<= gamma, traced) tokens per row.

  `first` = (logits [b, V] for position n, carry) and `step` come from a drafter
  (token_drafter, feature_drafter). `limit` [b]: drafts that can count for each row.
  With `threshold`, a row stops once the draft's confidence for its next position falls
  below it (its first draft always counts), and the loop ends when no row with room goes on.

  Returns (x [b, gamma], q [b, gamma, V] (Vd over `vocab`'s columns) or None when
  greedy, carry, steps: the loop's
  draft calls after the first (x_steps was never fed to the draft), count [b]: drafts
  made for each row before it stopped, bad [b]: a draft call gave NaN/inf logits).
  """
  logits, carry = first
  x1, q1, bad = propose(logits, keys, 0, cfg, vocab)
  xs = jnp.zeros((x1.shape[0], gamma), jnp.int32).at[:, 0].set(x1)
  qs = None if q1 is None else jnp.zeros(q1.shape[:1] + (gamma,) + q1.shape[1:]).at[:, 0].set(q1)
  going = jnp.ones(x1.shape, bool)  # [b]
  count = jnp.ones(x1.shape, jnp.int32)  # [b]

  def body(loop):
    i, xs, qs, carry, going, count, bad = loop
    x_prev = jax.lax.dynamic_index_in_dim(xs, i - 1, axis=1, keepdims=False)  # [b]
    logits, carry = step(carry, x_prev, s.length + i)
    x, q, bad_i = propose(logits, keys, i, cfg, vocab)
    bad = bad | bad_i
    xs = jax.lax.dynamic_update_index_in_dim(xs, x, i, axis=1)
    if qs is not None:
      qs = jax.lax.dynamic_update_index_in_dim(qs, q, i, axis=1)
    if threshold is not None:  # decided from q_{i+1} alone, before looking at x_{i+1}
      going = going & (confidence(logits, q) >= threshold)
      count = jnp.where(going, i + 1, count)
    return i + 1, xs, qs, carry, going, count, bad

  def cond(c):
    i, going = c[0], c[4]
    more = i < num_steps
    if threshold is not None:
      more &= jnp.any(going & (i < limit))
    return more

  steps, xs, qs, carry, _, count, bad = jax.lax.while_loop(
      cond, body, (jnp.int32(1), xs, qs, carry, going, count, bad))
  if threshold is None:
    count = jnp.full(x1.shape, num_steps, jnp.int32)
  return xs, qs, carry, steps, count, bad


def draft_unrolled(first, step, s, keys, num_steps, gamma: int,
                    cfg: sampling.Settings, vocab: Optional[DraftVocabulary] = None,
                    with_logits: bool = False):
  """`draft_block` for the fixed policy: gamma draft calls unrolled, no loop or branch.

  With a token draft the first call always re-feeds y_{n-2} at n - 1 with y_{n-1} at n
  (a no-op rewrite of a filled slot unless the last block was fully accepted; at n = 0 it
  writes the masked slot of position -1), so the draft cache never falls behind. Near
  max_len the calls past `num_steps` draft tokens that `limit` never lets count.
  `with_logits`: also return the draft's logits at each depth, [b, gamma, V] (a tree reads
  the draft's runner-up tokens from them).
  """
  logits, carry = first
  xs, qs, seen, bad = [], [], [], jnp.zeros(logits.shape[:1], bool)
  for i in range(gamma):
    if i:
      logits, carry = step(carry, xs[-1], s.length + i)
    x, q, bad_i = propose(logits, keys, i, cfg, vocab)
    bad = bad | bad_i
    xs.append(x)
    qs.append(q)
    seen.append(logits)
  count = jnp.full(xs[0].shape, num_steps, jnp.int32)
  qs = None if qs[0] is None else jnp.stack(qs, axis=1)
  out = (jnp.stack(xs, axis=1), qs, carry, jnp.int32(gamma), count, bad)
  return out + (jnp.stack(seen, axis=1),) if with_logits else out
