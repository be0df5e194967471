"""What every decoding loop shares: its callbacks, state, prompt, emission, finish and counts.

The loops (chain.py: autoregressive and the speculative chain; static_tree.py and
dynamic_tree.py: draft trees) see only callbacks of the `ExtendFn` protocol (see
network.Transformer.extend), never modules or params, and count into a stats.DecodeStats.
This module holds the parts they have in common, so that each loop file is its step alone:
the loop state (`DecodeState`, `init_state`), a decoder prompt (`with_prompt`), appending
a step's tokens (`emit`; a tree step's whole end: `commit_tree_step`), a step's counters
(`count_step`; the paper's beta at its drafted positions: `beta`), the per-step keys
(`split_keys`) and the result (`finish`).

Sequence buffer convention: `seq [b, 2 + max_len + extra]` holds, per row, a pad at
index 0 (decoder position -1), BOS (0) at index 1 (position 0), then the generated tokens
y_0, y_1, ... from index 2. The decoder input at position t is seq[t + 1]. A row with n
generated tokens feeds seq[n + 1] (= y_{n-1}, or BOS) at position n next.

Caches roll back for free: the next call writes from the row's new n, and stale slots lie
beyond every query's position (masked by causality). Every call's writes fit the caches
sized by `cache_length`; a cache may record a call whose writes did not (rows.note_writes),
which the stats report (skipped_cache_writes).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple

import flax.struct
import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import rows, sampling
from specdec_t5x.algorithm.stats import DecodeStats
from specdec_t5x.algorithm.trees import structure


class ExtendFn(Protocol):
  """The callback the loops call: a model's cached decoder over k new tokens per row.

  Writes the tokens' keys/values at `positions[r] .. positions[r] + k - 1` of row r's
  cache (overwriting, so rolling back is calling again from an earlier position) and
  attends to every cached position up to each token's own.
  """

  def __call__(self, cache: Any, tokens: jax.Array,
               positions: jax.Array) -> Tuple[jax.Array, Any]:
    """cache, tokens [b, k] int32, positions [b] int32 (of each row's first token) ->
    (logits [b, k, V], the updated cache)."""


@flax.struct.dataclass
class DecodeState:
  """Loop state. Static sizes: b = batch, S = sequence buffer length."""
  seq: jax.Array  # [b, S] int32: pad, BOS, y_0, y_1, ...
  length: jax.Array  # [b] int32: tokens generated so far (EOS included)
  done: jax.Array  # [b] bool: emitted EOS or reached max_len
  rng: jax.Array  # [b, 2] uint32: one key per row
  target_cache: Any
  draft_cache: Any
  draft_behind: jax.Array  # [b] bool: the draft cache lacks position n - 1 (all accepted)
  alpha_hits: jax.Array  # [b] float32: decayed accepted drafts (running_alpha policy)
  alpha_tests: jax.Array  # [b] float32: decayed drafts tested (accepted or the rejected one)
  stats: DecodeStats  # the counters; generated_tokens is filled from `length` at the end
  # A draft that reads the target's features (feature_draft.py) only:
  features: Any = None  # [b, gamma + 1, E] float32: the target's, from the last verify call
  feature_start: Any = None  # [b] int32: the position of features[:, 0]


def cache_length(max_len: int, gamma: int = 0) -> int:
  """The decoder positions a cache must hold for a decode of max_len tokens drafting up to
  gamma per step (0: autoregressive): a row's verify call writes positions n .. n + gamma,
  and a finished row (n = max_len) keeps calling in place. The one place this is derived."""
  return max_len + gamma + 1


def init_state(batch: int, max_len: int, extra: int, rng, target_cache, draft_cache,
               gamma: int, feature_dim: Optional[int] = None) -> DecodeState:
  """The loop's first state: a sequence buffer with `extra` slots past max_len (a step's
  candidates), length histograms of gamma + 1 entries; with `feature_dim` (a
  feature-reading draft) zero features for the gamma + 1 positions of a verify window,
  "verified" at position -1 (before BOS)."""
  features = feature_start = None
  if feature_dim is not None:
    features = jnp.zeros((batch, gamma + 1, feature_dim), jnp.float32)
    feature_start = jnp.full((batch,), -1, jnp.int32)
  return DecodeState(
      seq=jnp.zeros((batch, 2 + max_len + extra), jnp.int32),
      length=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), bool),
      rng=jax.random.split(rng, batch),
      target_cache=target_cache, draft_cache=draft_cache,
      draft_behind=jnp.zeros((batch,), bool),
      alpha_hits=jnp.ones((batch,), jnp.float32),
      alpha_tests=jnp.full((batch,), 2.0, jnp.float32),
      stats=DecodeStats(
          target_calls=jnp.zeros((batch,), jnp.int32),
          drafted_tokens=jnp.zeros((batch,), jnp.int32),
          accepted_tokens=jnp.zeros((batch,), jnp.int32),
          generated_tokens=jnp.zeros((batch,), jnp.int32),
          beta_positions=jnp.zeros((batch,), jnp.int32),
          beta_sum=jnp.zeros((batch,), jnp.float32),
          accepted_length_histogram=jnp.zeros((gamma + 1,), jnp.int32),
          draft_length_histogram=jnp.zeros((gamma + 1,), jnp.int32),
          nonfinite_target_logits=jnp.zeros((batch,), bool),
          nonfinite_draft_logits=jnp.zeros((batch,), bool),
          skipped_cache_writes=jnp.zeros((batch,), bool),
          step_outcomes=jnp.zeros((3,), jnp.int32),
          accepted_by_source=jnp.zeros((3,), jnp.int32)),
      features=features, feature_start=feature_start)


def with_prompt(state: DecodeState, prompt, max_len: int, target_fn: ExtendFn,
                draft_fn: Optional[ExtendFn]) -> DecodeState:
  """Starts each row after its decoder prompt: the leading non-zero tokens of `prompt`
  [b, P] become its first tokens, and one call per model writes BOS and them into the
  caches (beyond a row's prompt it writes slots that are rewritten before being read).
  A feature-reading draft reads the target's features of that call (zeros before BOS),
  and the state keeps the one before each row's next position."""
  p = prompt.shape[1]
  if p == 0:
    return state
  seq = state.seq.at[:, 2:2 + p].set(prompt.astype(jnp.int32))
  length = jnp.minimum(jnp.sum(prompt != 0, axis=1), max_len).astype(jnp.int32)  # [b]
  fed, start = seq[:, 1:1 + p], jnp.zeros_like(length)  # BOS, prompt[:, :-1] at 0..P-1
  out = target_fn(state.target_cache, fed, start)
  target_cache, draft_cache = out[1], state.draft_cache
  if state.features is not None:
    width = state.features.shape[1]
    before = jnp.pad(out[2], ((0, 0), (1, width), (0, 0)))  # before[t]: the feature at t - 1
    draft_cache = draft_fn(draft_cache, fed, start, before[:, :p])[1]
    state = state.replace(features=rows.window(before, length, width), feature_start=length - 1)
  elif draft_fn is not None:
    draft_cache = draft_fn(draft_cache, fed, start)[1]
  return state.replace(seq=seq, length=length, done=length >= max_len,
                       target_cache=target_cache, draft_cache=draft_cache)


def emit(state: DecodeState, candidates, num_new, max_len: int, eos_id: int) -> DecodeState:
  """Appends up to `num_new` [b] tokens of `candidates` [b, w] to each active row.

  Tokens after the first EOS are dropped; finished rows are left untouched.
  """
  w = candidates.shape[1]
  idx = jnp.arange(w)[None, :]
  is_eos = (candidates == eos_id) & (idx < num_new[:, None])
  first_eos = jnp.argmax(is_eos, axis=1)
  has_eos = jnp.any(is_eos, axis=1)
  count = jnp.where(has_eos, jnp.minimum(num_new, first_eos + 1), num_new)
  count = jnp.where(state.done, 0, count)
  old = rows.window(state.seq, state.length + 2, w)
  new = jnp.where(idx < count[:, None], candidates, old)
  seq = rows.update(state.seq, new, state.length + 2)
  length = state.length + count
  done = state.done | (has_eos & ~state.done) | (length >= max_len)
  return state.replace(seq=seq, length=length, done=done)


def finish(state: DecodeState, max_len: int, prompt) -> Tuple[jax.Array, DecodeStats]:
  """-> tokens [b, max_len] without BOS (prompt first), zeros after the first EOS, and
  the DecodeStats (generated_tokens: the tokens after the prompt; skipped_cache_writes:
  a call's writes were dropped from a cache, which drops them for every row).

  `generate` raises when a nonfinite_* or skipped_cache_writes flag is set rather than
  return such rows.
  """
  tokens = state.seq[:, 2:2 + max_len]
  tokens = jnp.where(jnp.arange(max_len)[None, :] < state.length[:, None], tokens, 0)
  generated = state.length
  if prompt is not None:
    generated = generated - jnp.minimum(jnp.sum(prompt != 0, axis=1), max_len).astype(jnp.int32)
  # every row's writes
  skipped = rows.writes_skipped(state.target_cache) | rows.writes_skipped(state.draft_cache)
  return tokens, state.stats.replace(
      generated_tokens=generated,
      skipped_cache_writes=state.stats.skipped_cache_writes | skipped)


def split_keys(rng, num: int, cfg: sampling.Settings):
  """rng [b, 2] -> (next rng [b, 2], keys [b, num, 2]); greedy decoding uses no randomness."""
  if cfg.greedy:
    return rng, None
  keys = jax.vmap(lambda k: jax.random.split(k, num + 1))(rng)
  return keys[:, 0], keys[:, 1:]


def beta(xs, q, target, measured, greedy: bool):
  """beta = sum_x min(p(x), q(x)) at k drafted positions -> (beta [b, k] float32 where
  `measured` [b, k], else 0; measured). Greedy: xs [b, k] the draft's argmaxes and
  `target` [b, >= k] the target's (beta: they agree); else q [b, k, V] the draft's
  distributions and `target` [b, >= k, V] the target's p after the same prefixes."""
  k = measured.shape[1]
  if greedy:
    overlap = (xs == target[:, :k]).astype(jnp.float32)
  else:
    overlap = jnp.sum(jnp.minimum(target[:, :k], q), axis=-1)
  return jnp.where(measured, overlap, 0.0), measured


def count_step(st: DecodeStats, active, *, drafted, accepted, draft_length, outcome, tested,
               bad, draft_bad, betas, by_source=None) -> DecodeStats:
  """The counters after one speculative step, for the active rows [b]: one target call,
  `drafted` candidates and `accepted` of them, `betas` (`beta`'s pair: the overlaps and
  where they were measured, [b, k] each), the histograms of `accepted` and of
  `draft_length` (each as wide as the stats' own), the step's `outcome` (0: nothing
  accepted, 1: some, 2: all; counted where `tested`), the accepted tokens by source
  (`by_source` [b, 3], stats.SOURCES; None: all from the draft's chain) and the nonfinite
  flags."""
  act = active.astype(jnp.int32)
  width = st.accepted_length_histogram.shape[0]
  hist = lambda x: jnp.sum(jax.nn.one_hot(x, width, dtype=jnp.int32) * act[:, None], axis=0)
  if by_source is None:
    by_source = jax.nn.one_hot(jnp.zeros_like(accepted), 3, dtype=jnp.int32) * accepted[:, None]
  return st.replace(
      accepted_by_source=st.accepted_by_source + jnp.sum(by_source * act[:, None], axis=0),
      step_outcomes=st.step_outcomes + jnp.sum(jax.nn.one_hot(outcome, 3, dtype=jnp.int32)
                                               * (act * tested)[:, None], axis=0),
      target_calls=st.target_calls + act, drafted_tokens=st.drafted_tokens + drafted * act,
      accepted_tokens=st.accepted_tokens + accepted * act,
      beta_positions=st.beta_positions + jnp.sum(betas[1], axis=1, dtype=jnp.int32) * act,
      beta_sum=st.beta_sum + jnp.sum(betas[0], axis=1) * act,
      accepted_length_histogram=st.accepted_length_histogram + hist(accepted),
      draft_length_histogram=st.draft_length_histogram + hist(draft_length),
      nonfinite_target_logits=st.nonfinite_target_logits | (bad & active),
      nonfinite_draft_logits=st.nonfinite_draft_logits | (draft_bad & active))


def commit_tree_step(s: DecodeState, tokens, parents, valid, path, n_acc, token, node_depth,
                     node_kind, *, betas, bad, draft_bad, target_cache, draft_cache, rng,
                     max_len: int, eos_id: int, features=None) -> DecodeState:
  """A tree step's end, once its path is accepted: tokens, parents and valid [b, N]
  (trees/structure.py's layout, the root's first), path [b, D + 1] and n_acc [b]
  (trees/accept.py's), token [b] (the correction or bonus), node_depth [N] or [b, N] and
  node_kind [N] (stats.SOURCES) of every node, `betas` (count_step's), the rows' nonfinite
  flags bad, draft_bad [b]. The target's cache is compacted to the path, the path's tokens
  and `token` are emitted and the step counted (verified: the valid nodes; draft length:
  the tree's valid depth). `features` [b, N, F]: the target's at every node, for a
  feature-reading draft; the state keeps them along the path (what a chain call over the
  path gives), for the next step's first head call."""
  batch, depth_max = tokens.shape[0], path.shape[1] - 1
  if features is not None:  # [b, D + 1, F]
    s = s.replace(features=jnp.take_along_axis(features, path[:, :, None], axis=1),
                  feature_start=s.length)
  active = ~s.done
  target_cache = structure.compact(target_cache, s.length, path)
  accepted = jnp.take_along_axis(tokens, path[:, 1:], axis=1)  # [b, D]
  candidates = jnp.concatenate([accepted, jnp.zeros((batch, 1), jnp.int32)], 1)
  candidates = jnp.where(jnp.arange(depth_max + 1)[None, :] == n_acc[:, None],
                         token[:, None], candidates)  # [b, D + 1]
  end = jnp.take_along_axis(path, n_acc[:, None], axis=1)  # [b, 1] the last accepted node
  leaf = ~jnp.any(valid & (parents == end), axis=1)
  verified = jnp.sum(valid[:, 1:], axis=1).astype(jnp.int32)  # candidates tested at most
  depth = jnp.max(jnp.where(valid, jnp.broadcast_to(node_depth, valid.shape), 0),
                  axis=1)  # [b] the tree's depth
  # [b, 3] the accepted path's nodes by what proposed them (stats.SOURCES)
  on_path = jnp.arange(1, depth_max + 1)[None, :] <= n_acc[:, None]  # [b, D]
  kinds = jnp.take(node_kind, path[:, 1:])  # [b, D]
  by_source = jnp.sum(jax.nn.one_hot(kinds, 3, dtype=jnp.int32) * on_path[:, :, None], axis=1)
  st = count_step(s.stats, active, drafted=verified, accepted=n_acc, draft_length=depth,
                  outcome=jnp.where(leaf, 2, jnp.minimum(n_acc, 1)), tested=verified > 0,
                  bad=bad, draft_bad=draft_bad, betas=betas, by_source=by_source)
  s = s.replace(rng=rng, target_cache=target_cache, draft_cache=draft_cache, stats=st)
  return emit(s, candidates, n_acc + 1, max_len, eos_id)
