"""research/measure/tree_bound.py: teacher-forced ranks and the best static draft trees they allow,
against brute force."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_inputs
from specdec_t5x import generate
from specdec_t5x.algorithm import sampling
from specdec_t5x.algorithm.drafts import UnigramDraft
from specdec_t5x.research.measure import evaluation, tree_bound

pytestmark = pytest.mark.slow  # a results table's tooling


def test_ranks_order_by_logit_then_by_id():
  rs = np.random.RandomState(0)
  logits = rs.randint(0, 4, size=(30, 7)).astype(np.float32)  # many ties
  tokens = rs.randint(0, 7, size=30)
  expected = [[int(i) for i in sorted(range(7), key=lambda i: (-row[i], i))].index(t)
              for row, t in zip(logits, tokens)]
  np.testing.assert_array_equal(tree_bound.token_ranks(logits, tokens), expected)


def test_shares_and_values_count_the_starts_a_path_begins():
  rows = [np.array([0, 0, 1, 0, 2, 0, 0, 0, 1, 0])]
  shares = tree_bound.path_shares(rows, 3)
  assert shares[(0,)] == 0.7 and shares[(0, 0)] == 0.3 and shares[(0, 0, 0)] == 0.1
  assert shares[(1,)] == 0.2 and shares[(0, 1)] == 0.2 and (0, 0, 0, 0) not in shares
  assert tree_bound.tree_value(shares, tree_bound.chain(3)) == pytest.approx(1.1)
  with pytest.raises(ValueError, match='not a tree'):
    tree_bound.tree_value(shares, [(0,), (1, 0)])


def _trees(paths, n):
  """Every prefix-closed set of n of `paths` (brute force)."""
  for nodes in itertools.combinations(paths, n):
    if all(len(p) == 1 or p[:-1] in nodes for p in nodes):
      yield list(nodes)


def _chain_with_siblings(nodes):
  """Whether `nodes` is a chain with leaf siblings of ranks 1..k beside its tokens."""
  gamma = max((len(p) for p in nodes if set(p) == {0}), default=0)
  leaves = [p for p in nodes if p != (0,) * len(p)]
  return gamma > 0 and all(set(p[:-1]) <= {0} and len(p) <= gamma
             and all(p[:-1] + (k,) in nodes for k in range(1, p[-1])) for p in leaves)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_best_trees_are_the_best_by_brute_force(seed):
  rs = np.random.RandomState(seed)
  rows = [rs.choice(4, size=rs.randint(3, 12), p=[0.55, 0.25, 0.15, 0.05]) for _ in range(6)]
  shares = tree_bound.path_shares(rows, 4)
  paths = sorted(shares)
  for n in (1, 2, 3, 4):
    trees = list(_trees(paths, n))
    value = lambda nodes: tree_bound.tree_value(shares, nodes)
    best = tree_bound.best_tree(shares, n)
    assert value(best) == pytest.approx(max(map(value, trees)))
    siblings = tree_bound.best_chain_with_siblings(shares, n)
    assert _chain_with_siblings(siblings) and len(siblings) <= n
    assert value(siblings) == pytest.approx(max(value(t) for t in trees
                                                if _chain_with_siblings(t)))
    assert value(tree_bound.chain(n)) <= value(siblings) <= value(best)


def test_a_draft_equal_to_the_target_ranks_every_greedy_token_first(target_and_draft):
  """Teacher forcing aligns each token with the logits that chose it: the target's own
  greedy tokens are its rank-0 choices, and another draft's ranks are not all 0."""
  target, draft = target_and_draft
  enc = random_inputs(4, 9, 40, seed=2)
  outputs = evaluation.target_outputs(target, enc, sampling.SamplingConfig(), 12, batch=4)
  own = tree_bound.ranks(target, enc, outputs)
  assert [len(r) for r in own] == [len(o) for o in outputs]
  assert all(np.all(r == 0) for r in own)
  assert any(np.any(r > 0) for r in tree_bound.ranks(draft, enc, outputs))


def test_decode_value_replays_steps():
  rows = [np.array([0, 0, 1, 0, 2, 0, 0, 0, 1, 0])]  # steps of 3, 2, 3, 1, 1 tokens
  assert tree_bound.decode_value(rows, tree_bound.chain(2)) == 2.0
  assert tree_bound.siblings(2, (1,)) == [(0,), (0, 0), (1,)]
  assert tree_bound.decode_value(rows, tree_bound.siblings(2, (1,))) == 10 / 4  # 3, 2, 3, 2
  copied = [np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0])]
  copied[0][3] = 3  # a copy of 3 right tokens at position 3: steps of 3, 4, 2, 1
  assert tree_bound.decode_value(rows, tree_bound.chain(2), copied) == 10 / 4
  best = tree_bound.best_decoded_tree(rows, tree_bound.path_shares(rows, 3), 3)
  assert tree_bound.decode_value(rows, best) >= 10 / 4


