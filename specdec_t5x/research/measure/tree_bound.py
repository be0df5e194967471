"""How many tokens per target call a static draft tree could give a draft, greedy, from
teacher-forced ranks (scripts/compare_decodes.py --experiment=tree_bound).

At each position of the target's greedy output, `ranks` gives the rank of the target's
token among the draft's next-token choices on the target's own prefix (0: the draft's pick;
ties by id, as argmax and top_k order them). A greedy step with a static draft tree (a node
is its path of ranks from the root, a tree a prefix-closed set of them) accepts the
longest tree path whose ranks follow from where the step starts, then emits one more token:
so `decode_value` replays a greedy decode step by step and gives its tokens per target call
exactly (the chains' equal results/tree.md's measured decodes), for any tree, without
decoding. Choosing the tree: over steps starting at every position, a tree accepts the sum
over its nodes of the share of starts whose ranks begin with the node's path (`path_shares`;
the Sequoia paper chooses trees from the same statistic); at n nodes (n + 1 verified
positions):

* the chain of gamma = n: the paths (0), (0, 0), ...;
* the chain with leaf siblings (what decode/static_tree.py verifies: the draft's runner-ups
  beside each chain token), the best split of the n nodes (`best_chain_with_siblings`);
* the n paths of largest share (`best_tree`): the best static tree for steps starting at
  every position;
* `best_decoded_tree`: the best in decode order among the trees made of the most frequent
  paths (a search, for small n).

Beside them an upper bound for EAGLE-2's dynamic trees (`dynamic_value`), and the draft's
chain with a copy branch (prompt lookup, which is not a draft rank; `copy_runs`,
`decode_value` with copy_rows) and with an n-gram table's greedy continuation (its run of
picks that are right, `pick_runs`), replayed the same way.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm.trees import build
from specdec_t5x.research.measure import evaluation

Path = Tuple[int, ...]
_COPY = jax.jit(build.copy_continuation, static_argnums=3)


TOP = 9  # the draft's largest probabilities kept per position (dynamic_value's siblings)


@dataclasses.dataclass
class DraftView:
  """One output row as the draft sees it, teacher-forced on the target's tokens."""
  ranks: np.ndarray  # [len] int: each token's rank among the draft's choices (token_ranks)
  own: np.ndarray  # [len] the draft's probability of the target's token
  top: np.ndarray  # [len, TOP] the draft's largest probabilities, descending


def views(draft, enc: np.ndarray, outputs: Sequence[np.ndarray],
          batch: int = 16) -> List[DraftView]:
  """Per output row (the target's tokens, cut after EOS), the draft's teacher-forced view of
  it: ranks, the probability of each token and the draft's TOP largest (softmax, T = 1)."""
  found = []
  for rows, (q,) in evaluation.teacher_forced_logits((draft,), enc, outputs, batch):
    q = np.asarray(q)
    for i, r in enumerate(rows):
      logits = q[i, :len(r)].astype(np.float64)
      probs = np.exp(logits - logits.max(axis=1, keepdims=True))
      probs /= probs.sum(axis=1, keepdims=True)
      found.append(DraftView(token_ranks(q[i, :len(r)], r),
                             np.take_along_axis(probs, np.asarray(r)[:, None], 1)[:, 0],
                             -np.sort(-probs, axis=1)[:, :TOP]))
  return found


def ranks(draft, enc: np.ndarray, outputs: Sequence[np.ndarray]) -> List[np.ndarray]:
  """Per output row: each token's rank among the draft's choices (`views`)."""
  return [v.ranks for v in views(draft, enc, outputs)]


