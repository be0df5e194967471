"""The jit-compiled decoding loops: autoregressive baseline and speculative decoding.

The loops see only callbacks `extend_fn(cache, tokens [b, k], positions [b]) ->
(logits [b, k, V], cache)` (see network.Transformer.extend), never modules or params.

Sequence buffer convention: `seq [b, 2 + max_len + gamma + 1]` holds, per row, a pad at
index 0 (decoder position -1), BOS (0) at index 1 (position 0), then the generated tokens
y_0, y_1, ... from index 2. The decoder input at position t is seq[t + 1]. A row with n
generated tokens feeds seq[n + 1] (= y_{n-1}, or BOS) at position n next.

Speculative step (Algorithm 1 of shared/PAPER.md), per row with n tokens so far:
  draft:  one 2-token call on (seq[n], seq[n+1]) at positions (n-1, n) gives q_1 (the first
          token re-writes position n-1, which a fully accepted previous block left unwritten
          in the draft cache), then single-token calls give q_2..q_g; x_i ~ q_i.
  verify: ONE target call on (y_{n-1}, x_1..x_gamma) at positions n..n+gamma: p_1..p_{gamma+1}.
  accept: n_acc leading drafts, then one token from the residual or the bonus p.
Caches roll back for free: the next call writes from the row's new n, and stale slots lie
beyond every query's position (masked by causality).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp

from specdec_t5x import sampling

ExtendFn = Callable[[Any, jax.Array, jax.Array], tuple]


@flax.struct.dataclass
class DecodeState:
  """Loop state. Static sizes: b = batch, S = sequence buffer length."""
  seq: jax.Array  # [b, S] int32: pad, BOS, y_0, y_1, ...
  length: jax.Array  # [b] int32: tokens generated so far (EOS included)
  done: jax.Array  # [b] bool: emitted EOS or reached max_len
  rng: jax.Array  # [b, 2] uint32: one key per row
  target_cache: Any
  draft_cache: Any
  target_calls: jax.Array  # [b] int32: target calls while the row was decoding
  drafted: jax.Array  # [b] int32: draft tokens proposed to the row's verifier
  accepted: jax.Array  # [b] int32: draft tokens accepted
  histogram: jax.Array  # [gamma + 1] int32: steps with 0..gamma accepted drafts


def _init_state(batch, max_len, extra, rng, target_cache, draft_cache, gamma):
  return DecodeState(
      seq=jnp.zeros((batch, 2 + max_len + extra), jnp.int32),
      length=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), bool),
      rng=jax.random.split(rng, batch),
      target_cache=target_cache, draft_cache=draft_cache,
      target_calls=jnp.zeros((batch,), jnp.int32),
      drafted=jnp.zeros((batch,), jnp.int32),
      accepted=jnp.zeros((batch,), jnp.int32),
      histogram=jnp.zeros((gamma + 1,), jnp.int32))


def _row_window(x, start, size):
  """x [b, S], start [b] -> [b, size]: each row's slice x[r, start[r]:start[r]+size]."""
  return jax.vmap(lambda row, s: jax.lax.dynamic_slice(row, (s,), (size,)))(x, start)


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
  old = _row_window(state.seq, state.length + 2, w)
  new = jnp.where(idx < count[:, None], candidates, old)
  seq = jax.vmap(lambda row, u, s: jax.lax.dynamic_update_slice(row, u, (s,)))(
      state.seq, new, state.length + 2)
  length = state.length + count
  done = state.done | (has_eos & ~state.done) | (length >= max_len)
  return state.replace(seq=seq, length=length, done=done)


def _finish(state: DecodeState, max_len: int):
  """-> tokens [b, max_len] without BOS, zeros after the first EOS, and the stats dict."""
  tokens = state.seq[:, 2:2 + max_len]
  tokens = jnp.where(jnp.arange(max_len)[None, :] < state.length[:, None], tokens, 0)
  stats = {
      'target_calls': state.target_calls,
      'drafted_tokens': state.drafted,
      'accepted_tokens': state.accepted,
      'generated_tokens': state.length,
      'accepted_length_histogram': state.histogram,
  }
  return tokens, stats


def autoregressive_decode(target_fn: ExtendFn, target_cache, rng, *, batch: int, max_len: int,
                          cfg: sampling.SamplingConfig, eos_id: int):
  """Baseline: one target call per token. Returns (tokens [b, max_len], stats)."""
  state = _init_state(batch, max_len, 1, rng, target_cache, None, 0)

  def body(s: DecodeState):
    keys = jax.vmap(lambda k: jax.random.split(k, 2))(s.rng)  # [b, 2, 2]
    last = _row_window(s.seq, s.length + 1, 1)  # [b, 1]
    logits, cache = target_fn(s.target_cache, last, s.length)
    token = sampling.sample_or_argmax(keys[:, 1], sampling.standardize(logits[:, 0], cfg), cfg)
    calls = s.target_calls + (~s.done).astype(jnp.int32)
    s = s.replace(rng=keys[:, 0], target_cache=cache, target_calls=calls)
    return _emit(s, token[:, None], jnp.ones((batch,), jnp.int32), max_len, eos_id)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_len)


