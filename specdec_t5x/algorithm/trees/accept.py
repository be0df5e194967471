"""Exact acceptance rules for a draft TREE: several candidate continuations, one target call.

A tree holds N nodes per row in topological order. Node 0 is the root (the last committed
token, parent -1, never tested); every other node i has a parent 0 <= parents[:, i] < i (a
chain is parents = [-1, 0, 1, ..., N - 2]). Node i's token extends its parent's path; the
target's distribution after node i's path is p[:, i] (standardised by
`sampling.standardize`), the draft's is q[:, i]. A node that is not `valid` is void: it
and its descendants are never accepted (a padding node still needs a parent < its index).

Each non-root node was proposed one of two ways (`sampled`):
  * sampled: its token was drawn from q at its parent, i.i.d. with its sampled siblings;
  * a fixed guess: a deterministic proposal (copy from the input, an n-gram, a top-k
    child of the draft treated as a guess), possibly equal to a sibling's token.

The walk (SpecInfer's recursive rejection, with EAGLE-2's rule for fixed guesses): from
the root, with current node c and residual r = p[c], c's valid children are tested in
index order. A sampled child x is accepted iff u * q_c(x) < r(x) and q_c(x) > 0
(probability min(1, r(x) / q_c(x))), and on rejection r <- norm(max(r - q_c, 0)); a fixed
guess x is accepted iff u < r(x) (probability r(x)), and on rejection r(x) <- 0, r <- norm(r).
Accepting a child moves c to it with r = p[child]; when all of c's children are rejected
(or it has none) the walk stops, and the next token is drawn from `dist` = r.

Why it is exact. Invariant: at node c with residual r, given everything tested so far,
the token emitted after c's path (an accepted child's token, or the draw from the final r)
has law r. Induction over c's remaining children: a sampled child x ~ q_c gives
P(accept, x = y) = min(q_c(y), r(y)) and P(reject) = m = sum(max(r - q_c, 0)), after which
(induction) the token follows max(r - q_c, 0) / m: total min(q_c, r) + max(r - q_c, 0) = r.
A fixed guess g gives P(accept, y) = r(g) [y = g] and, after a rejection (probability
1 - r(g)), the law r(y) / (1 - r(g)) for y != g: total r again. The walk starts each node
with r = p[c], so every emitted token follows the target's law given the path before it;
and the children of an accepted node were drawn before (and independently of) the coins
that accepted it, so the argument repeats one level down. Several sampled children of one
node are fine because each is a fresh draw from q_c independent of the earlier siblings'
tokens and coins (the residual accounts for their rejection); a sampled child equal to an
earlier rejected guess g is rejected surely (r(g) = 0), as it must be; a guess equal to an
earlier rejected sampled sibling is tested against the residual, not p.
Children drawn WITHOUT replacement (`without_replacement`: SpecTr's and Jeon et al.'s
recursive rejection without replacement; draws that cannot repeat a token waste no node on
duplicates): the k-th sampled child of c has law q'_k = q_c without the tokens of c's
earlier sampled children, renormalised, given them; it is tested as a sampled child with
q'_k in place of q_c (accepted iff u * q'_k(x) < r(x), residual max(r - q'_k, 0)), and the
same induction holds with each child's own proposal law. A node whose q'_k has no mass
left (fewer tokens of positive q_c than children) must be void.
What exactness needs of the tree's builder: each sampled child's token must have law q_c
(q'_k without replacement) given everything tested before it in index order, i.e. be
drawn i.i.d. from q_c (or one by one without replacement); a fixed guess, `valid` and the
tree's shape may depend on the path, on q and on siblings EARLIER in index order (dedup
against them is fine), never on a later sampled sibling's token (a guess placed first and
chosen to differ from a later sampled sibling breaks it; so does keeping the likelier of
two sampled children).

Exhausted residuals: r has no mass left after a rejection only when that rejection had
probability 0 in exact arithmetic (max(r - q_c, 0) = 0 means r = q_c, so every sampled x
is accepted; a guess g with r without g empty means r(g) = 1 and u < 1 accepts). Float
rounding can still get there (probability ~1e-7); r is then kept, as `sampling.residual`
falls back to p: for the guess that is the point mass on g, its own exact law.

A chain of sampled nodes is exactly `sampling.accept_tokenwise` plus
`sampling.correction_distribution` (the same comparisons and residual, bit for bit), and
greedy `accept_greedy` on a chain is `sampling.accept_greedy`.

Shapes use T5X's bracket comments; b rows, N nodes, V the vocabulary, D the tree's
maximal depth (`max_depth`, static; N - 1 by default).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.trees import structure


def _take(x: jax.Array, index: jax.Array) -> jax.Array:
  """x [b, N] at the per-row node index [b] -> [b].

  A masked sum over the N nodes rather than a gather: exact (one term is x, the others
  0), and XLA compiles a few dozen of these faster than as many gathers.
  """
  hit = index[:, None] == jnp.arange(x.shape[1])[None, :]  # [b, N]
  if x.dtype == jnp.bool_:
    return jnp.any(hit & x, axis=1)
  return jnp.sum(jnp.where(hit, x, jnp.zeros((), x.dtype)), axis=1)


def path_to(parents: jax.Array, node: jax.Array, max_depth: int) -> jax.Array:
  """The nodes from the root to `node`: parents [b, N], node [b] -> path [b, max_depth + 1].

  path[:, k] is node's ancestor at depth k for k <= depth(node) (path[:, 0] = 0, the root;
  path[:, depth(node)] = node); later entries repeat `node`. max_depth must bound the depth
  of every node that can be returned.
  """
  anc = [node]  # anc[j]: node's ancestor j levels up (the root once past it)
  for _ in range(max_depth):
    up = anc[-1]
    anc.append(jnp.where(up > 0, _take(parents, jnp.maximum(up, 0)), 0))
  anc = jnp.stack(anc, axis=1)  # [b, max_depth + 1]
  depth = jnp.sum((anc[:, :-1] > 0).astype(jnp.int32), axis=1)  # [b]
  k = jnp.arange(max_depth + 1)[None, :]
  return jnp.take_along_axis(anc, jnp.maximum(depth[:, None] - k, 0), axis=1)


def accept_greedy(parents: jax.Array, tokens: jax.Array, target_argmax: jax.Array,
                  valid: jax.Array, max_depth: Optional[int] = None):
  """Greedy tree verification: equal to greedy target decoding, token for token.

  A node is accepted iff it is valid, its parent is accepted (the root is) and its token
  is the target's argmax after its parent's path. The deepest accepted node (ties: the
  smallest index; tied nodes carry the same tokens) ends the accepted path.

  Args:
    parents: [b, N] int32, parents[:, 0] = -1, 0 <= parents[:, i] < i.
    tokens: [b, N] int32 (node 0's is the committed token, never tested).
    target_argmax: [b, N] int32, the target's argmax after each node's path.
    valid: [b, N] bool (node 0 counts as valid whatever it says).
    max_depth: static bound on the tree's depth (default N - 1).

  Returns:
    path [b, D + 1] int32 (`path_to`: root .. deepest accepted node, then that node
    repeated), n_acc [b] int32 (its depth: accepted tokens), bonus [b] int32 (the target's
    argmax at it: the token emitted after the accepted ones).
  """
  n = parents.shape[1]
  max_depth = n - 1 if max_depth is None else max_depth
  accepted = jnp.zeros(parents.shape, bool).at[:, 0].set(True)  # [b, N]
  for i in range(1, n):
    par = parents[:, i]
    ok = valid[:, i] & _take(accepted, par) & (tokens[:, i] == _take(target_argmax, par))
    accepted = accepted.at[:, i].set(ok)
  depth = structure.depths(parents)
  node = jnp.argmax(jnp.where(accepted, depth, -1), axis=1).astype(jnp.int32)  # first max
  return (path_to(parents, node, max_depth), _take(depth, node),
          _take(target_argmax, node).astype(jnp.int32))


def accept_sampled(parents: jax.Array, tokens: jax.Array, sampled: jax.Array,
                   valid: jax.Array, p: jax.Array, q: jax.Array, uniforms: jax.Array,
                   max_depth: Optional[int] = None, without_replacement: bool = False):
  """Exact sampling verification of a draft tree (the walk of the module docstring).

  Vectorised over rows, a static loop over the nodes in index order (a node is tested
  when it is valid and its parent is the current node, so each node's children are met
  in index order and a rejected subtree is skipped); jit-able.

  Args:
    parents: [b, N] int32, parents[:, 0] = -1, 0 <= parents[:, i] < i.
    tokens: [b, N] int32 (node 0's is never tested).
    sampled: [b, N] bool: drawn from q at the parent (True) or a fixed guess (False).
    valid: [b, N] bool (node 0 counts as valid whatever it says).
    p: [b, N, V] the target's distribution after each node's path.
    q: [b, N, V] the draft's distribution after each node's path (q[:, i] is the law of
      node i's sampled children; rows of nodes without sampled children are not read).
    uniforms: [b, N] i.i.d. U[0, 1), one per node, used when the node is tested.
    max_depth: static bound on the tree's depth (default N - 1).
    without_replacement: static; the sampled children of a node were drawn from q WITHOUT
      replacement, in index order (the module docstring's last case): each one's law is q
      at the parent without its earlier sampled siblings' tokens, renormalised.

  Returns:
    path [b, D + 1] int32 (root .. last accepted node, then that node repeated),
    n_acc [b] int32 (accepted tokens: the last accepted node's depth),
    dist [b, V] float32 (the law of the token emitted after them: the residual left at
    the last accepted node, which is p there when it had no valid child).
  """
  b, n, v = p.shape
  max_depth = n - 1 if max_depth is None else max_depth
  p = p.astype(jnp.float32)
  q = q.astype(jnp.float32)
  # [b, N, V]: the draft's distribution at each node's parent (the root's own for node 0).
  q_par = jnp.take_along_axis(q, jnp.maximum(parents, 0)[:, :, None], axis=1)
  current = jnp.zeros((b,), jnp.int32)  # [b] the last accepted node
  r = p[:, 0]  # [b, V] the residual at `current`
  # without replacement: the tokens of current's sampled children so far
  drawn = jnp.zeros((b, v), bool) if without_replacement else None
  for i in range(1, n):
    par = parents[:, i]
    tested = valid[:, i] & (par == current)
    x = tokens[:, i]
    is_x = jnp.arange(v)[None, :] == x[:, None]  # [b, V]
    q_c = q_par[:, i]  # [b, V]
    if without_replacement:  # node i's own proposal law: q_c without the earlier draws
      q_c = jnp.where(drawn, 0.0, q_c)
      q_c = q_c / jnp.maximum(jnp.sum(q_c, axis=-1, keepdims=True), 1e-30)
      drawn |= is_x & ((par == current) & sampled[:, i])[:, None]
    r_x = jnp.sum(jnp.where(is_x, r, 0.0), axis=1)  # exact: one nonzero term
    q_x = jnp.sum(jnp.where(is_x, q_c, 0.0), axis=1)
    u = uniforms[:, i]
    is_sampled = sampled[:, i]
    ok = jnp.where(is_sampled, (u * q_x < r_x) & (q_x > 0), u < r_x)
    accept = tested & ok
    reject = tested & ~ok
    # After a rejection: sampling.residual(r, q_c) for a sampled child, r without x for a
    # guess (one masked, renormalised form; r itself where nothing is left).
    left = jnp.where(is_sampled[:, None], jnp.maximum(r - q_c, 0.0),
                     jnp.where(is_x, 0.0, r))
    mass = jnp.sum(left, axis=-1, keepdims=True)
    r_rejected = jnp.where(mass > 0, left / jnp.where(mass > 0, mass, 1.0), r)
    r = jnp.where(accept[:, None], p[:, i], jnp.where(reject[:, None], r_rejected, r))
    current = jnp.where(accept, i, current)
    if without_replacement:
      drawn &= ~accept[:, None]  # a new current: none of its children drawn yet
  depth = structure.depths(parents)
  return path_to(parents, current, max_depth), _take(depth, current), r