def token_ranks(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  """logits [n, V], tokens [n] -> [n] int: how many ids come before each token in the
  draft's order (larger logit first, then smaller id)."""
  tokens = np.asarray(tokens)
  own = np.take_along_axis(logits, tokens[:, None], axis=1)  # [n, 1]
  ids = np.arange(logits.shape[1])[None, :]
  before = (logits > own) | ((logits == own) & (ids < tokens[:, None]))
  return before.sum(axis=1)


def path_shares(rank_rows: Sequence[np.ndarray], depth: int) -> Dict[Path, float]:
  """{path of ranks (length 1..depth): the share of start positions whose next ranks begin
  with it}, over every position of every row (a path that would run past the row's end
  matches nothing there)."""
  counts: Dict[Path, int] = collections.Counter()
  starts = 0
  for r in rank_rows:
    r = [int(x) for x in r]
    for t in range(len(r)):
      starts += 1
      for d in range(1, min(depth, len(r) - t) + 1):
        counts[tuple(r[t:t + d])] += 1
  return {p: c / starts for p, c in counts.items()} if starts else {}


def tree_value(shares: Dict[Path, float], nodes: Sequence[Path]) -> float:
  """Expected accepted tokens per step of the prefix-closed tree `nodes`."""
  nodes = set(nodes)
  for p in nodes:
    if len(p) > 1 and p[:-1] not in nodes:
      raise ValueError(f'not a tree: {p} without its parent {p[:-1]}')
  return float(sum(shares.get(p, 0.0) for p in nodes))


def chain(gamma: int) -> List[Path]:
  return [(0,) * d for d in range(1, gamma + 1)]


def best_tree(shares: Dict[Path, float], n: int) -> List[Path]:
  """The n nodes of largest share (a parent's share is at least its child's, so the set is
  prefix-closed; ties go to the shallower path, then the smaller ranks); paths no start
  takes are never needed (fewer than n nodes then)."""
  return sorted(shares, key=lambda p: (-shares[p], len(p), p))[:n]


def best_chain_with_siblings(shares: Dict[Path, float], n: int) -> List[Path]:
  """The best tree of n nodes made of a chain of some gamma and, beside its token at depth
  t, the draft's next k_t choices as leaves (ranks 1..k_t after t - 1 chain tokens), as
  decode/static_tree.py verifies them (draft_siblings); the counts split exactly (a small DP)."""
  best: List[Path] = chain(n)
  for gamma in range(1, n + 1):
    spare = n - gamma
    gain = lambda t, k: sum(shares.get((0,) * (t - 1) + (j,), 0.0) for j in range(1, k + 1))
    # table[m]: (value, counts) of the best use of m siblings over the depths so far
    table = [(0.0, ())] + [(-1.0, ())] * spare
    for t in range(1, gamma + 1):
      table = [max(((table[m - k][0] + gain(t, k), table[m - k][1] + (k,))
                    for k in range(m + 1) if table[m - k][0] >= 0), default=(-1.0, ()))
               for m in range(spare + 1)]
    nodes = siblings(gamma, max(table)[1])
    if tree_value(shares, nodes) > tree_value(shares, best):
      best = nodes
  return best


def _replay(lengths: Sequence[int], accepted) -> float:
  """Tokens per target call of a greedy decode over rows of `lengths` tokens whose step
  starting at position t of row i accepts accepted(i, t) drafts and emits one more token."""
  tokens = steps = 0
  for i, n in enumerate(lengths):
    t = 0
    while t < n:
      t, steps = t + accepted(i, t) + 1, steps + 1
    tokens += n
  return tokens / steps if steps else 1.0


def decode_value(rank_rows: Sequence[np.ndarray], nodes: Sequence[Path],
                 copy_rows: Optional[Sequence[np.ndarray]] = None) -> float:
  """Tokens per target call of greedy decoding that verifies the tree `nodes` at every
  step, over the rows: each step starts after the last one's tokens, accepts the longest
  path of `nodes` matching the ranks from there and emits one more token. With
  `copy_rows` (per start, how many tokens of the branches verified beside the tree's root
  match: copy_runs or pick_runs cut to each branch's length, their elementwise maximum for
  several) a step accepts the longest of the matches."""
  nodes = set(nodes)
  rows = [[int(x) for x in r] for r in rank_rows]

  def accepted(i, t):
    r, d = rows[i], 0
    while t + d < len(r) and tuple(r[t:t + d + 1]) in nodes:
      d += 1
    return d if copy_rows is None else max(d, int(copy_rows[i][t]))
  return _replay([len(r) for r in rows], accepted)


def siblings(gamma: int, counts: Sequence[int]) -> List[Path]:
  """The tree of a chain of gamma with counts[t - 1] of the draft's runner-ups beside its
  token at depth t (DecodeConfig.draft_siblings)."""
  return chain(gamma) + [(0,) * t + (j,) for t, k in enumerate(counts)
                         for j in range(1, k + 1)]


def best_decoded_tree(rank_rows: Sequence[np.ndarray], shares: Dict[Path, float], n: int,
                      candidates: int = 12) -> Optional[List[Path]]:
  """The tree of n nodes with the most tokens per call in decode order (`decode_value`)
  among the prefix-closed sets of the `candidates` paths of largest share."""
  paths = best_tree(shares, candidates)
  best, value = None, 0.0
  for nodes in itertools.combinations(paths, n):
    if all(len(p) == 1 or p[:-1] in nodes for p in nodes):
      v = decode_value(rank_rows, nodes)
      if v > value:
        best, value = list(nodes), v
  return best


def dynamic_value(rows: Sequence[DraftView], n: int) -> float:
  """Tokens per target call, in decode order, of EAGLE-2's dynamic tree of n nodes (the n
  nodes of largest draft path probability, the product of the draft's probabilities along
  the path), bounded from above: a step accepts the target's path as deep as its nodes are
  among the n, and the only rivals counted are the siblings of that path's nodes (known from
  teacher forcing); the subtrees below those siblings are left out, which can only let more
  of the path in."""
  def accepted(i, t):
    v = rows[i]
    depth = min(n, len(v.ranks) - t)
    path = np.cumprod(v.own[t:t + depth])  # [depth]: P_1..P_depth
    before = np.concatenate([[1.0], path[:-1]])  # each node's parent's path probability
    rivals = np.asarray([before[k] * q for k in range(depth)
                         for j, q in enumerate(v.top[t + k][:n]) if j != v.ranks[t + k]])
    d = 0
    while d < depth and d + np.sum(rivals > path[d]) < n:  # ancestors outrank their node;
      d += 1  # ties go to the path
    return d
  return _replay([len(v.ranks) for v in rows], accepted)


def copy_runs(enc_row: np.ndarray, tokens: np.ndarray, num: int,
              max_len: Optional[int] = None) -> np.ndarray:
  """[len] int: per start position t, how many of the copy branch's `num` tokens
  (build.copy_continuation: prompt lookup on the input and the target's prefix
  y_<t) are the target's next tokens, as a greedy step starting at t would accept them."""
  tokens = np.asarray(tokens, np.int32)
  size = max_len or len(tokens)  # one compiled lookup for every row of up to max_len
  seq = np.zeros((size, 2 + size), np.int32)
  seq[:, 2:2 + len(tokens)] = tokens[None, :]  # only the first `length` tokens are read
  enc = np.repeat(np.asarray(enc_row, np.int32)[None, :], size, axis=0)
  copy, known = _COPY(jnp.asarray(enc), jnp.asarray(seq), jnp.arange(size, dtype=jnp.int32),
                      num)
  copy, known = np.asarray(copy), np.asarray(known)
  out = np.zeros(len(tokens), np.int64)
  for t in range(len(tokens)):
    while (out[t] < num and t + out[t] < len(tokens) and known[t, out[t]]
           and copy[t, out[t]] == tokens[t + out[t]]):
      out[t] += 1
  return out


def pick_runs(ranks: np.ndarray, num: int) -> np.ndarray:
  """[len] int: per start position t, how many of the `num` tokens that a deterministic
  draft's greedy continuation proposes from y_<t (an n-gram table's picks: fixed guesses)
  are the target's next tokens. While its picks are right the draft runs on the target's own
  prefix, so that is the run of rank-0 tokens from t, cut at num."""
  ranks = np.asarray(ranks)
  out = np.zeros(len(ranks), np.int64)
  run = 0
  for t in range(len(ranks) - 1, -1, -1):
    run = run + 1 if ranks[t] == 0 else 0
    out[t] = min(run, num)
  return out
