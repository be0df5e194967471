"""Speculative decoding over a draft TREE: the draft's chain, its runner-up tokens and a copy
branch, one target call.

Each step (per row with n tokens so far) builds a tree of N = 1 + gamma + c + S nodes
(trees/structure.py's layout: parents [b, N], node 0 the root y_{n-1}) with
trees/build.py:
  * nodes 1..gamma: the draft's chain x_1..x_gamma (`chain`), sampled from its q as in the
    chain loop (node t's parent t - 1);
  * nodes gamma + 1 .. gamma + c: the copy branch g_1..g_c (`copy_continuation`: the tokens
    that followed the most recent earlier occurrence of the row's last 1-3 tokens, in the
    encoder input or the decoded prefix), fixed guesses grafted onto the chain
    (`graft_copy`, as onto a dynamic tree). While the guesses equal the chain (g_1..g_j =
    x_1..x_j) they are the chain's own nodes (void here) and the next guess hangs below
    chain node j; a guess without a match, past the known tokens or past the row's room is
    void (its subtree too);
  * the last S nodes: the draft's siblings, k_t at depth t (config.draft_siblings): the
    draft's k_t most likely tokens at chain node t - 1 other than its own x_t
    (`runner_up`), fixed guesses and leaves (children of chain node t - 1,
    `with_siblings`); void with it, and where a copy node under the same parent already
    guesses the token. They cost no draft call.
ONE target call over the tree (`extend(..., tree=parents)`) gives p at every node;
trees/accept.py's rules accept the longest target-consistent path (greedy: equal to greedy
decoding token for token) or walk it by recursive rejection (sampled: exact for every
temperature, top-k and top-p; the guesses depend only on the row's tokens and on the
chain, which comes earlier in the nodes' order, as the rules require). Then the path's
tokens and the correction or bonus token are emitted, and `structure.compact` moves the
path's keys and values to the slots a chain call over it writes: the target's cache holds
the accepted path at consecutive positions, nothing of the other branches.

The draft's first call each step re-feeds the last depth + 1 tokens (positions n - D .. n,
D the tree's depth): the accepted path may have left its chain, so its cache is rewritten
from where the chain could first have been wrong. A feature head drafting the chain
re-feeds them with the target's features gathered along the accepted path (what a chain
call over the path returns), as it re-feeds a chain's verify window. The loop is otherwise
chain.py's, over core.py's state (its end: core.commit_tree_step).
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import rows, sampling
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.decode.core import (ExtendFn, beta, commit_tree_step, finish, init_state,
                                               split_keys, with_prompt)
from specdec_t5x.algorithm.decode.drafting import draft_unrolled, feature_drafter
from specdec_t5x.algorithm.draft_vocab import DraftVocabulary, full_distributions
from specdec_t5x.algorithm.stats import DecodeStats
from specdec_t5x.algorithm.trees import accept, build


def tree_speculative_decode(target_fn: ExtendFn, draft_fn: ExtendFn, target_cache, draft_cache,
                            rng, encoder_tokens, *, batch: int, max_len: int,
                            config: DecodeConfig, eos_id: int, prompt=None,
                            settings: Optional[sampling.Sampling] = None,
                            feature_dim: Optional[int] = None,
                            draft_vocab: Optional[DraftVocabulary] = None
                            ) -> Tuple[jax.Array, DecodeStats]:
  """chain.speculative_decode with a copy branch of config.copy_branch tokens and the
  draft's config.draft_siblings beside its chain of config.gamma (the module docstring).
  Returns (tokens [b, max_len], stats); the length histograms have max(gamma,
  copy_branch) + 1 entries. `settings`, `feature_dim` and `draft_vocab`: as
  chain.speculative_decode's (a feature head drafts the chain; the next step's first
  head call reads the target's features along the accepted path, as a chain call over the
  path gives them)."""
  gamma, c, cfg = config.gamma, config.copy_branch, settings or config.sampling
  siblings = config.draft_siblings
  sibling_depth = [t + 1 for t, k in enumerate(siblings) for _ in range(k)]  # [S]
  depth_max = max(gamma, c)
  num_nodes = 1 + config.tree_nodes
  state = init_state(batch, max_len, num_nodes, rng, target_cache, draft_cache, depth_max,
                     feature_dim)
  if prompt is not None:
    state = with_prompt(state, prompt, max_len, target_fn, draft_fn)

  node_kind = jnp.array([0] * (1 + gamma) + [1] * c + [2] * len(sibling_depth))  # SOURCES
  node = jnp.arange(num_nodes)[None, :]
  sampled = jnp.broadcast_to((node >= 1) & (node <= gamma), (batch, num_nodes))  # the chain

  def step(cache, x, position):
    logits, cache = draft_fn(cache, x[:, None], position)
    return logits[:, 0], cache

  def body(s):
    rng, keys = split_keys(s.rng, gamma + 2, cfg)  # gamma drafts, uniforms, correction
    active = ~s.done
    room = jnp.where(active, max_len - s.length - 1, 0)  # [b] tokens that can be drafted
    num_steps = jnp.clip(jnp.max(room), 0, gamma)
    limit = jnp.minimum(room, depth_max)
    if feature_dim is None:
      # The draft re-reads the last depth_max + 1 tokens (positions start .. start + D).
      start = jnp.maximum(s.length - depth_max, -1)
      logits, carry = draft_fn(s.draft_cache, rows.window(s.seq, start + 1, depth_max + 1),
                               start)
      first = (jnp.take_along_axis(logits, (s.length - start)[:, None, None], axis=1)[:, 0],
               carry)
      chain_step = step
    else:  # the head re-reads the last step's accepted path with the target's features
      first, chain_step = feature_drafter(draft_fn, s)
    xs, qs, carry, _, _, draft_bad, draft_logits = draft_unrolled(
        first, chain_step, s, keys, num_steps, gamma, cfg, draft_vocab, with_logits=True)
    draft_cache = carry if feature_dim is None else carry[0]
    num_drafted = jnp.minimum(limit, num_steps)
    last = rows.window(s.seq, s.length + 1, 1)  # [b, 1] the root
    tokens, parents, valid = build.chain(last, xs, num_drafted)
    if c:
      tokens, parents, valid = build.graft_copy(
          tokens, parents, valid, *build.copy_continuation(encoder_tokens, s.seq, s.length, c),
          limit)
    if siblings:
      runners = [build.runner_up(draft_logits[:, t], xs[:, t], k, draft_vocab)
                 for t, k in enumerate(siblings) if k]
      tokens, parents, valid = build.with_siblings(
          tokens, parents, valid, jnp.concatenate(runners, axis=1), sibling_depth, num_drafted)
    out = target_fn(s.target_cache, tokens, s.length, tree=parents)  # tokens [b, N]
    logits, target_cache = out[:2]
    if cfg.greedy:
      best, bad = sampling.argmax_checked(logits)  # [b, N] each
      path, n_acc, token = accept.accept_greedy(parents, tokens, best, valid, depth_max)
    else:
      p, bad = sampling.standardize_checked(logits, cfg)  # [b, N, V]
      qs = full_distributions(qs, draft_vocab)  # [b, gamma, V]
      q = jnp.concatenate([qs, jnp.zeros((batch, num_nodes - gamma) + qs.shape[2:], qs.dtype)],
                          axis=1)
      uniforms = jax.vmap(lambda k: jax.random.uniform(k, (num_nodes,)))(keys[:, gamma])
      path, n_acc, dist = accept.accept_sampled(parents, tokens, sampled, valid, p, q,
                                                uniforms, depth_max)
      token = sampling.sample(keys[:, gamma + 1], dist)
    # beta along the draft's chain while the accepted path follows it (chain node t is node t)
    on_chain = jnp.arange(gamma)[None, :]
    measured = ((on_chain <= n_acc[:, None]) & (path[:, :gamma] == on_chain)
                & (on_chain < num_drafted[:, None]))
    betas = beta(xs, None if cfg.greedy else qs, best if cfg.greedy else p, measured, cfg.greedy)
    # [N] each node's depth: chain node t at t, copy node j at j + 1, a sibling at its
    # chain node's
    node_depth = jnp.array([0] + list(range(1, gamma + 1)) + list(range(1, c + 1))
                           + sibling_depth)
    return commit_tree_step(
        s, tokens, parents, valid, path, n_acc, token, node_depth, node_kind, betas=betas,
        bad=jnp.any(bad, axis=1), draft_bad=draft_bad, target_cache=target_cache,
        draft_cache=draft_cache, rng=rng, max_len=max_len, eos_id=eos_id,
        features=None if feature_dim is None else out[2])

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return finish(state, max_len, prompt)
