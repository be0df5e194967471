"""Speculative decoding over the draft's own DYNAMIC tree (EAGLE-2's expansion, here for an
encoder-decoder draft), verified in one target call.

Each step (per row with n tokens so far) the draft grows a tree of gamma levels of W nodes
(config.draft_tree_width): N = 1 + W * gamma nodes in trees/structure.py's layout (parents [b, N],
node 0 the root y_{n-1}; level d holds nodes 1 + W (d - 1) .. W d):
  * the draft's first call re-feeds the last gamma + 1 tokens (positions n - gamma .. n,
    as static_tree.py's does: the accepted path may have left any branch) and gives its
    distribution after the root; level 1 is its W most likely tokens;
  * level d + 1: one draft TREE call over the nodes so far (`extend(..., tree=parents)`:
    each node at its depth's position, seeing the prefix and its ancestors) gives the
    draft's distribution after each node of level d; of the W x V children the W of
    largest path probability (the product of the draft's probabilities down the path)
    become level d + 1, best first (trees/build.py's `grow`).
A feature head (feature_draft.py: EAGLE-2's own setting) grows the same tree: its first
call re-reads the last accepted path with the target's features (drafting.feature_drafter)
and gives its distribution after the root and its predicted feature there; in each tree
call every node reads the feature the head predicted at its parent (the root: the target's
feature before it), so each path is drafted as the head's chain along it would be; a
reduced draft vocabulary's columns become its ids. The target's call returns its features
at every node, and the next step's head reads them along the accepted path.
With config.draft_tree_nodes = M (EAGLE-2's reranking) only the M grown nodes of largest
path probability are verified, N = 1 + M: a node's path probability is at most its
parent's, so they form a tree (`rerank`).
The draft ranks by its own softmax (temperature 1) whatever the sampling settings. Every
node is then a fixed guess that depends on the row's committed tokens alone, so
trees/accept.py's rules are exact: greedy accepts the longest path of the target's argmaxes
(equal to greedy decoding token for token); sampled walks the tree by recursive rejection,
removing each rejected guess from the residual before its siblings (exact for every
temperature, top-k and top-p).
With config.draft_tree_sampled at temperature > 0 the levels are DRAWN instead (SpecInfer's
multi-sampling, without replacement as SpecTr's): level d + 1 is W tokens drawn one by one
without replacement from the draft's sampling distribution q (the run's temperature,
top-k, top-p) after the node of level d of largest draft path probability (`draw`; which
node grows depends on level d's tokens, never on its children's), and the walk tests each
draw against its own law (trees/accept.py's without_replacement), so a rejected draw passes
its mass on as a chain's rejection does; every grown node is verified. A draw after q's
mass ran out is void. A level past the row's room is void.
With config.copy_branch = c the copy branch (build.copy_continuation) joins the grown
tree: a MIXED tree (build.graft_copy, which grafts it onto static_tree.py's chain alike).
A guess the tree already holds is the tree's node (merged), and the guesses from the first
one it lacks on hang below it as new nodes (the branch's c nodes come after every grown
node, void where merged), fixed guesses whatever the levels are, so the rules above stay
exact; the draft then re-reads max(gamma, c) + 1 tokens, as the accepted path may be the
copy branch's.
The step ends as static_tree.py's (core.commit_tree_step): the path and the correction or
bonus token are emitted, and `structure.compact` moves the path's keys and values into
place in the target's cache. The draft's tree calls write beyond the committed prefix
only; its next first call rewrites the positions the accepted path took.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import rows, sampling
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.decode.core import (ExtendFn, beta, commit_tree_step, finish,
                                               init_state, split_keys, with_prompt)
from specdec_t5x.algorithm.decode.drafting import feature_drafter, feature_pick, law
from specdec_t5x.algorithm.draft_vocab import DraftVocabulary, full_distributions
from specdec_t5x.algorithm.stats import DecodeStats
from specdec_t5x.algorithm.trees import accept, build


def dynamic_tree_decode(target_fn: ExtendFn, draft_fn: ExtendFn, target_cache, draft_cache,
                        rng, encoder_tokens=None, *, batch: int, max_len: int,
                        config: DecodeConfig, eos_id: int, prompt=None,
                        settings: Optional[sampling.Sampling] = None,
                        feature_dim: Optional[int] = None,
                        draft_vocab: Optional[DraftVocabulary] = None
                        ) -> Tuple[jax.Array, DecodeStats]:
  """chain.speculative_decode with the draft's dynamic tree of config.gamma levels of
  config.draft_tree_width nodes (the module docstring). draft_fn takes a tree (a T5
  model's extend, or a feature head's: `feature_dim` and `draft_vocab` as
  chain.speculative_decode's). With config.copy_branch = c the copy branch
  (build.copy_continuation over `encoder_tokens` [b, L]) is grafted onto the grown tree
  (build.graft_copy). Returns (tokens [b, max_len], stats); the length histograms have
  max(gamma, c) + 1 entries. `settings`: as chain.speculative_decode's."""
  gamma, width, cfg = config.gamma, config.draft_tree_width, settings or config.sampling
  c = config.copy_branch
  grown, depth_max = width * gamma, max(gamma, c)
  num_nodes = 1 + config.tree_nodes  # the kept tree's nodes, then the copy branch's c
  drawn = config.draft_tree_sampled and not cfg.greedy  # levels sampled from q
  state = init_state(batch, max_len, max(num_nodes, depth_max + 1), rng, target_cache,
                     draft_cache, depth_max, feature_dim)  # room for a step's tokens
  if prompt is not None:
    state = with_prompt(state, prompt, max_len, target_fn, draft_fn)
  level = jnp.asarray(np.repeat(np.arange(gamma + 1), [1] + [width] * gamma))  # [1 + grown]
  node_kind = jnp.array([0] * (num_nodes - c) + [1] * c)  # stats.SOURCES
  is_drawn = jnp.arange(num_nodes)[None, :] < num_nodes - c  # [1, N] the tree's nodes

  def body(s):
    # uniforms, correction (and a sampled tree's draws: W per level)
    rng, keys = split_keys(s.rng, 2 + grown if drawn else 2, cfg)
    room = jnp.where(~s.done, max_len - s.length - 1, 0)  # [b] tokens that can be drafted
    limit = jnp.minimum(room, depth_max)
    if feature_dim is None:
      # The draft re-reads the last D + 1 tokens (positions start .. start + D, D =
      # depth_max): the accepted path may have left any branch.
      start = jnp.maximum(s.length - depth_max, -1)
      logits, draft_cache = draft_fn(s.draft_cache,
                                     rows.window(s.seq, start + 1, depth_max + 1), start)
      frontier = jnp.take_along_axis(logits, (s.length - start)[:, None, None], axis=1)
    else:  # the head re-reads the last step's accepted path with the target's features
      (first, (draft_cache, predicted)), _ = feature_drafter(draft_fn, s)
      frontier = first[:, None]
      # the root's input feature (the target's, before it), for the tree calls' re-feed
      root_feature = jnp.take_along_axis(s.features, feature_pick(s)[:, None, None], axis=1)
    # the draft's own proposal after the root (its argmax, or its sampling distribution), for
    # beta at the root: the one node whose prefix is surely the output's
    root_x, root_q, _ = law(frontier[:, 0], cfg, draft_vocab)
    tokens = rows.window(s.seq, s.length + 1, 1)  # [b, 1] the root
    parents = jnp.full((batch, 1), -1, jnp.int32)
    scores, path_scores = jnp.zeros((batch, 1), jnp.float32), []
    draft_bad = jnp.zeros((batch,), bool)
    vocab_size = frontier.shape[-1] if draft_vocab is None else len(draft_vocab.columns)
    q = jnp.zeros((batch, num_nodes, vocab_size), jnp.float32) if drawn else None
    for d in range(gamma):
      if d and feature_dim is None:  # the draft after each node of level d, from one call
        logits, draft_cache = draft_fn(draft_cache, tokens, s.length, tree=parents)
        frontier = logits[:, -width:]  # over the tree so far
      elif d:  # each node reads its parent's predicted feature (the root: the target's)
        fed = jnp.concatenate([root_feature, jnp.take_along_axis(
            predicted, parents[:, 1:, None], axis=1)], axis=1)  # [b, M, F]
        logits, draft_cache, predicted = draft_fn(draft_cache, tokens, s.length, fed,
                                                  tree=parents)
        frontier = logits[:, -width:]
      draft_bad |= ~jnp.all(jnp.isfinite(frontier), axis=(1, 2))
      if drawn:  # q after each node grown from (the law of its children), for the walk
        scores, tokens, parents, node, q_node = build.draw(
            frontier, scores, tokens, parents, keys[:, 2 + width * d:2 + width * (d + 1)], cfg,
            draft_vocab)
        q = q.at[jnp.arange(batch), node].set(q_node)
      else:
        scores, tokens, parents = build.grow(frontier, scores, tokens, parents, width,
                                             draft_vocab)
      path_scores.append(scores)
    node_depth = jnp.broadcast_to(level, (batch, 1 + grown))
    if num_nodes - c < 1 + grown:  # the best num_nodes - c - 1 of them
      tokens, parents, kept = build.rerank(jnp.concatenate(path_scores, axis=1), tokens,
                                           parents, num_nodes - c - 1)
      node_depth = jnp.take_along_axis(node_depth, kept, axis=1)
    valid = (node_depth <= limit[:, None]) | (jnp.arange(num_nodes - c) == 0)[None, :]
    if drawn:  # a draw after q's mass ran out is void
      valid &= jnp.isfinite(jnp.concatenate([jnp.zeros((batch, 1))] + path_scores, axis=1))
    if c:  # guess j at depth j + 1
      tokens, parents, valid = build.graft_copy(
          tokens, parents, valid, *build.copy_continuation(encoder_tokens, s.seq, s.length, c),
          limit)
      node_depth = jnp.concatenate(
          [node_depth, jnp.broadcast_to(jnp.arange(1, c + 1), (batch, c))], axis=1)
    out = target_fn(s.target_cache, tokens, s.length, tree=parents)
    logits, target_cache = out[:2]
    if cfg.greedy:
      best, bad = sampling.argmax_checked(logits)  # [b, N] each
      path, n_acc, token = accept.accept_greedy(parents, tokens, best, valid, depth_max)
    else:
      p, bad = sampling.standardize_checked(logits, cfg)  # [b, N, V]
      uniforms = jax.vmap(lambda k: jax.random.uniform(k, (num_nodes,)))(keys[:, 0])
      path, n_acc, dist = accept.accept_sampled(
          parents, tokens, jnp.broadcast_to(is_drawn & drawn, (batch, num_nodes)), valid, p,
          q if drawn else jnp.zeros_like(p), uniforms, depth_max, without_replacement=drawn)
      token = sampling.sample(keys[:, 1], dist)
    betas = beta(None if root_x is None else root_x[:, None],
                 None if root_q is None else full_distributions(root_q, draft_vocab)[:, None],
                 best if cfg.greedy else p, (limit > 0)[:, None], cfg.greedy)
    return commit_tree_step(
        s, tokens, parents, valid, path, n_acc, token, node_depth, node_kind, betas=betas,
        bad=jnp.any(bad, axis=1), draft_bad=draft_bad, target_cache=target_cache,
        draft_cache=draft_cache, rng=rng, max_len=max_len, eos_id=eos_id,
        features=None if feature_dim is None else out[2])

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return finish(state, max_len, prompt)
