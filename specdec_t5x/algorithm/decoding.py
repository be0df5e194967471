"""The jit-compiled decoding loops: autoregressive baseline and speculative decoding.

The loops see only callbacks of the `ExtendFn` protocol (see network.Transformer.extend),
never modules or params, and take their settings as one config.DecodeConfig; they count
into a stats.DecodeStats.

Sequence buffer convention: `seq [b, 2 + max_len + gamma + 1]` holds, per row, a pad at
index 0 (decoder position -1), BOS (0) at index 1 (position 0), then the generated tokens
y_0, y_1, ... from index 2. The decoder input at position t is seq[t + 1]. A row with n
generated tokens feeds seq[n + 1] (= y_{n-1}, or BOS) at position n next.

Speculative step (Algorithm 1 of Leviathan et al., ICML 2023), per row with n tokens so far:
  draft:  single-token calls give q_1..q_g; x_i ~ q_i. When the previous block was fully
          accepted, its last draft x_g was never fed to the draft, so the first call takes
          2 tokens (seq[n], seq[n+1]) at positions (n-1, n) instead (a lax.cond). With the
          fixed gamma policy the gamma calls are unrolled and the first always takes the
          2 tokens (no loop, no branch).
  verify: ONE target call on (y_{n-1}, x_1..x_gamma) at positions n..n+gamma: p_1..p_{gamma+1}.
  accept: n_acc leading drafts, then one token from the residual or the bonus p.
Caches roll back for free: the next call writes from the row's new n, and stale slots lie
beyond every query's position (masked by causality). Every call's writes fit the caches
sized by `cache_length`; a cache may record a call whose writes did not (a dict's
SKIPPED entry, layers.note_writes), which the stats report (skipped_cache_writes).

A draft head that reads the target (feature_draft.py; `feature_dim`) drafts differently
(drafting.feature_drafter): its first call re-feeds the last verify window with the
target's features from that call, so each row's accepted prefix becomes its context with
no rollback code; the verify call and the acceptance rule are the same for every draft.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Tuple

import flax.struct
import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import config as config_lib
from specdec_t5x.algorithm import rows, sampling
from specdec_t5x.algorithm.drafting import (DraftVocabulary, draft_block, draft_unrolled,
                                            feature_drafter, full_distributions, propose,
                                            token_drafter)
from specdec_t5x.algorithm.layers import SKIPPED
from specdec_t5x.algorithm.stats import DecodeStats

# Re-exported: the policy type lives with the decode configuration.
GammaPolicy = config_lib.GammaPolicy
GAMMA_POLICIES = config_lib.GAMMA_POLICIES
DecodeConfig = config_lib.DecodeConfig


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


def _skipped(cache) -> jax.Array:
  """Scalar bool: `cache` records a call whose writes did not fit (layers.note_writes);
  caches that record nothing (test stubs, other models) never do."""
  if isinstance(cache, dict) and SKIPPED in cache:
    return cache[SKIPPED]
  return jnp.zeros((), bool)


def _init_state(batch, max_len, extra, rng, target_cache, draft_cache, gamma,
                feature_dim: Optional[int] = None):
  """The loop's first state; with `feature_dim` (a feature-reading draft) zero features
  for the gamma + 1 positions of a verify window, "verified" at position -1 (before BOS)."""
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
          accepted_length_histogram=jnp.zeros((gamma + 1,), jnp.int32),
          draft_length_histogram=jnp.zeros((gamma + 1,), jnp.int32),
          nonfinite_target_logits=jnp.zeros((batch,), bool),
          nonfinite_draft_logits=jnp.zeros((batch,), bool),
          skipped_cache_writes=jnp.zeros((batch,), bool),
          step_outcomes=jnp.zeros((3,), jnp.int32),
          accepted_by_source=jnp.zeros((3,), jnp.int32)),
      features=features, feature_start=feature_start)


def _with_prompt(state: DecodeState, prompt, max_len: int, target_fn: ExtendFn,
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


def _emit(state: DecodeState, candidates, num_new, max_len: int, eos_id: int):
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


def _finish(state: DecodeState, max_len: int, prompt) -> Tuple[jax.Array, DecodeStats]:
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
  skipped = _skipped(state.target_cache) | _skipped(state.draft_cache)  # every row's writes
  return tokens, state.stats.replace(
      generated_tokens=generated,
      skipped_cache_writes=state.stats.skipped_cache_writes | skipped)


def _split_keys(rng, num: int, cfg: sampling.Settings):
  """rng [b, 2] -> (next rng [b, 2], keys [b, num, 2]); greedy decoding uses no randomness."""
  if cfg.greedy:
    return rng, None
  keys = jax.vmap(lambda k: jax.random.split(k, num + 1))(rng)
  return keys[:, 0], keys[:, 1:]


def count_step(st: DecodeStats, active, *, drafted, accepted, draft_length, outcome, tested,
               bad, draft_bad, by_source=None) -> DecodeStats:
  """The counters after one speculative step, for the active rows [b]: one target call,
  `drafted` candidates and `accepted` of them, the histograms of `accepted` and of
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
      accepted_length_histogram=st.accepted_length_histogram + hist(accepted),
      draft_length_histogram=st.draft_length_histogram + hist(draft_length),
      nonfinite_target_logits=st.nonfinite_target_logits | (bad & active),
      nonfinite_draft_logits=st.nonfinite_draft_logits | (draft_bad & active))


