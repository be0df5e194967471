"""Speculative decoding over a draft TREE: the draft's chain, its runner-up tokens and a copy
branch, one target call.

Each step (per row with n tokens so far) builds a tree of N = 1 + gamma + c + S nodes
(tree.py's layout: parents [b, N], node 0 the root y_{n-1}):
  * nodes 1..gamma: the draft's chain x_1..x_gamma, sampled from its q as in the chain
    loop (node t's parent t - 1);
  * nodes gamma + 1 .. gamma + c: the copy branch g_1..g_c (`copy_continuation`: the tokens
    that followed the most recent earlier occurrence of the row's last 1-3 tokens, in the
    encoder input or the decoded prefix), fixed guesses. While the guesses equal the chain
    (g_1..g_j = x_1..x_j) they are the chain's own nodes (void here) and the next guess
    hangs below chain node j; a guess without a match, past the known tokens or past the
    row's room is void (its subtree too);
  * the last S nodes: the draft's siblings, k_t at depth t (config.draft_siblings): the
    draft's k_t most likely tokens at chain node t - 1 other than its own x_t, fixed
    guesses and leaves (children of chain node t - 1); void with it, and where a copy
    node under the same parent already guesses the token. They cost no draft call.
ONE target call over the tree (`extend(..., tree=parents)`) gives p at every node;
tree_accept's rules accept the longest target-consistent path (greedy: equal to greedy
decoding token for token) or walk it by recursive rejection (sampled: exact for every
temperature, top-k and top-p; the guesses depend only on the row's tokens and on the
chain, which comes earlier in the nodes' order, as tree_accept requires). Then the path's
tokens and the correction or bonus token are emitted, and `tree.compact` moves the path's
keys and values to the slots a chain call over it writes: the target's cache holds the
accepted path at consecutive positions, nothing of the other branches.

The draft's first call each step re-feeds the last depth + 1 tokens (positions n - D .. n,
D the tree's depth): the accepted path may have left its chain, so its cache is rewritten
from where the chain could first have been wrong. A feature head drafting the chain
re-feeds them with the target's features gathered along the accepted path (what a chain
call over the path returns), as it re-feeds a chain's verify window. The loop is otherwise
decoding.py's.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import rows, sampling, tree, tree_accept
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.decoding import (ExtendFn, _emit, _finish, _init_state, _split_keys,
                                            _with_prompt, count_step)
from specdec_t5x.algorithm.drafting import (DraftVocabulary, draft_unrolled, feature_drafter,
                                            full_distributions)
from specdec_t5x.algorithm.stats import DecodeStats

COPY_NGRAM = 3  # the longest suffix the copy branch looks up


def copy_continuation(encoder_tokens, seq, length, num: int, max_ngram: int = COPY_NGRAM):
  """Prompt lookup, several tokens: -> (tokens [b, num] int32, known [b, num] bool).

  The row's committed tokens are seq[:, 2:2 + length] (decoding.py's buffer). For n =
  max_ngram..1 (longest first) its last n tokens are looked up in the encoder input
  (0 = padding) and in the committed tokens before them; the most recent occurrence (a
  decoded one counts as later than any encoder one) gives the `num` tokens after it.
  `known` says which of them exist (for a match in the encoder input: inside it and not
  padding; for one among the committed tokens: committed); none without a match.
  """
  b, enc_len = encoder_tokens.shape
  out = seq[:, 2:]  # [b, T]: y_0, y_1, ...
  hay = jnp.concatenate([encoder_tokens.astype(jnp.int32), out], axis=1)  # [b, H]
  size = hay.shape[1]
  h = jnp.arange(size)[None, :]  # [1, H]
  in_enc = h < enc_len
  width = max_ngram + num
  ahead = jnp.pad(hay, ((0, 0), (0, width)))
  shifted = [ahead[:, k:k + size] for k in range(width)]  # shifted[k][:, h] = hay[:, h + k]
  start = jnp.full((b,), -1, jnp.int32)  # [b] the continuation's first haystack index
  for n in range(1, max_ngram + 1):  # longer matches overwrite shorter ones
    suffix = rows.window(jnp.pad(out, ((0, 0), (max_ngram, 0))), length + max_ngram - n, n)
    match = (length >= n)[:, None] & jnp.ones((b, size), bool)
    for k in range(n):
      match &= shifted[k] == suffix[:, k:k + 1]
    # In the encoder input: the match and its first continuation token, none of them padding.
    enc_ok = in_enc & (h + n < enc_len)
    for k in range(n + 1):
      enc_ok &= shifted[k] != 0
    # Among the committed tokens: ending before the suffix itself (its continuation known).
    dec_ok = ~in_enc & (h - enc_len + n < length[:, None])
    match &= enc_ok | dec_ok
    last = (size - 1 - jnp.argmax(match[:, ::-1], axis=1)).astype(jnp.int32)  # most recent
    start = jnp.where(jnp.any(match, axis=1), last + n, start)
  index = start[:, None] + jnp.arange(num)[None, :]  # [b, num]
  tokens = jnp.take_along_axis(hay, jnp.clip(index, 0, size - 1), axis=1)
  in_encoder = (start < enc_len)[:, None]  # a match in the encoder input continues there only
  known = (start[:, None] >= 0) & jnp.where(in_encoder, (index < enc_len) & (tokens != 0),
                                            index - enc_len < length[:, None])
  known = jnp.cumprod(known.astype(jnp.int32), axis=1).astype(bool)  # a prefix of them
  return jnp.where(known, tokens, 0), known


def tree_layout(chain, copy, copy_known, num_drafted, limit):
  """The step's tree. chain [b, g] (the draft's tokens), copy [b, c] and copy_known [b, c]
  (copy_continuation), num_drafted [b] (chain nodes that count), limit [b] (the deepest
  node that can count) -> (parents [b, N], node tokens [b, N - 1] (the root's excluded),
  valid [b, N] (the root True), sampled [b, N] (the chain's nodes)), N = 1 + g + c."""
  b, g = chain.shape
  c = copy.shape[1]
  depth = jnp.arange(1, c + 1)[None, :]  # [1, c] copy node j's depth, j + 1
  same = jnp.zeros((b, c), bool)  # guesses 0..j equal chain 0..j, chain node j + 1 counting
  if g:
    same_j = jnp.concatenate([(copy[:, :g] == chain[:, :c]) & copy_known[:, :g],
                              jnp.zeros((b, max(0, c - g)), bool)], axis=1)
    same = jnp.cumprod(same_j.astype(jnp.int32), axis=1).astype(bool) & (depth <= num_drafted[:, None])
  shared_before = jnp.pad(same[:, :-1], ((0, 0), (1, 0)))  # [b, c]: guess j's prefix is the chain's
  copy_index = 1 + g + jnp.arange(c)[None, :]  # [1, c]
  copy_parent = jnp.where(shared_before, depth - 1, copy_index - 1)
  copy_parent = jnp.where(depth == 1, 0, copy_parent)
  chain_parent = jnp.broadcast_to(jnp.arange(g)[None, :], (b, g))
  parents = jnp.concatenate([jnp.full((b, 1), -1), chain_parent, copy_parent], axis=1)
  chain_valid = jnp.arange(1, g + 1)[None, :] <= num_drafted[:, None]
  copy_valid = copy_known & ~same & (depth <= limit[:, None])
  valid = jnp.concatenate([jnp.ones((b, 1), bool), chain_valid, copy_valid], axis=1)
  sampled = jnp.concatenate([jnp.zeros((b, 1), bool), jnp.ones((b, g), bool),
                             jnp.zeros((b, c), bool)], axis=1)
  return parents.astype(jnp.int32), jnp.concatenate([chain, copy], axis=1), valid, sampled


def graft_copy(tokens, parents, valid, copy, copy_known, limit):
  """A copy branch grafted onto a grown tree (a dynamic tree's): tokens, parents and valid
  [b, N] (tree.py's layout, the root's token first), copy and copy_known [b, c]
  (copy_continuation), limit [b] (the deepest node that can count) -> the same three with
  N + c nodes: guess j (depth j + 1) hangs below the valid node that holds guesses 1..j
  where the tree has them and is void (the tree's node is the guess: duplicates merged),
  else it is a new node below guess j - 1's. A guess past the known tokens, the row's
  room or a void guess is void. Fixed guesses after every tree node, as tree_accept asks."""
  b, n = tokens.shape
  at = jnp.zeros((b,), jnp.int32)  # the node holding the guesses so far (the root first)
  in_tree = jnp.ones((b,), bool)  # it is one of the tree's n nodes
  live = jnp.ones((b,), bool)  # it is valid
  new_parents, new_valid = [], []
  for j in range(copy.shape[1]):
    match = (in_tree[:, None] & valid & (parents == at[:, None])
             & (tokens == copy[:, j:j + 1]))  # [b, n] the tree's node holding guess j
    merged = jnp.any(match, axis=1)
    live &= copy_known[:, j] & (j + 1 <= limit)
    new_parents.append(at)
    new_valid.append(live & ~merged)
    at = jnp.where(merged, jnp.argmax(match, axis=1), n + j).astype(jnp.int32)
    in_tree &= merged
  if not new_parents:
    return tokens, parents, valid
  return (jnp.concatenate([tokens, copy.astype(tokens.dtype)], axis=1),
          jnp.concatenate([parents, jnp.stack(new_parents, axis=1).astype(parents.dtype)], 1),
          jnp.concatenate([valid, jnp.stack(new_valid, axis=1)], axis=1))


def runner_up(logits, chosen, k: int, vocab: Optional[DraftVocabulary] = None):
  """The k most likely tokens of logits [b, V] other than chosen [b] -> [b, k] int32, most
  likely first (ties: the lower id first). With `vocab` the logits' columns are its ids
  (a reduced draft vocabulary): chosen and the result are token ids all the same."""
  if vocab is not None:
    chosen = jnp.take(jnp.asarray(vocab.columns), chosen)
  _, top = jax.lax.top_k(logits, k + 1)  # [b, k + 1]
  other = top != chosen[:, None]
  order = jnp.argsort(~other, axis=1, stable=True)[:, :k]  # the first k others, in order
  out = jnp.take_along_axis(top, order, axis=1).astype(jnp.int32)
  return out if vocab is None else jnp.take(jnp.asarray(vocab.ids), out)


def with_siblings(layout, sibling_tokens, sibling_depth, num_drafted):
  """tree_layout's (parents, nodes, valid, sampled) with the siblings appended: tokens
  [b, S], sibling_depth [S] (static: t, its parent chain node t - 1) -> the same four
  with N + S nodes. A sibling counts where its depth was drafted and no valid earlier
  guess under the same parent holds its token."""
  parents, nodes, valid, sampled = layout
  b = parents.shape[0]
  depth = jnp.asarray(sibling_depth, jnp.int32)[None, :]  # [1, S]
  sib_parent = jnp.broadcast_to(depth - 1, sibling_tokens.shape)
  tokens = jnp.concatenate([jnp.zeros((b, 1), nodes.dtype), nodes], axis=1)  # [b, N]
  guessed = (parents[:, None, :] == sib_parent[:, :, None]) & valid[:, None, :] & ~sampled[:, None, :]
  guessed &= tokens[:, None, :] == sibling_tokens[:, :, None]  # [b, S, N]
  sib_valid = (depth <= num_drafted[:, None]) & ~jnp.any(guessed, axis=2)
  return (jnp.concatenate([parents, sib_parent.astype(parents.dtype)], axis=1),
          jnp.concatenate([nodes, sibling_tokens.astype(nodes.dtype)], axis=1),
          jnp.concatenate([valid, sib_valid], axis=1),
          jnp.concatenate([sampled, jnp.zeros(sibling_tokens.shape, bool)], axis=1))


def tree_speculative_decode(target_fn: ExtendFn, draft_fn: ExtendFn, target_cache, draft_cache,
                            rng, encoder_tokens, *, batch: int, max_len: int,
                            config: DecodeConfig, eos_id: int, prompt=None,
                            settings: Optional[sampling.Sampling] = None,
                            feature_dim: Optional[int] = None,
                            draft_vocab: Optional[DraftVocabulary] = None
                            ) -> Tuple[jax.Array, DecodeStats]:
  """decoding.speculative_decode with a copy branch of config.copy_branch tokens and the
  draft's config.draft_siblings beside its chain of config.gamma (the module docstring).
  Returns (tokens [b, max_len], stats); the length histograms have max(gamma,
  copy_branch) + 1 entries. `settings`, `feature_dim` and `draft_vocab`: as
  decoding.speculative_decode's (a feature head drafts the chain; the next step's first
  head call reads the target's features along the accepted path, as a chain call over the
  path gives them)."""
  gamma, c, cfg = config.gamma, config.copy_branch, settings or config.sampling
  siblings = config.draft_siblings
  sibling_depth = [t + 1 for t, k in enumerate(siblings) for _ in range(k)]  # [S]
  depth_max = max(gamma, c)
  num_nodes = 1 + config.tree_nodes
  state = _init_state(batch, max_len, num_nodes, rng, target_cache, draft_cache, depth_max,
                      feature_dim)
  if prompt is not None:
    state = _with_prompt(state, prompt, max_len, target_fn, draft_fn)

  node_kind = jnp.array([0] * (1 + gamma) + [1] * c + [2] * len(sibling_depth))  # SOURCES

  def step(cache, x, position):
    logits, cache = draft_fn(cache, x[:, None], position)
    return logits[:, 0], cache

  def body(s):
    rng, keys = _split_keys(s.rng, gamma + 2, cfg)  # gamma drafts, uniforms, correction
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
    if c:
      copy, known = copy_continuation(encoder_tokens, s.seq, s.length, c)
    else:
      copy, known = jnp.zeros((batch, 0), jnp.int32), jnp.zeros((batch, 0), bool)
    layout = tree_layout(xs, copy, known, num_drafted, limit)
    if siblings:
      runners = [runner_up(draft_logits[:, t], xs[:, t], k, draft_vocab)
                 for t, k in enumerate(siblings) if k]
      layout = with_siblings(layout, jnp.concatenate(runners, axis=1), sibling_depth,
                             num_drafted)
    parents, nodes, valid, sampled = layout
    last = rows.window(s.seq, s.length + 1, 1)  # [b, 1]
    out = target_fn(s.target_cache, jnp.concatenate([last, nodes], 1), s.length, tree=parents)
    logits, target_cache = out[:2]
    tokens = jnp.concatenate([last, nodes], 1)  # [b, N]
    if cfg.greedy:
      best, bad = sampling.argmax_checked(logits)  # [b, N] each
      path, n_acc, token = tree_accept.accept_greedy(parents, tokens, best, valid, depth_max)
    else:
      p, bad = sampling.standardize_checked(logits, cfg)  # [b, N, V]
      qs = full_distributions(qs, draft_vocab)  # [b, gamma, V]
      q = jnp.concatenate([qs, jnp.zeros((batch, num_nodes - gamma) + qs.shape[2:], qs.dtype)],
                          axis=1)
      uniforms = jax.vmap(lambda k: jax.random.uniform(k, (num_nodes,)))(keys[:, gamma])
      path, n_acc, dist = tree_accept.accept_sampled(parents, tokens, sampled, valid, p, q,
                                                     uniforms, depth_max)
      token = sampling.sample(keys[:, gamma + 1], dist)
    # [N] each node's depth: chain node t at t, copy node j at j + 1 (tree_layout), a
    # sibling at its chain node's
    node_depth = jnp.array([0] + list(range(1, gamma + 1)) + list(range(1, c + 1))
                           + sibling_depth)
    return commit(s, tokens, parents, valid, path, n_acc, token, node_depth, node_kind,
                  bad=jnp.any(bad, axis=1), draft_bad=draft_bad, target_cache=target_cache,
                  draft_cache=draft_cache, rng=rng, max_len=max_len, eos_id=eos_id,
                  features=None if feature_dim is None else out[2])

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_len, prompt)


def commit(s, tokens, parents, valid, path, n_acc, token, node_depth, node_kind, *, bad,
           draft_bad, target_cache, draft_cache, rng, max_len: int, eos_id: int,
           features=None):
  """A tree step's end, once its path is accepted: tokens, parents and valid [b, N]
  (tree.py's layout, the root's first), path [b, D + 1] and n_acc [b]
  (tree_accept's), token [b] (the correction or bonus), node_depth [N] or [b, N] and
  node_kind [N] (stats.SOURCES) of every node, the rows' nonfinite flags bad, draft_bad [b]. The
  target's cache is compacted to the path, the path's tokens and `token` are emitted and
  the step counted (verified: the valid nodes; draft length: the tree's valid depth).
  `features` [b, N, F]: the target's at every node, for a feature-reading draft; the state
  keeps them along the path (what a chain call over the path gives), for the next step's
  first head call."""
  batch, depth_max = tokens.shape[0], path.shape[1] - 1
  if features is not None:  # [b, D + 1, F]
    s = s.replace(features=jnp.take_along_axis(features, path[:, :, None], axis=1),
                  feature_start=s.length)
  active = ~s.done
  target_cache = tree.compact(target_cache, s.length, path)
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
                  bad=bad, draft_bad=draft_bad, by_source=by_source)
  s = s.replace(rng=rng, target_cache=target_cache, draft_cache=draft_cache, stats=st)
  return _emit(s, candidates, n_acc + 1, max_len, eos_id)


def check(config: DecodeConfig, draft_reads_features: bool, speculative: bool,
          draft_is_model: bool = True, draft_columns: Optional[int] = None) -> Optional[str]:
  """Why a draft tree cannot be verified with these settings (None: it can).
  `draft_is_model`: the draft is a T5 model (network.Transformer); its calls take a tree,
  as a feature head's do (what draft_tree_width's draft tree calls need). `draft_columns`:
  the ids a head with a reduced draft vocabulary drafts over (its siblings and a dynamic
  tree's levels come from them)."""
  if not config.tree:
    return None
  what = ' and '.join(name for name in ('copy_branch', 'draft_siblings', 'draft_tree_width')
                      if getattr(config, name))
  if not speculative:
    return f'{what} needs a draft (it proposes the tree\'s first branch).'
  if config.draft_tree_width and not (draft_reads_features or draft_is_model):
    return (f'{what} grows the tree with draft tree calls: the draft must be a T5 model '
            '(network.Transformer) or a feature head, not an n-gram or a copy draft.')
  if draft_columns is not None and config.draft_tree_width > draft_columns:
    return (f'draft_tree_width must be <= the {draft_columns} ids of the head\'s reduced '
            f'draft vocabulary (a level\'s first node has no more children), got '
            f'{config.draft_tree_width}.')
  if draft_columns is not None and max(config.draft_siblings, default=0) >= draft_columns:
    return (f'draft_siblings must be < the {draft_columns} ids of the head\'s reduced draft '
            f'vocabulary at every depth, got {config.draft_siblings}.')
  return None
