"""Tree verification of children drawn WITHOUT replacement (tree_accept.accept_sampled's
without_replacement): test_tree_accept's tables and emitted sequences, with every node's
children drawn one by one from q at the parent without the tokens of its earlier children
(what a dynamic tree's sampled levels draw). A child left no mass (more children than
tokens q keeps) is void. The law must be the target's exactly (chi-square over all V^L
sequences) and every branch of the walk occur MIN_BRANCH times; the rule for i.i.d.
children (q_c in place of each child's own law) must fail the same test.
"""

import jax
import numpy as np
import pytest

from specdec_t5x.algorithm.trees import accept as tree_accept
from test_distribution import chi2_pvalue, counts_of
from test_tree_accept import (KMAX, MIN_BRANCH, N, ROWS, child_code, draw, emitted, exact_law,
                              tables)

# parents: three children of the root, two of most nodes below, depth 4 (the tables')
PARENTS = np.array([-1, 0, 0, 0, 1, 1, 2, 2, 4, 4, 6, 8, 8, 3, 5, 9], np.int32)
RULE = jax.jit(tree_accept.accept_sampled, static_argnames=('max_depth', 'without_replacement'))


def build(rs, rows, p_tab, q_tab, void=0.1):
  """Per row the PARENTS tree, each node's token drawn from q at its parent without the
  tokens of its earlier siblings; a node is void at random or when no mass is left."""
  ar = np.arange(rows)
  parents = np.broadcast_to(PARENTS, (rows, N)).copy()
  tokens, code, depth = (np.zeros((rows, N), np.int64) for _ in range(3))
  tokens[:, 0] = 2  # the committed token: never tested
  valid = rs.random((rows, N)) >= void
  valid[:, 0] = True
  exhausted = 0  # nodes void for want of mass
  for i in range(1, N):
    par = PARENTS[i]
    q_c = q_tab[code[:, par]].copy()
    for j in range(1, i):  # the earlier siblings' tokens are not drawn again
      if PARENTS[j] == par:
        q_c[ar, tokens[:, j]] = 0.0
    left = q_c.sum(-1) > 0
    q_c[~left, 0] = 1.0  # (a stand-in token for a void node)
    tokens[:, i] = draw(rs, q_c)
    valid[:, i] &= left
    exhausted += int(np.sum(~left))
    depth[:, i] = depth[:, par] + 1
    code[:, i] = child_code(code[:, par], depth[:, par], tokens[:, i])
  return dict(parents=parents, tokens=tokens.astype(np.int32), sampled=np.ones((rows, N), bool),
              valid=valid, p=p_tab[code].astype(np.float32), q=q_tab[code].astype(np.float32),
              exhausted=exhausted)


def run(name, seed, without_replacement=True):
  p_tab, q_tab, rs = tables(name, seed)
  tree = build(rs, ROWS, p_tab, q_tab)
  uniforms = rs.random((ROWS, N)).astype(np.float32)
  path, n_acc, dist = map(np.asarray, RULE(
      tree['parents'], tree['tokens'], tree['sampled'], tree['valid'], tree['p'], tree['q'],
      uniforms, max_depth=KMAX, without_replacement=without_replacement))
  seq = emitted(rs, tree, path, n_acc, dist, p_tab)
  return chi2_pvalue(exact_law(p_tab), counts_of(seq)), tree, path, n_acc


def branches(tree, path, n_acc):
  """How often the walk accepted a node's first, second or third child, and ended at a
  node with children (all rejected) or at a leaf."""
  ar = np.arange(len(n_acc))
  order = np.zeros(N, np.int64)  # a node's place among its siblings
  for i in range(1, N):
    order[i] = np.sum(PARENTS[1:i] == PARENTS[i])
  accepted = np.zeros((len(n_acc), N), bool)
  for k in range(1, path.shape[1]):
    hit = k <= n_acc
    accepted[ar[hit], path[hit, k]] = True
  last = path[ar, n_acc]
  has_children = np.any(tree['valid'] & (PARENTS[None] == last[:, None]), axis=1)
  out = {f'child {k + 1} accepted': int(accepted[:, order == k].sum()) for k in range(3)}
  out.update({'all children rejected': int(has_children.sum()),
              'leaf reached': int((~has_children).sum())})
  return out


@pytest.mark.parametrize('name', ['t1', 'topk', 'topp'])
def test_children_drawn_without_replacement_keep_the_target_law(name):
  pvalue, tree, path, n_acc = run(name, seed=20)
  hits = branches(tree, path, n_acc)
  print(name, 'p-value', pvalue, hits, 'void for want of mass:', tree['exhausted'])
  assert pvalue > 1e-3, pvalue
  if name == 'topp':  # the draft's nucleus often holds fewer tokens than a node's children
    # (so a third child is rarely drawn, and then for a token the target's nucleus lacks)
    assert tree['exhausted'] >= MIN_BRANCH, tree['exhausted']
    hits.pop('child 3 accepted')
  assert min(hits.values()) >= MIN_BRANCH, hits


def test_the_iid_rule_on_children_drawn_without_replacement_is_detected():
  pvalue = run('t1', seed=20, without_replacement=False)[0]
  print('p-value', pvalue)
  assert pvalue < 1e-6, pvalue
