"""Tree verification (algorithm/trees/accept.py) reproduces the target's exact law.

A tiny 'target' and 'draft' are tables: p(next | path) and q(next | path) for every path of
up to KMAX tokens over V = 4 tokens. Each of ROWS rows gets its own tree (one of TEMPLATES,
mixing sampled children, fixed guesses that may duplicate a sampled sibling, several
sampled siblings, depth 4, two or more branches per level; each non-root node void with
probability 0.1), its sampled children drawn from q at their parent. One call of the rule
per sample; the emitted sequence is the accepted path's tokens, one token from `dist`, then
the target's own continuation up to L tokens: its law must be the target's, exactly
(chi-square over all V^L sequences). Two broken rules (a numpy twin of the rule with one
line changed) must fail the same test, and every branch of the walk must occur
MIN_BRANCH times.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x.algorithm import sampling
from specdec_t5x.algorithm.trees import accept as tree_accept
from specdec_t5x.algorithm.trees import structure as tree_lib
from test_distribution import chi2_pvalue, counts_of

V, L, N, KMAX, ROWS, MIN_BRANCH = 4, 4, 16, 4, 200000, 100
OFFSET = np.cumsum([0] + [V ** k for k in range(KMAX + 1)])  # first code of each length
ROOT, S, TOP1, TOP2, TABLE, DUP = range(6)  # how a node is proposed
# (parent, kind, source of a DUP's token); nodes past a template's end are void.
TEMPLATES = [
    [(-1, ROOT, 0), (0, S, 0), (0, S, 0), (0, DUP, 2), (0, TABLE, 0), (1, S, 0), (1, TOP1, 0),
     (2, S, 0), (3, S, 0), (5, S, 0), (5, S, 0), (6, TOP1, 0), (9, S, 0), (9, TOP2, 0),
     (4, S, 0), (11, S, 0)],
    [(-1, ROOT, 0), (0, TOP1, 0), (0, S, 0), (0, S, 0), (1, S, 0), (1, S, 0), (2, TABLE, 0),
     (2, S, 0), (4, TOP1, 0), (4, S, 0), (8, S, 0), (3, S, 0), (7, S, 0), (9, S, 0)],
    [(-1, ROOT, 0), (0, S, 0), (1, S, 0), (2, S, 0), (3, S, 0)],
    [(-1, ROOT, 0)] + [(max(i - 1, 0) // 2, TOP1 if i % 2 else TOP2, 0) for i in range(1, 15)],
    [(-1, ROOT, 0), (0, S, 0), (0, S, 0), (0, DUP, 1), (0, TOP1, 0), (1, S, 0), (1, S, 0),
     (1, DUP, 6), (2, S, 0), (5, S, 0), (5, TOP2, 0), (9, S, 0), (9, S, 0), (10, TABLE, 0)],
]


def _template_arrays():
  par = np.zeros((len(TEMPLATES), N), np.int32)
  kind = np.full((len(TEMPLATES), N), S, np.int32)
  src = np.zeros((len(TEMPLATES), N), np.int32)
  valid = np.zeros((len(TEMPLATES), N), bool)
  for t, nodes in enumerate(TEMPLATES):
    for i, (parent, k, s) in enumerate(nodes):
      par[t, i], kind[t, i], src[t, i], valid[t, i] = parent, k, s, True
  par[:, 0] = -1
  depth = np.zeros_like(par)
  for i in range(1, N):
    depth[:, i] = depth[np.arange(len(par)), par[:, i]] + 1
  assert depth.max() == KMAX  # the tables hold paths of up to KMAX tokens
  return par, kind, src, valid


def make_table(seed, temperature=1.0, topk=0, topp=0.0, base=None):
  """[M, V] float64 distributions, one per path code, standardised like sampling.standardize."""
  rs = np.random.RandomState(seed)
  logits = rs.randn(OFFSET[-1], V) * 1.5
  if base is not None:  # a draft that resembles the target
    logits = 0.6 * base + 0.8 * logits
  x = (logits - logits.max(-1, keepdims=True)) / temperature
  if topk:
    x = np.where(x < np.sort(x, -1)[:, -topk:-topk + 1], -np.inf, x)
  probs = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
  if topp:
    desc = -np.sort(-probs, -1)
    keep = np.minimum((np.cumsum(desc, -1) < topp).sum(-1), V - 1)  # the nucleus' last
    cut = np.take_along_axis(desc, keep[:, None], -1)
    probs = np.where(probs < cut, 0.0, probs)
    probs /= probs.sum(-1, keepdims=True)
  return probs, logits


def child_code(code, depth, token):
  return OFFSET[depth + 1] + (code - OFFSET[depth]) * V + token


def draw(rs, probs):
  """One token per row of probs [n, V] by inverse CDF (never a zero-probability token)."""
  cum = np.cumsum(probs, -1)
  cum = cum / cum[:, -1:]
  tok = (cum <= rs.random(len(probs))[:, None]).sum(-1)
  last = V - 1 - np.argmax(probs[:, ::-1] > 0, -1)
  return np.minimum(tok, last)


def build_trees(rs, rows, p_tab, q_tab, void=0.1):
  """Per-row trees: a random template each, sampled children drawn from q at the parent."""
  par_t, kind_t, src_t, valid_t = _template_arrays()
  t = rs.randint(len(TEMPLATES), size=rows)
  parents, kind, src = par_t[t], kind_t[t], src_t[t]
  valid = valid_t[t] & (rs.random((rows, N)) >= void)
  valid[:, 0] = True
  guess = np.random.RandomState(99).randint(V, size=OFFSET[-1])
  ar = np.arange(rows)
  tokens, code, depth = (np.zeros((rows, N), np.int64) for _ in range(3))
  tokens[:, 0] = 2  # the committed token: never tested
  for i in range(1, N):
    pc, pd = code[ar, parents[:, i]], depth[ar, parents[:, i]]
    q_c = q_tab[pc]
    order = np.argsort(-q_c, -1, kind='stable')
    options = {S: draw(rs, q_c), TOP1: order[:, 0], TOP2: order[:, 1], TABLE: guess[pc],
               DUP: tokens[ar, src[:, i]]}
    tok = np.zeros(rows, np.int64)
    for k, value in options.items():
      tok = np.where(kind[:, i] == k, value, tok)
    tokens[:, i], depth[:, i] = tok, pd + 1
    code[:, i] = child_code(pc, pd, tok)
  return dict(parents=parents.astype(np.int32), tokens=tokens.astype(np.int32),
              sampled=kind == S, valid=valid, p=p_tab[code].astype(np.float32),
              q=q_tab[code].astype(np.float32), kind=kind, src=src)


def emitted(rs, tree, path, n_acc, dist, p_tab):
  """The first L tokens: the accepted path's, one from dist, then the target's own."""
  rows = len(n_acc)
  path_tokens = np.take_along_axis(tree['tokens'], path, 1)
  correction = draw(rs, np.asarray(dist, np.float64))
  seq = np.zeros((rows, L), np.int64)
  code = np.zeros(rows, np.int64)
  for t in range(L):
    own = draw(rs, p_tab[code])
    y = np.where(t < n_acc, path_tokens[:, min(t + 1, path.shape[1] - 1)],
                 np.where(t == n_acc, correction, own))
    seq[:, t] = y
    code = child_code(code, t, y)
  return seq


def exact_law(p_tab):
  """{sequence: probability} of the target's first L tokens."""
  law = {}
  for seq in itertools.product(range(V), repeat=L):
    prob, code = 1.0, 0
    for t, y in enumerate(seq):
      prob *= p_tab[code, y]
      code = child_code(code, t, y)
    law[seq] = prob
  return law