def _draft_block(draft_fn: ExtendFn, s: DecodeState, keys, num_steps, gamma: int,
                 cfg: sampling.SamplingConfig):
  """Draft `num_steps` (<= gamma, traced) tokens per row; -> (x [b, gamma], q [b, gamma, V], cache)."""
  first = _row_window(s.seq, s.length, 2)  # [b, 2]: y_{n-2}, y_{n-1}
  logits, cache = draft_fn(s.draft_cache, first, s.length - 1)
  q1 = sampling.standardize(logits[:, 1], cfg)  # [b, V]
  x1 = sampling.sample_or_argmax(keys[:, 0], q1, cfg)
  xs = jnp.zeros((x1.shape[0], gamma), jnp.int32).at[:, 0].set(x1)
  qs = jnp.zeros((x1.shape[0], gamma, q1.shape[-1]), jnp.float32).at[:, 0].set(q1)

  def body(carry):
    i, xs, qs, cache = carry
    x_prev = jax.lax.dynamic_index_in_dim(xs, i - 1, axis=1, keepdims=True)  # [b, 1]
    logits, cache = draft_fn(cache, x_prev, s.length + i)
    q = sampling.standardize(logits[:, 0], cfg)
    key = jax.lax.dynamic_index_in_dim(keys, i, axis=1, keepdims=False)
    x = sampling.sample_or_argmax(key, q, cfg)
    xs = jax.lax.dynamic_update_index_in_dim(xs, x, i, axis=1)
    qs = jax.lax.dynamic_update_index_in_dim(qs, q, i, axis=1)
    return i + 1, xs, qs, cache

  _, xs, qs, cache = jax.lax.while_loop(
      lambda c: c[0] < num_steps, body, (jnp.int32(1), xs, qs, cache))
  return xs, qs, cache


def speculative_decode(target_fn: ExtendFn, draft_fn: ExtendFn, target_cache, draft_cache, rng,
                       *, batch: int, max_len: int, gamma: int, cfg: sampling.SamplingConfig,
                       eos_id: int, lenience: float = 1.0):
  """Algorithm 1 inside one `lax.while_loop`. Returns (tokens [b, max_len], stats)."""
  state = _init_state(batch, max_len, gamma + 1, rng, target_cache, draft_cache, gamma)

  def body(s: DecodeState):
    keys = jax.vmap(lambda k: jax.random.split(k, gamma + 3))(s.rng)  # [b, gamma + 3, 2]
    active = ~s.done
    # Near the length limit fewer tokens are drafted: a row with r tokens left drafts r - 1.
    room = jnp.where(active, max_len - s.length - 1, 0)  # [b]
    num_steps = jnp.clip(jnp.max(room), 0, gamma)
    num_drafted = jnp.minimum(room, num_steps)
    xs, qs, draft_cache = _draft_block(draft_fn, s, keys[:, 1:], num_steps, gamma, cfg)

    last = _row_window(s.seq, s.length + 1, 1)  # [b, 1]
    logits, target_cache = target_fn(s.target_cache, jnp.concatenate([last, xs], 1), s.length)
    p = sampling.standardize(logits, cfg)  # [b, gamma + 1, V]

    uniforms = jax.vmap(lambda k: jax.random.uniform(k, (gamma,)))(keys[:, gamma + 1])
    n_acc = sampling.accept_tokenwise(uniforms, xs, qs, p, num_drafted, lenience)
    dist = sampling.correction_distribution(n_acc, num_drafted, qs, p, lenience)
    token = sampling.sample_or_argmax(keys[:, gamma + 2], dist, cfg)

    candidates = jnp.concatenate([xs, jnp.zeros((batch, 1), jnp.int32)], 1)
    candidates = jnp.where(jnp.arange(gamma + 1)[None, :] == n_acc[:, None],
                           token[:, None], candidates)  # [b, gamma + 1]
    act = active.astype(jnp.int32)
    s = s.replace(
        rng=keys[:, 0], target_cache=target_cache, draft_cache=draft_cache,
        target_calls=s.target_calls + act, drafted=s.drafted + num_drafted * act,
        accepted=s.accepted + n_acc * act,
        histogram=s.histogram + jnp.sum(jax.nn.one_hot(n_acc, gamma + 1, dtype=jnp.int32)
                                        * act[:, None], axis=0))
    return _emit(s, candidates, n_acc + 1, max_len, eos_id)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_len)
