"""How many tokens per target call a static draft tree could give a draft at best, greedy,
from teacher-forced ranks (scripts/tree_bound.py).

At each position of the target's greedy output, `ranks` gives the rank of the target's
token among the draft's next-token choices on the target's own prefix (0: the draft's pick;
ties by id, as argmax and top_k order them). A greedy step that starts at position t with a
draft tree accepts the longest path of the tree whose ranks are r_t, r_{t+1}, ...: a node
is its path of ranks from the root, a tree a prefix-closed set of such paths. Over steps
starting at every position, a tree's expected accepted tokens is the sum over its nodes of
the share of starts whose ranks begin with the node's path (`path_shares`; the Sequoia
paper chooses trees from the same statistic). So at n nodes (n + 1 verified positions):

* the chain of gamma = n: the paths (0), (0, 0), ...;
* the chain with leaf siblings (what tree_decoding verifies: the draft's runner-ups beside
  each chain token), the best split of the n nodes (`best_chain_with_siblings`);
* the best static tree of n nodes: the n paths of largest share (`best_tree`), a bound for
  every static tree this draft could feed, whatever draft calls it would need.

Tokens per call = 1 + expected accepted tokens (the bonus or correction token). Steps of a
real decode start where the last one ended, not at every position; the measured tokens per
call of the chains (results/tree.md) are set beside these to show how close that is.
"""

from __future__ import annotations

import collections
from typing import Dict, List, Sequence, Tuple

import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import batching
from specdec_t5x.research import evaluation

Path = Tuple[int, ...]


def ranks(target, draft, enc: np.ndarray, outputs: Sequence[np.ndarray],
          batch: int = 16) -> List[np.ndarray]:
  """Per output row (the target's tokens, cut after EOS): the rank of each token among the
  draft's teacher-forced logits at its position, int [len]."""
  del target  # the outputs are the target's; the ranks are the draft's
  dec_len = batching.bucket_length(max(len(o) for o in outputs))
  found = []
  for start in range(0, len(outputs), batch):
    rows = list(outputs[start:start + batch])
    e = batching.trim_batch(enc[start:start + len(rows)])
    d = batching.pad_batch(rows, dec_len, min_len=dec_len)  # [n, dec_len]
    q = np.asarray(evaluation._LOGITS(draft[0], draft[1], jnp.asarray(e), jnp.asarray(d)))  # pylint: disable=protected-access
    found += [token_ranks(q[i, :len(r)], r) for i, r in enumerate(rows)]
  return found


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
  tree_decoding verifies them (draft_siblings); the counts split exactly (a small DP)."""
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
    counts = max(table)[1]
    nodes = chain(gamma) + [(0,) * (t - 1) + (j,) for t, k in enumerate(counts, 1)
                            for j in range(1, k + 1)]
    if tree_value(shares, nodes) > tree_value(shares, best):
      best = nodes
  return best