def numpy_rule(tree, uniforms, stale_residual=False, guess_uses_p=False):
  """A numpy twin of accept_sampled; each flag is a broken variant (one line changed):
  stale_residual: siblings are tested (and the residual formed) against p at the parent,
  not the residual left by the earlier siblings; guess_uses_p: a fixed guess x is accepted
  with probability p(x) instead of r(x). -> (last accepted node [b], dist [b, V])."""
  parents, tokens, valid, sampled = (tree[k] for k in ('parents', 'tokens', 'valid', 'sampled'))
  p, q = tree['p'].astype(np.float64), tree['q'].astype(np.float64)
  rows = len(parents)
  ar = np.arange(rows)
  cur, r = np.zeros(rows, np.int64), p[:, 0].copy()
  for i in range(1, N):
    par, x, u = parents[:, i], tokens[:, i], uniforms[:, i]
    tested = valid[:, i] & (par == cur)
    base = p[ar, par] if stale_residual else r
    q_c = q[ar, par]
    q_x, r_x = q_c[ar, x], base[ar, x]
    guess_x = p[ar, par, x] if guess_uses_p else r_x
    ok = np.where(sampled[:, i], (u * q_x < r_x) & (q_x > 0), u < guess_x)
    res = np.maximum(base - q_c, 0.0)
    without = np.where(np.arange(V)[None] == x[:, None], 0.0, base)
    res = np.where(sampled[:, i, None], res, without)
    mass = res.sum(-1, keepdims=True)
    res = np.where(mass > 0, res / np.where(mass > 0, mass, 1.0), base)
    r = np.where((tested & ok)[:, None], p[:, i], np.where((tested & ~ok)[:, None], res, r))
    cur = np.where(tested & ok, i, cur)
  return cur, r


