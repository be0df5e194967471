"""Draft trees built: the chain, a copy branch grafted on, the draft's siblings, grown levels.

Every builder takes and returns a tree in structure.py's layout, as the loops feed it to
the target: node tokens [b, N] (the root's token first), parents [b, N] and valid [b, N]
(a void node and its subtree are never accepted; trees/accept.py). Nodes are appended, so
the earlier nodes keep their indices, and fixed guesses come after the nodes they may
depend on, as trees/accept.py's rules require.

* `chain`: the draft's chain x_1..x_g below the root, the tree every step starts from.
* `graft_copy`: the copy branch (`copy_continuation`: prompt lookup) onto any tree (a
  chain: static_tree.py; the draft's grown tree: dynamic_tree.py, a mixed tree).
* `with_siblings`: the draft's runner-up tokens (`runner_up`) beside its chain's.
* `grow` and `draw`: one level of the draft's dynamic tree (its top-W children, or W
  draws without replacement); `rerank` keeps its nodes of largest path probability.

One de-duplication rule serves both kinds of fixed guess (`held`): a guess that a valid
node under the same parent already holds is void, the tree's node standing for it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import rows, sampling
from specdec_t5x.algorithm.draft_vocab import DraftVocabulary, full_distributions
from specdec_t5x.algorithm.trees import structure

COPY_NGRAM = 3  # the longest suffix the copy branch looks up


def copy_continuation(encoder_tokens, seq, length, num: int, max_ngram: int = COPY_NGRAM):
  """Prompt lookup, several tokens: -> (tokens [b, num] int32, known [b, num] bool).

  The row's committed tokens are seq[:, 2:2 + length] (decode/core.py's buffer). For n =
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


def chain(root, drafted, num_drafted):
  """root [b, 1] (the row's last committed token), drafted [b, g] (the draft's chain
  x_1..x_g), num_drafted [b] (its nodes that count) -> (tokens, parents, valid [b, 1 + g]):
  node t holds x_t below node t - 1."""
  b, g = drafted.shape
  valid = jnp.concatenate([jnp.ones((b, 1), bool),
                           jnp.arange(1, g + 1)[None, :] <= num_drafted[:, None]], axis=1)
  return jnp.concatenate([root, drafted], axis=1), structure.chain(b, 1 + g), valid


def held(tokens, parents, valid, parent, token):
  """The de-duplication rule of fixed guesses: tokens, parents, valid [b, N] (a tree),
  parent and token [b, K] (K guesses) -> [b, K, N] bool: node i is a valid child of guess
  k's parent holding guess k's token (the guess would repeat it)."""
  return (valid[:, None, :] & (parents[:, None, :] == parent[:, :, None])
          & (tokens[:, None, :] == token[:, :, None]))


def graft_copy(tokens, parents, valid, copy, copy_known, limit):
  """A copy branch grafted onto a tree (the draft's chain, or its dynamic tree): tokens,
  parents and valid [b, N], copy and copy_known [b, c] (copy_continuation), limit [b] (the
  deepest node that can count) -> the same three with N + c nodes: guess j (depth j + 1)
  hangs below the valid node that holds guesses 1..j where the tree has them and is void
  (`held`: the tree's node is the guess, duplicates merged), else it is a new node below
  guess j - 1's. A guess past the known tokens, the row's room or a void guess is void.
  Fixed guesses after every tree node, as trees/accept.py asks."""
  b, n = tokens.shape
  at = jnp.zeros((b,), jnp.int32)  # the node holding the guesses so far (the root first)
  in_tree = jnp.ones((b,), bool)  # it is one of the tree's n nodes
  live = jnp.ones((b,), bool)  # it is valid
  new_parents, new_valid = [], []
  for j in range(copy.shape[1]):
    match = in_tree[:, None] & held(tokens, parents, valid, at[:, None],
                                    copy[:, j:j + 1])[:, 0]  # [b, n] the node holding guess j
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


def with_siblings(tokens, parents, valid, sibling_tokens, sibling_depth: Sequence[int],
                  num_drafted):
  """The draft's siblings appended to a tree whose nodes 1..g are its chain: tokens,
  parents, valid [b, N], sibling_tokens [b, S] (runner_up's: never the chain's own token
  at that depth), sibling_depth [S] (static: t, its parent chain node t - 1) -> the same
  three with N + S nodes, leaves. A sibling counts where its depth was drafted and no valid
  node under the same parent holds its token (`held`, as the copy branch's guesses)."""
  depth = jnp.asarray(sibling_depth, jnp.int32)[None, :]  # [1, S]
  sib_parent = jnp.broadcast_to(depth - 1, sibling_tokens.shape)
  guessed = held(tokens, parents, valid, sib_parent, sibling_tokens)  # [b, S, N]
  sib_valid = (depth <= num_drafted[:, None]) & ~jnp.any(guessed, axis=2)
  return (jnp.concatenate([tokens, sibling_tokens.astype(tokens.dtype)], axis=1),
          jnp.concatenate([parents, sib_parent.astype(parents.dtype)], axis=1),
          jnp.concatenate([valid, sib_valid], axis=1))


