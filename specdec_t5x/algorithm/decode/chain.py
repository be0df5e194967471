"""The jit-compiled chain loops: autoregressive baseline and speculative decoding.

The loops see only callbacks of the `ExtendFn` protocol (core.py, see
network.Transformer.extend), never modules or params, and take their settings as one
config.DecodeConfig; they count into a stats.DecodeStats. Their state, the sequence
buffer (`seq [b, 2 + max_len + gamma + 1]` here), prompt handling, emission and finish
are core.py's, shared with the tree loops.

Speculative step (Algorithm 1 of Leviathan et al., ICML 2023), per row with n tokens so far:
  draft:  single-token calls give q_1..q_g; x_i ~ q_i. When the previous block was fully
          accepted, its last draft x_g was never fed to the draft, so the first call takes
          2 tokens (seq[n], seq[n+1]) at positions (n-1, n) instead (a lax.cond). With the
          fixed gamma policy the gamma calls are unrolled and the first always takes the
          2 tokens (no loop, no branch).
  verify: ONE target call on (y_{n-1}, x_1..x_gamma) at positions n..n+gamma: p_1..p_{gamma+1}.
  accept: n_acc leading drafts, then one token from the residual or the bonus p.
Caches roll back for free: the next call writes from the row's new n (core.py).

A draft head that reads the target (feature_draft.py; `feature_dim`) drafts differently
(drafting.feature_drafter): its first call re-feeds the last verify window with the
target's features from that call, so each row's accepted prefix becomes its context with
no rollback code; the verify call and the acceptance rule are the same for every draft.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import rows, sampling
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.decode.core import (DecodeState, ExtendFn, beta, count_step, emit,
                                               finish, init_state, split_keys, with_prompt)
from specdec_t5x.algorithm.decode.drafting import (draft_block, draft_unrolled,
                                                   feature_drafter, propose, token_drafter)
from specdec_t5x.algorithm.draft_vocab import DraftVocabulary, full_distributions
from specdec_t5x.algorithm.stats import DecodeStats


def autoregressive_decode(target_fn: ExtendFn, target_cache, rng, *, batch: int, max_len: int,
                          config: DecodeConfig, eos_id: int, prompt=None,
                          settings: Optional[sampling.Sampling] = None
                          ) -> Tuple[jax.Array, DecodeStats]:
  """Baseline: one target call per token, sampled as `config.sampling` says (gamma and
  the verifier settings are unused), or as `settings` (its values traced: api's compiled
  programs). `prompt` [b, P] (optional): each row's decoder prompt, its leading non-zero
  tokens. Returns (tokens [b, max_len], stats)."""
  cfg = settings or config.sampling
  state = init_state(batch, max_len, 1, rng, target_cache, None, 0)
  if prompt is not None:
    state = with_prompt(state, prompt, max_len, target_fn, None)

  def body(s: DecodeState):
    rng, keys = split_keys(s.rng, 1, cfg)
    last = rows.window(s.seq, s.length + 1, 1)  # [b, 1]
    logits, cache = target_fn(s.target_cache, last, s.length)
    token, _, bad = propose(logits[:, 0], keys, 0, cfg)
    stats = s.stats.replace(
        target_calls=s.stats.target_calls + (~s.done).astype(jnp.int32),
        nonfinite_target_logits=s.stats.nonfinite_target_logits | (bad & ~s.done))
    s = s.replace(rng=rng, target_cache=cache, stats=stats)
    return emit(s, token[:, None], jnp.ones((batch,), jnp.int32), max_len, eos_id)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return finish(state, max_len, prompt)


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

  `draft_vocab` (draft_vocab.DraftVocabulary): draft_fn's logits cover these ids only (a
  reduced draft vocabulary); the draft samples over them, and its distributions are widened
  to the whole vocabulary once per step, before the verifier reads them.
  """
  gamma, cfg, policy = config.gamma, settings or config.sampling, config.gamma_policy
  lenience, verifier = config.lenience, config.verifier
  state = init_state(batch, max_len, gamma + 1, rng, target_cache, draft_cache, gamma,
                     feature_dim)
  if prompt is not None:
    state = with_prompt(state, prompt, max_len, target_fn, draft_fn)

  def body(s: DecodeState):
    rng, keys = split_keys(s.rng, gamma + 2, cfg)  # gamma drafts, uniforms, correction
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

    # The drafts tested: the accepted ones and the first rejected one (their prefixes are the
    # output's), where beta is measured and the running_alpha policy counts its tests.
    tested = jnp.minimum(n_acc + 1, num_drafted)  # [b]
    measured = jnp.arange(gamma)[None, :] < tested[:, None]
    betas = beta(xs, qs, best if cfg.greedy else p, measured, cfg.greedy)
    candidates = jnp.concatenate([xs, jnp.zeros((batch, 1), jnp.int32)], 1)
    candidates = jnp.where(jnp.arange(gamma + 1)[None, :] == n_acc[:, None],
                           token[:, None], candidates)  # [b, gamma + 1]
    outcome = jnp.where(n_acc == num_drafted, 2, jnp.minimum(n_acc, 1))  # [b]: the branch
    st = count_step(s.stats, active, drafted=num_drafted, accepted=n_acc,
                    draft_length=num_drafted, outcome=outcome, tested=num_drafted > 0, bad=bad,
                    draft_bad=draft_bad, betas=betas)
    s = s.replace(
        rng=rng, target_cache=target_cache, draft_cache=draft_cache,
        draft_behind=((n_acc == steps) & (num_steps > 0) & (policy.kind != 'fixed')
                      & (feature_dim is None)),
        alpha_hits=jnp.where(active, policy.decay * s.alpha_hits + n_acc, s.alpha_hits),
        alpha_tests=jnp.where(active, policy.decay * s.alpha_tests + tested, s.alpha_tests),
        stats=st)
    return emit(s, candidates, n_acc + 1, max_len, eos_id)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return finish(state, max_len, prompt)