def test_an_ngram_continuation_beside_the_root_is_its_chain():
  """A deterministic draft's greedy continuation, verified as fixed guesses from the root,
  accepts what its own chain would: its run of right picks from each start."""
  rows = [np.array([0, 0, 1, 0, 2, 0, 0, 0, 1, 0])]
  assert tree_bound.pick_runs(rows[0], 2).tolist() == [2, 1, 0, 1, 0, 2, 2, 1, 0, 1]
  rs = np.random.RandomState(0)
  for n in (1, 3, 5):
    rand = [rs.choice(3, size=size, p=[0.7, 0.2, 0.1]) for size in (1, 9, 30)]
    assert tree_bound.decode_value(rand, [], [tree_bound.pick_runs(r, n) for r in rand]) == (
        tree_bound.decode_value(rand, tree_bound.chain(n)))
  # beside another draft's chain of 1, a step takes the longer match: steps of 3, 2, 3, 1
  # and 1 token instead of the chain's 7 steps
  other = [np.array([1, 0, 0, 0, 1, 1, 0, 0, 2, 0])]
  assert tree_bound.decode_value(other, tree_bound.chain(1)) == 10 / 7
  assert tree_bound.decode_value(other, tree_bound.chain(1),
                                 [tree_bound.pick_runs(rows[0], 2)]) == 10 / 5


@pytest.mark.parametrize('gamma', [1, 3])
def test_replayed_chains_are_the_decodes_tokens_per_call(target_and_draft, gamma):
  """A greedy speculative decode accepts exactly the runs of rank-0 tokens: the replay of
  the chain gives its tokens per target call, EOS and max_len included."""
  target, draft = target_and_draft
  enc = random_inputs(4, 9, 40, seed=7)
  outputs = evaluation.target_outputs(target, enc, sampling.SamplingConfig(), 14, batch=4,
                                      eos_id=3)
  assert len({len(o) for o in outputs}) > 2  # EOS ends rows at different lengths
  rows = tree_bound.ranks(draft, enc, outputs)
  out = generate(target, enc, draft=draft, gamma=gamma, max_decode_length=14, eos_id=3)
  calls = int(np.sum(out.stats['target_calls']))
  assert int(np.sum(out.stats['generated_tokens'])) == sum(map(len, rows))
  assert tree_bound.decode_value(rows, tree_bound.chain(gamma)) == pytest.approx(
      sum(map(len, rows)) / calls, rel=1e-12)


def _view(ranks, own, top):
  return tree_bound.DraftView(np.asarray(ranks), np.asarray(own, np.float64),
                              np.asarray(top, np.float64))


def test_dynamic_trees_take_the_nodes_of_largest_path_probability():
  top = [[0.9, 0.05], [0.5, 0.4], [0.9, 0.1]]
  sure = _view([0, 0, 0], [0.9, 0.5, 0.9], top)  # path 0.9, 0.45 beat rivals 0.05, 0.36
  assert tree_bound.dynamic_value([sure], 2) == 3.0  # both accepted, then the bonus
  # the second token, the draft's runner-up: its path 0.27 loses to its sibling 0.54
  unsure = _view([0, 1, 0], [0.9, 0.3, 0.9], [[0.9, 0.05], [0.6, 0.3], [0.9, 0.1]])
  assert tree_bound.dynamic_value([unsure], 2) == 1.5  # steps of 2 tokens, then 1
  assert tree_bound.dynamic_value([unsure], 3) == 3.0  # a third node takes it in


@pytest.mark.parametrize('seed', [0, 1])
def test_a_dynamic_tree_of_one_node_is_the_chain_of_one(seed):
  rs = np.random.RandomState(seed)
  logits = rs.normal(size=(20, 6))
  probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  tokens = rs.randint(0, 6, size=20)
  view = _view(tree_bound.token_ranks(logits, tokens), probs[np.arange(20), tokens],
               -np.sort(-probs, axis=1))
  assert tree_bound.dynamic_value([view], 1) == tree_bound.decode_value([view.ranks],
                                                                        tree_bound.chain(1))


@pytest.mark.parametrize('gamma,copy', [(2, 3), (0, 4)])
def test_replayed_copy_trees_are_the_decodes_tokens_per_call(target_and_draft, gamma, copy):
  """A greedy step with the chain and a copy branch accepts the longer of their matches with
  the target's tokens: the replay gives generate's tokens per target call (gamma 0: the copy
  branch beside a chain of one draft token that is never right)."""
  target, draft = target_and_draft
  enc = random_inputs(4, 16, 40, seed=7)
  outputs = evaluation.target_outputs(target, enc, sampling.SamplingConfig(), 16, batch=4,
                                      eos_id=3)
  copied = [tree_bound.copy_runs(e, o, copy, max_len=16) for e, o in zip(enc, outputs)]
  assert sum(int(c.sum()) for c in copied) > 0  # some copies are right
  if gamma:
    rows, kw = tree_bound.ranks(draft, enc, outputs), dict(draft=draft, gamma=gamma)
  else:  # a useless draft: q one-hot on token 0, which the target never emits
    rows = [np.ones(len(o), np.int64) for o in outputs]
    kw = dict(draft=(UnigramDraft(40), {'logits': jnp.zeros((40,), jnp.float32)}), gamma=1)
  out = generate(target, enc, copy_branch=copy, max_decode_length=16, eos_id=3, **kw)
  calls = int(np.sum(out.stats['target_calls']))
  assert int(np.sum(out.stats['generated_tokens'])) == sum(map(len, rows))
  nodes = tree_bound.chain(gamma)
  assert tree_bound.decode_value(rows, nodes, copied) == pytest.approx(
      sum(map(len, rows)) / calls, rel=1e-12)