def branch_counts(tree, path, n_acc):
  """How often each branch of the walk was taken over the rows."""
  parents, valid, kind, sampled = tree['parents'], tree['valid'], tree['kind'], tree['sampled']
  rows = len(n_acc)
  ar = np.arange(rows)
  first = np.zeros((rows, N), bool)  # the first valid child of its parent
  children = np.zeros((rows, N), np.int64)  # valid children per node
  for j in range(1, N):
    earlier = valid[:, 1:j] & (parents[:, 1:j] == parents[:, j:j + 1])
    first[:, j] = ~earlier.any(1)
    np.add.at(children, (ar[valid[:, j]], parents[valid[:, j], j]), 1)
  on_path = np.zeros((rows, N), bool)  # accepted nodes, the root included
  next_on_path = np.full((rows, N), N)  # the accepted child of an accepted node
  on_path[:, 0] = True
  for k in range(1, path.shape[1]):
    hit = k <= n_acc
    on_path[ar[hit], path[hit, k]] = True
    next_on_path[ar[hit], path[hit, k - 1]] = path[hit, k]
  tested = valid & on_path[ar[:, None], parents] & (next_on_path[ar[:, None], parents]
                                                    >= np.arange(N)[None])
  tested[:, 0] = False
  accepted = on_path & (np.arange(N)[None] > 0)
  last = path[ar, n_acc]
  dup = tested & (kind == DUP) & valid[ar[:, None], tree['src']]
  return {
      'first child accepted': int((accepted & first).sum()),
      'later sampled sibling accepted': int((accepted & ~first & sampled).sum()),
      'later fixed guess accepted': int((accepted & ~first & ~sampled).sum()),
      'guess = rejected sampled sibling, tested': int(dup.sum()),
      'all children rejected': int((children[ar, last] > 0).sum()),
      'leaf reached': int((children[ar, last] == 0).sum()),
  }, int((dup & accepted).sum())


RULE = jax.jit(tree_accept.accept_sampled, static_argnames='max_depth')
CASES = {  # (target, draft) table settings: plain, sharpened, top-k and top-p (zeros)
    't1': (dict(), dict()),
    'sharp': (dict(temperature=0.5), dict(temperature=0.7)),
    'topk': (dict(topk=2), dict(topk=3)),
    'topp': (dict(topp=0.7), dict(topp=0.8, temperature=0.8)),
}


def tables(name, seed):
  """A case's target and draft tables, and the rng that builds and walks its trees."""
  p_kw, q_kw = CASES[name]
  p_tab, logits = make_table(seed, **p_kw)
  q_tab, _ = make_table(seed + 1, base=logits, **q_kw)
  return p_tab, q_tab, np.random.RandomState(seed + 2)