def _token_ids(columns, vocab: Optional[DraftVocabulary]):
  """The draft's logits columns -> token ids (a reduced draft vocabulary's ids)."""
  columns = columns.astype(jnp.int32)
  return columns if vocab is None else jnp.asarray(vocab.ids)[columns]


def grow(frontier_logits, scores, tokens, parents, width: int,
         vocab: Optional[DraftVocabulary] = None):
  """One level of the tree: frontier_logits [b, F, V] (the draft after each of the last F
  nodes; V = the columns of `vocab`, a reduced draft vocabulary, if given), scores [b, F]
  (their log path probabilities), tokens and parents [b, M] (the nodes so far, the
  frontier last) -> (scores [b, W], tokens and parents [b, M + W]): the W children of
  largest log path probability, best first (ties: the earlier parent, then the lower id)."""
  b, f, v = frontier_logits.shape
  logq = jax.nn.log_softmax(frontier_logits.astype(jnp.float32), axis=-1)
  best, index = jax.lax.top_k((scores[:, :, None] + logq).reshape(b, f * v), width)
  parent = tokens.shape[1] - f + index // v  # [b, W] the frontier node it grows from
  return (best, jnp.concatenate([tokens, _token_ids(index % v, vocab)], axis=1),
          jnp.concatenate([parents, parent.astype(jnp.int32)], axis=1))


def draw(frontier_logits, scores, tokens, parents, keys, cfg: sampling.Settings,
         vocab: Optional[DraftVocabulary] = None):
  """One SAMPLED level: frontier_logits [b, F, V] (the draft after each of the last F
  nodes), scores [b, F] (their log path probabilities under q), tokens and parents [b, M]
  (the nodes so far, the frontier last), keys [b, W, 2] -> (scores [b, W], tokens and
  parents [b, M + W], the expanded node [b] and its q [b, V], the draft's sampling
  distribution by `cfg`): the W children of the frontier node of largest score (ties: the
  earlier), drawn from its q one by one without replacement (each by inverse CDF over the
  mass the earlier draws left: sampling.sample, one uniform per draw). Which node grows
  depends on the frontier's tokens alone, never on its children's. A draw made after q's
  mass ran out scores -inf: it is void. With `vocab` (a reduced draft vocabulary) the
  logits are over its columns: the draws become its ids and q is widened to the whole
  vocabulary (0 off its ids)."""
  b, f, v = frontier_logits.shape
  if cfg.topk > v:  # top-k beyond the draft's columns keeps them all (drafting.propose)
    cfg = dataclasses.replace(cfg, topk=v)
  best = jnp.argmax(scores, axis=1)  # [b] first max
  q = sampling.standardize(
      jnp.take_along_axis(frontier_logits, best[:, None, None], axis=1)[:, 0], cfg)  # [b, V]
  base = jnp.take_along_axis(scores, best[:, None], axis=1)[:, 0]  # [b]
  left, children, child_scores = q, [], []
  for k in range(keys.shape[1]):
    x = sampling.sample(keys[:, k], left)  # [b]
    is_x = jnp.arange(q.shape[-1])[None, :] == x[:, None]
    q_x = jnp.sum(jnp.where(is_x, left, 0.0), axis=-1)  # 0 once the mass ran out
    children.append(_token_ids(x, vocab))
    child_scores.append(jnp.where(q_x > 0, base + jnp.log(jnp.where(q_x > 0, q_x, 1.0)),
                                  -jnp.inf))
    left = jnp.where(is_x, 0.0, left)
  node = (tokens.shape[1] - f + best).astype(jnp.int32)  # [b]
  return (jnp.stack(child_scores, axis=1),
          jnp.concatenate([tokens, jnp.stack(children, axis=1)], axis=1),
          jnp.concatenate([parents, jnp.broadcast_to(node[:, None], (b, len(children)))],
                          axis=1), node, full_distributions(q, vocab))


def rerank(scores, tokens, parents, keep: int):
  """scores [b, M] (log path probabilities of nodes 1..M), tokens and parents [b, 1 + M]
  (structure.py's layout, grown level by level) -> tokens, parents and the kept node
  indices [b, 1 + keep] of the root and the `keep` nodes of largest score, in their grown
  order (so parents come first; a tie keeps the earlier node, and a parent scores at least
  its children: the kept nodes are a tree), their parents renumbered."""
  b, m = scores.shape
  _, best = jax.lax.top_k(scores, keep)  # [b, keep] node - 1, ties: the earlier node
  kept = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), jnp.sort(best, axis=1) + 1], axis=1)
  renumber = jnp.zeros((b, 1 + m), jnp.int32).at[
      jnp.arange(b)[:, None], kept].set(jnp.arange(1 + keep, dtype=jnp.int32)[None, :])
  old_parent = jnp.take_along_axis(parents, kept, axis=1)  # [b, 1 + keep]; the root's -1
  new_parent = jnp.where(old_parent < 0, -1,
                         jnp.take_along_axis(renumber, jnp.maximum(old_parent, 0), axis=1))
  return jnp.take_along_axis(tokens, kept, axis=1), new_parent, kept