def autoregressive_decode(target_fn: ExtendFn, target_cache, rng, *, batch: int, max_len: int,
                          config: DecodeConfig, eos_id: int, prompt=None,
                          settings: Optional[sampling.Sampling] = None
                          ) -> Tuple[jax.Array, DecodeStats]:
  """Baseline: one target call per token, sampled as `config.sampling` says (gamma and
  the verifier settings are unused), or as `settings` (its values traced: api's compiled
  programs). `prompt` [b, P] (optional): each row's decoder prompt, its leading non-zero
  tokens. Returns (tokens [b, max_len], stats)."""
  cfg = settings or config.sampling
  state = _init_state(batch, max_len, 1, rng, target_cache, None, 0)
  if prompt is not None:
    state = _with_prompt(state, prompt, max_len, target_fn, None)

  def body(s: DecodeState):
    rng, keys = _split_keys(s.rng, 1, cfg)
    last = rows.window(s.seq, s.length + 1, 1)  # [b, 1]
    logits, cache = target_fn(s.target_cache, last, s.length)
    token, _, bad = propose(logits[:, 0], keys, 0, cfg)
    stats = s.stats.replace(
        target_calls=s.stats.target_calls + (~s.done).astype(jnp.int32),
        nonfinite_target_logits=s.stats.nonfinite_target_logits | (bad & ~s.done))
    s = s.replace(rng=rng, target_cache=cache, stats=stats)
    return _emit(s, token[:, None], jnp.ones((batch,), jnp.int32), max_len, eos_id)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_len, prompt)


def _running_alpha_gamma(hits, tests, gamma: int, cost_ratio: float):
  """[b] running acceptance counts -> [b] int32 gamma in 1..gamma maximising theory's gain."""
  alpha = jnp.clip(hits / jnp.maximum(tests, 1e-6), 0.0, 0.999)[:, None]  # [b, 1]
  g = jnp.arange(1, gamma + 1, dtype=jnp.float32)[None, :]  # [1, gamma]
  gain = (1.0 - alpha ** (g + 1)) / ((1.0 - alpha) * (g * cost_ratio + 1.0))
  return (jnp.argmax(gain, axis=1) + 1).astype(jnp.int32)