def run_case(name, seed, rule=None):
  p_tab, q_tab, rs = tables(name, seed)
  tree = build_trees(rs, ROWS, p_tab, q_tab)
  uniforms = rs.random((ROWS, N)).astype(np.float32)
  path, n_acc, dist = RULE(tree['parents'], tree['tokens'], tree['sampled'], tree['valid'],
                           tree['p'], tree['q'], uniforms, max_depth=KMAX)
  path, n_acc, dist = np.asarray(path), np.asarray(n_acc), np.asarray(dist)
  if rule is not None:  # a numpy variant in place of the module's rule
    node, dist = rule(tree, uniforms)
    parents = jnp.asarray(tree['parents'])
    path = np.asarray(tree_accept.path_to(parents, jnp.asarray(node, jnp.int32), KMAX))
    n_acc = np.asarray(tree_lib.depths(parents))[np.arange(ROWS), node]
  seq = emitted(rs, tree, path, n_acc, dist, p_tab)
  return chi2_pvalue(exact_law(p_tab), counts_of(seq)), tree, uniforms, (path, n_acc, dist)


@pytest.mark.parametrize('name', list(CASES))
def test_tree_walk_matches_exact_target_law(name):
  pvalue, tree, uniforms, (path, n_acc, dist) = run_case(name, seed=10)
  hits, dup_accepted = branch_counts(tree, path, n_acc)
  print(name, 'p-value', pvalue, hits)
  assert pvalue > 1e-3, pvalue
  assert min(hits.values()) >= MIN_BRANCH, hits
  # A rejected sampled x has r(x) < q(x), so the residual leaves x no mass: a guess that
  # repeats it is never accepted.
  assert dup_accepted == 0
  # The numpy twin (float64) takes the same walk on all but rounding-close coins.
  node, ref = numpy_rule(tree, uniforms)
  last = path[np.arange(ROWS), n_acc]
  print(name, 'rows where the numpy twin ends elsewhere:', int(np.sum(node != last)))
  assert np.mean(node != last) < 1e-4
  same = node == last
  np.testing.assert_allclose(dist[same], ref[same], atol=1e-5)


@pytest.mark.parametrize('flag', ['stale_residual', 'guess_uses_p'])
def test_broken_rules_are_detected(flag):
  def broken(tree, uniforms):
    return numpy_rule(tree, uniforms, **{flag: True})
  pvalue = run_case('t1', seed=10, rule=broken)[0]
  print(flag, 'p-value', pvalue)
  assert pvalue < 1e-6, pvalue


def _chain(rs, b, gamma, v=5):
  """A chain tree's inputs from random p, q with zeros, tokens arbitrary (q(x) = 0 too)."""
  def dist(shape):
    w = rs.exponential(size=shape) * (rs.random(shape) < 0.7)
    w[..., 0] += 1e-3
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)
  p, q = dist((b, gamma + 1, v)), dist((b, gamma + 1, v))
  drafts = rs.randint(v, size=(b, gamma)).astype(np.int32)
  u = rs.random((b, gamma)).astype(np.float32)
  k = rs.randint(gamma + 1, size=b).astype(np.int32)
  parents = np.broadcast_to(np.arange(-1, gamma, dtype=np.int32), (b, gamma + 1))
  tokens = np.concatenate([np.zeros((b, 1), np.int32), drafts], 1)
  valid = np.arange(gamma + 1)[None] <= k[:, None]
  return p, q, drafts, u, k, parents, tokens, valid


