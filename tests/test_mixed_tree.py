"""Mixed draft trees: the draft's (or a feature head's) dynamic tree with a copy branch
grafted onto it (DecodeConfig.draft_tree_width with copy_branch; decode/dynamic_tree.py
and trees/build.graft_copy), verified in one target call, exactly.

* The graft: a guess the tree already holds is merged into the tree's node (void), the
  next guess hangs below that node; the first guess the tree lacks starts a chain of new
  nodes; guesses past the known tokens or the row's room are void, with the rest of the
  branch.
* Greedy: token for token the target's greedy decoding (batch 1 and 3, EOS mid-batch, a
  decoder prompt, reranked nodes, a model draft, a noisy copy of the target and a feature
  head), copied tokens accepted, and more tokens per target call than the same tree
  without the copy branch.
* Sampled: test_distribution's enumerated law (V = 4, 5 tokens) by chi-square, top-W
  levels at t = 1 and top-k, levels drawn from q without replacement, every outcome of a
  step and MIN_BRANCH copied tokens occurring; a rule that accepts a guess with p(x)
  after a rejected sibling instead of the residual fails the same test, and so does
  testing the drawn levels' nodes as i.i.d. draws.
"""

import collections

import jax.numpy as jnp
import numpy as np
import pytest

import test_distribution as td
import test_tree_decoding as ttd
from test_feature_draft import make_head
from test_tree_decoding import ENC, models  # pylint: disable=unused-import
from specdec_t5x import generate
from specdec_t5x.algorithm import api, sampling
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.trees import accept as tree_accept
from specdec_t5x.algorithm.trees.build import graft_copy


def test_graft_merges_guesses_the_tree_holds():
  # root 9; nodes 1: 5 (root's), 2: 6 (root's), 3: 7 (below 1), 4: 8 (below 1, void)
  tokens = jnp.array([[9, 5, 6, 7, 8]] * 3)
  parents = jnp.array([[-1, 0, 0, 1, 1]] * 3)
  valid = jnp.array([[True, True, True, True, False]] * 3)
  copy = jnp.array([[5, 7, 3, 4],  # 5, 7 in the tree: 3 below node 3, 4 below it
                    [5, 8, 2, 2],  # 8's node is void: 8 is a new node below node 1
                    [4, 5, 7, 1]])  # 4 is not a child of the root: all new nodes
  known = jnp.array([[True] * 4, [True] * 4, [True, True, True, False]])
  limit = jnp.array([4, 3, 4])
  t, p, v = map(np.asarray, graft_copy(tokens, parents, valid, copy, known, limit))
  np.testing.assert_array_equal(t[:, 5:], copy)
  np.testing.assert_array_equal(p[:, :5], parents)
  np.testing.assert_array_equal(p[:, 5:], [[0, 1, 3, 7], [0, 1, 6, 7], [0, 5, 6, 7]])
  np.testing.assert_array_equal(v[:, 5:], [[False, False, True, True],
                                           [False, True, True, False],  # depth 4 > limit 3
                                           [True, True, True, False]])  # not known


GREEDY = {  # name: (batch, gamma, width, nodes kept, copy_branch, draft, decoder prompt)
    'b3_g2_w2_c4_eos': (3, 2, 2, 0, 4, 'model', False),
    'b1_g3_w2_n3_c3_noisy': (1, 3, 2, 3, 3, 'noisy', False),
    'b3_g2_w2_n3_c3_head_eos': (3, 2, 2, 3, 3, 'head', False),
    'b1_g2_w3_c2_prompt': (1, 2, 3, 0, 2, 'model', True),
}


@pytest.mark.parametrize('name', list(GREEDY))
def test_greedy_mixed_tree_equals_greedy_target(target_and_draft, name):
  batch, gamma, width, nodes, c, kind, with_prompt = GREEDY[name]
  target, model = target_and_draft
  draft = {'model': model, 'noisy': (target[0], ttd._noisy(target[1])),
           'head': make_head(target[1], ttd.VOCAB)}[kind]
  tree = dict(draft_tree_width=width, draft_tree_nodes=nodes)
  totals, source = collections.Counter(), np.zeros(3, np.int64)
  for enc, args, _, s in ttd.greedy_runs(target, draft, batch, gamma, with_prompt,
                                         max(gamma, c), copy_branch=c, **tree):
    source += s['accepted_by_source']
    if with_prompt:
      continue
    alone = generate(target, enc, draft=draft, gamma=gamma, **args, **tree).stats
    for key, st in (('mixed', s), ('alone', alone)):
      for field in ('generated_tokens', 'target_calls'):
        totals[key, field] += int(np.sum(st[field]))
  assert source[1] > 0 and source[2] == 0, source  # copied tokens accepted; no siblings
  if not with_prompt:  # the tree's paths are all there: copied tokens beyond them pay
    rate = {k: totals[k, 'generated_tokens'] / totals[k, 'target_calls'] for k in
            ('mixed', 'alone')}
    assert rate['mixed'] > rate['alone'], rate


SAMPLED = {  # name: (sampling, gamma, width, nodes kept, copy_branch, drawn levels, seed)
    't1_w2_c3': (sampling.SamplingConfig(1.0), 2, 2, 0, 3, False, 41),
    'topk3_g2_w2_n3_c2': (sampling.SamplingConfig(1.0, topk=3), 2, 2, 3, 2, False, 42),
    't1_g2_w2_drawn_c3': (sampling.SamplingConfig(1.0), 2, 2, 0, 3, True, 43),
}


def _pvalue(target, draft, name):
  cfg, gamma, width, nodes, c, drawn, seed = SAMPLED[name]
  exact = td.exact_probabilities(target, ENC, cfg)
  counts = td.sample_counts(target, draft, ENC, cfg, seed=seed, gamma=gamma,
                            draft_tree_width=width, draft_tree_nodes=nodes, copy_branch=c,
                            draft_tree_sampled=drawn, sources=('copy_branch',))
  return td.chi2_pvalue(exact, counts)


@pytest.mark.parametrize('name', list(SAMPLED))
def test_sampled_mixed_tree_matches_exact_target_distribution(models, name):
  target, draft = models
  assert _pvalue(target, draft, name) > 1e-3


def test_guess_accepted_with_p_instead_of_the_residual_is_detected(models, monkeypatch):
  target, draft = models
  monkeypatch.setattr(tree_accept, 'accept_sampled', ttd._guess_accepted_with_p)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  assert _pvalue(target, draft, 't1_w2_c3') < 1e-6


def test_draws_verified_as_iid_children_are_detected(models, monkeypatch):
  """The control for drawn levels beside the copy branch: the draws tested as if drawn
  i.i.d. (q at the parent, not each draw's own law without the earlier draws), the
  t1_g2_w2_drawn_c3 test must fail."""
  target, draft = models
  rule = tree_accept.accept_sampled
  monkeypatch.setattr(tree_accept, 'accept_sampled', lambda *a, without_replacement=False,
                      **k: rule(*a, **k))
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  assert _pvalue(target, draft, 't1_g2_w2_drawn_c3') < 1e-6


def test_mixed_tree_settings():
  config = DecodeConfig(gamma=3, draft_tree_width=2, draft_tree_nodes=4, copy_branch=3)
  assert config.tree and config.tree_nodes == 7 and config.tree_call_nodes == 7
  with pytest.raises(ValueError, match='draft_tree_width'):
    DecodeConfig(gamma=3, draft_tree_width=2, copy_branch=3, draft_siblings=1)