def speculative_decode(target_fn: ExtendFn, draft_fn: ExtendFn, target_cache, draft_cache, rng,
                       *, batch: int, max_len: int, config: DecodeConfig,
                       eos_id: int, prompt=None, feature_dim: Optional[int] = None,
                       draft_vocab: Optional[DraftVocabulary] = None,
                       settings: Optional[sampling.Sampling] = None
                       ) -> Tuple[jax.Array, DecodeStats]:
  """Algorithm 1 inside one `lax.while_loop`. Returns (tokens [b, max_len], stats).

  `config`: an integer gamma (the static maximum draft length), the sampling settings,
  the verifier ('token': the paper's rule; 'block': Sun et al., 2025; both exact),
  lenience (token-wise rule only) and the gamma policy (how many of the at most gamma
  drafts each row makes per step). `prompt`: as in autoregressive_decode (the step is
  unchanged after it, so exactness carries: the target's distribution given the prompt).

  `feature_dim` E (a draft that reads the target's features, feature_draft.py): then
  target_fn also returns the target's features [b, k, E] (network's extend with
  return_features) and draft_fn is the head's extend (cache, tokens, positions, features
  [b, k, E], pick=None) -> (logits, cache, predicted features); see feature_drafter.
  Only what the draft proposes changes: the verify call and the rule are the same.
  `settings`: the sampling settings bound to run-time values (as autoregressive_decode).

  `draft_vocab` (drafting.DraftVocabulary): draft_fn's logits cover these ids only (a
  reduced draft vocabulary); the draft samples over them, and its distributions are widened
  to the whole vocabulary once per step, before the verifier reads them.
  """
  gamma, cfg, policy = config.gamma, settings or config.sampling, config.gamma_policy
  lenience, verifier = config.lenience, config.verifier
  state = _init_state(batch, max_len, gamma + 1, rng, target_cache, draft_cache, gamma,
                      feature_dim)
  if prompt is not None:
    state = _with_prompt(state, prompt, max_len, target_fn, draft_fn)

  def body(s: DecodeState):
    rng, keys = _split_keys(s.rng, gamma + 2, cfg)  # gamma drafts, uniforms, correction
    active = ~s.done
    # Near the length limit fewer tokens are drafted: a row with r tokens left drafts r - 1.
    room = jnp.where(active, max_len - s.length - 1, 0)  # [b]
    if policy.kind == 'running_alpha':
      room = jnp.minimum(room, _running_alpha_gamma(s.alpha_hits, s.alpha_tests, gamma,
                                                    policy.cost_ratio))
    num_steps = jnp.clip(jnp.max(room), 0, gamma)
    limit = jnp.minimum(room, num_steps)  # [b]
    threshold = policy.threshold if policy.kind == 'confidence' else None
    if feature_dim is not None:
      first, step = feature_drafter(draft_fn, s)
    else:
      first, step = token_drafter(draft_fn, s, catch_up_when_behind=policy.kind != 'fixed')
    if policy.kind == 'fixed':
      xs, qs, carry, steps, count, draft_bad = draft_unrolled(
          first, step, s, keys, num_steps, gamma, cfg, draft_vocab)
    else:
      xs, qs, carry, steps, count, draft_bad = draft_block(
          first, step, s, keys, num_steps, limit, gamma, cfg, threshold, draft_vocab)
    draft_cache = carry if feature_dim is None else carry[0]
    num_drafted = jnp.minimum(limit, count)

    last = rows.window(s.seq, s.length + 1, 1)  # [b, 1]
    out = target_fn(s.target_cache, jnp.concatenate([last, xs], 1), s.length)
    logits, target_cache = out[:2]
    if feature_dim is not None:  # the next step's first draft call reads them
      s = s.replace(features=out[2], feature_start=s.length)
    if cfg.greedy:  # one-hot p and q: the same rule, without materialising them
      best, bad = sampling.argmax_checked(logits)  # [b, gamma + 1] each
      bad = jnp.any(bad, axis=1)
      n_acc = sampling.accept_greedy(xs, best, num_drafted)
      token = jnp.take_along_axis(best, n_acc[:, None], axis=1)[:, 0]
    else:
      p, bad = sampling.standardize_checked(logits, cfg)  # [b, gamma + 1, V], [b, gamma + 1]
      bad = jnp.any(bad, axis=1)
      uniforms = jax.vmap(lambda k: jax.random.uniform(k, (gamma,)))(keys[:, gamma])
      qs = full_distributions(qs, draft_vocab)  # [b, gamma, V]
      if verifier == 'block':
        n_acc, dist = sampling.accept_block(uniforms, xs, qs, p, num_drafted)
      else:
        n_acc = sampling.accept_tokenwise(uniforms, xs, qs, p, num_drafted, lenience)
        dist = sampling.correction_distribution(n_acc, num_drafted, qs, p, lenience)
      token = sampling.sample(keys[:, gamma + 1], dist)

    candidates = jnp.concatenate([xs, jnp.zeros((batch, 1), jnp.int32)], 1)
    candidates = jnp.where(jnp.arange(gamma + 1)[None, :] == n_acc[:, None],
                           token[:, None], candidates)  # [b, gamma + 1]
    outcome = jnp.where(n_acc == num_drafted, 2, jnp.minimum(n_acc, 1))  # [b]: the branch
    st = count_step(s.stats, active, drafted=num_drafted, accepted=n_acc,
                    draft_length=num_drafted, outcome=outcome, tested=num_drafted > 0, bad=bad,
                    draft_bad=draft_bad)
    s = s.replace(
        rng=rng, target_cache=target_cache, draft_cache=draft_cache,
        draft_behind=((n_acc == steps) & (num_steps > 0) & (policy.kind != 'fixed')
                      & (feature_dim is None)),
        alpha_hits=jnp.where(active, policy.decay * s.alpha_hits + n_acc, s.alpha_hits),
        alpha_tests=jnp.where(active, policy.decay * s.alpha_tests + jnp.minimum(
            n_acc + 1, num_drafted), s.alpha_tests),
        stats=st)
    return _emit(s, candidates, n_acc + 1, max_len, eos_id)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_len, prompt)