def test_chain_reduces_to_tokenwise_rule_bit_for_bit():
  rs = np.random.RandomState(3)
  b, gamma = 20000, 4
  p, q, drafts, u, k, parents, tokens, valid = _chain(rs, b, gamma)
  uniforms = np.concatenate([np.zeros((b, 1), np.float32), u], 1)
  path, n_acc, dist = RULE(parents, tokens, np.ones_like(valid), valid, p, q, uniforms)
  n_ref = sampling.accept_tokenwise(u, drafts, q[:, :gamma], p, k)
  dist_ref = sampling.correction_distribution(n_ref, k, q[:, :gamma], p)
  np.testing.assert_array_equal(n_acc, n_ref)
  np.testing.assert_array_equal(dist, dist_ref)
  prefix = np.minimum(np.arange(gamma + 1)[None], np.asarray(n_ref)[:, None])
  np.testing.assert_array_equal(path, prefix)
  assert len(set(np.asarray(n_ref).tolist())) == gamma + 1  # every prefix length occurs


def test_draft_equal_to_target_accepts_the_first_sampled_child():
  rs = np.random.RandomState(4)
  p_tab, _ = make_table(5)
  tree = build_trees(rs, ROWS, p_tab, p_tab, void=0.0)  # ROWS: RULE's compiled shapes
  only = tree['sampled'] | (np.arange(N)[None] == 0)  # drop the guesses: sampled nodes only
  path, n_acc, _ = RULE(tree['parents'], tree['tokens'], tree['sampled'], only, tree['p'],
                        tree['p'], rs.random((ROWS, N)).astype(np.float32), max_depth=KMAX)
  par = tree['parents']
  for row in range(200):  # the walk follows the first sampled child down to a leaf
    node, depth = 0, 0
    while True:
      kids = [j for j in range(1, N) if only[row, j] and par[row, j] == node]
      if not kids:
        break
      node, depth = kids[0], depth + 1
    assert (int(np.asarray(n_acc)[row]), int(np.asarray(path)[row, depth])) == (depth, node)


GREEDY = jax.jit(tree_accept.accept_greedy, static_argnames='max_depth')


def test_greedy_equals_walking_the_targets_argmax():
  rs = np.random.RandomState(7)
  b, n, v = 3000, 12, 3
  parents = np.stack([np.concatenate([[-1], [rs.randint(i) for i in range(1, n)]])
                      for _ in range(b)]).astype(np.int32)
  tokens = rs.randint(v, size=(b, n)).astype(np.int32)
  valid = rs.random((b, n)) > 0.15
  valid[:, 0] = True
  table = rs.randint(v, size=200)  # the target's argmax after a path, by its hash
  paths = [[()] * n for _ in range(b)]
  argmax = np.zeros((b, n), np.int32)
  for row in range(b):
    for i in range(n):
      if i:
        paths[row][i] = paths[row][parents[row, i]] + (int(tokens[row, i]),)
      argmax[row, i] = table[hash(paths[row][i]) % 200]
  path, n_acc, bonus = map(np.asarray, GREEDY(parents, tokens, argmax, valid))
  for row in range(b):
    greedy = []  # the target's own greedy continuation
    while len(greedy) < n:
      greedy.append(int(table[hash(tuple(greedy)) % 200]))
    ok = [i for i in range(n) if all(valid[row, a] for a in _ancestors(parents[row], i))
          and list(paths[row][i]) == greedy[:len(paths[row][i])]]
    best = max(ok, key=lambda i: (len(paths[row][i]), -i))
    assert n_acc[row] == len(paths[row][best]) and bonus[row] == greedy[n_acc[row]]
    assert path[row, n_acc[row]] == best and path[row, 0] == 0
  assert np.bincount(n_acc).size >= 4  # accepted depths 0..3 at least


def _ancestors(parents, i):
  out = [i]
  while out[-1] > 0:
    out.append(int(parents[out[-1]]))
  return out


def test_greedy_chain_reduces_to_sampling_accept_greedy():
  rs = np.random.RandomState(8)
  b, gamma = 5000, 5
  _, _, drafts, _, k, parents, tokens, valid = _chain(rs, b, gamma, v=2)
  target = rs.randint(2, size=(b, gamma + 1)).astype(np.int32)
  path, n_acc, bonus = GREEDY(parents, tokens, target, valid)
  n_ref = np.asarray(sampling.accept_greedy(drafts, target, k))
  np.testing.assert_array_equal(n_acc, n_ref)
  np.testing.assert_array_equal(bonus, target[np.arange(b), n_ref])
