"""The draft's own dynamic tree (DecodeConfig.draft_tree_width;
algorithm/decode/dynamic_tree.py): each step the draft grows gamma levels of W nodes, each
level the W children of largest draft path probability, one draft tree call per level, and
ONE target call verifies all 1 + W * gamma nodes, exactly.

* Greedy: token for token the target's greedy decoding (batch 1 and 3, EOS mid-batch, a
  decoder prompt, W 1..3, gamma 1..3), the counters consistent; with a draft whose first
  choice is often wrong and whose second is often right, more tokens per target call than
  the chain of the same gamma (the tree's other branches are accepted).
* Sampled: test_distribution's enumerated law (V = 4, 5 tokens) by chi-square for
  temperature 1, top-k and top-p, every outcome of a step occurring MIN_BRANCH times; the
  rule that accepts a guess with p(x) after a rejected sibling instead of the residual
  fails the same test.
* Levels DRAWN from q without replacement (draft_tree_sampled): the same law at t = 1
  (depth 3) and top-p (void draws), and verifying the draws as if i.i.d. fails it; at
  temperature 0 the flag leaves the greedy top-W tree.
* Settings and drafts the tree cannot take raise, naming draft_tree_width.
"""

import collections

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_inputs
import test_distribution as td
from test_tree_decoding import (ENC, VOCAB, _guess_accepted_with_p, _noisy, greedy_runs,
                                models)  # pylint: disable=unused-import
from specdec_t5x import generate
from specdec_t5x.algorithm import api, sampling
from specdec_t5x.algorithm.trees import accept as tree_accept
from specdec_t5x.algorithm.trees import build
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.drafts import CopyDraft, UnigramDraft

GREEDY = {  # name: (batch, gamma, width, nodes kept, draft, decoder prompt, drawn levels)
    'b1_g1_w2': (1, 1, 2, 0, 'noisy', False, False),
    'b3_g3_w2_eos': (3, 3, 2, 0, 'noisy', False, False),
    'b3_g3_w2_n3_eos': (3, 3, 2, 3, 'noisy', False, False),
    'b3_g2_w3_n4_model_eos': (3, 2, 3, 4, 'model', False, False),
    'b1_g3_w1_prompt': (1, 3, 1, 0, 'noisy', True, False),
    # draft_tree_sampled at temperature 0: the top-W tree, greedy as ever
    'b1_g2_w2_drawn': (1, 2, 2, 0, 'noisy', False, True),
}


@pytest.mark.parametrize('name', list(GREEDY))
def test_greedy_dynamic_tree_equals_greedy_target(target_and_draft, name):
  batch, gamma, width, nodes, kind, with_prompt, drawn = GREEDY[name]
  target, model = target_and_draft
  draft = {'model': model, 'noisy': (target[0], _noisy(target[1]))}[kind]
  totals = collections.Counter()
  compare = width == 1 or kind == 'noisy'  # the cases that compare with the chain
  for enc, args, _, s in greedy_runs(target, draft, batch, gamma, with_prompt, gamma,
                                     draft_tree_width=width, draft_tree_nodes=nodes,
                                     draft_tree_sampled=drawn):
    assert s['accepted_by_source'][1:].sum() == 0  # every node is the draft's
    if not compare:
      continue
    chain = generate(target, enc, draft=draft, gamma=gamma, **args)
    for key, st in (('tree', s), ('chain', chain.stats)):
      for field in ('generated_tokens', 'target_calls'):
        totals[key, field] += int(np.sum(st[field]))
  if not compare:
    return
  rate = {k: totals[k, 'generated_tokens'] / totals[k, 'target_calls'] for k in ('tree', 'chain')}
  if width == 1:  # one node per level: the draft's greedy chain, verified as a tree
    assert rate['tree'] == rate['chain'], rate
  else:  # the noisy draft's runner-ups are often right: the other branches pay, also
    assert rate['tree'] > rate['chain'], rate  # at as many positions as the chain (n3)


SAMPLED = {  # name: (sampling, gamma, width, nodes kept, levels drawn from q, seed)
    't1_w2': (sampling.SamplingConfig(1.0), 2, 2, 0, False, 31),
    'topk3_g3_w2_n3': (sampling.SamplingConfig(1.0, topk=3), 3, 2, 3, False, 32),
    'topp0.8_w3': (sampling.SamplingConfig(1.0, topp=0.8), 2, 3, 0, False, 33),
    # levels drawn without replacement: depth 3 at width 2; the nucleus often holds fewer
    # tokens than a level's 3 draws (void nodes)
    't1_g3_w2_drawn': (sampling.SamplingConfig(1.0), 3, 2, 0, True, 34),
    'topp0.8_w3_drawn': (sampling.SamplingConfig(0.8, topp=0.8), 2, 3, 0, True, 35),
}


def _pvalue(target, draft, name):
  cfg, gamma, width, nodes, drawn, seed = SAMPLED[name]
  exact = td.exact_probabilities(target, ENC, cfg)
  counts = td.sample_counts(target, draft, ENC, cfg, seed=seed, gamma=gamma,
                            draft_tree_width=width, draft_tree_nodes=nodes,
                            draft_tree_sampled=drawn)
  return td.chi2_pvalue(exact, counts)


@pytest.mark.parametrize('name', list(SAMPLED))
def test_sampled_dynamic_tree_matches_exact_target_distribution(models, name):
  target, draft = models
  assert _pvalue(target, draft, name) > 1e-3


def test_guess_accepted_with_p_instead_of_the_residual_is_detected(models, monkeypatch):
  """The control: with a guess accepted with probability p(x) after a rejected sibling
  instead of r(x), the t1_w2 test must fail (half the vocabulary is guessed per level)."""
  target, draft = models
  monkeypatch.setattr(tree_accept, 'accept_sampled', _guess_accepted_with_p)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  assert _pvalue(target, draft, 't1_w2') < 1e-6


def test_draws_verified_as_iid_children_are_detected(models, monkeypatch):
  """The control for levels drawn without replacement: tested as if drawn i.i.d. (q at
  the parent, not each draw's own law without the earlier draws), the t1_g3_w2_drawn test
  must fail."""
  target, draft = models
  rule = tree_accept.accept_sampled
  monkeypatch.setattr(tree_accept, 'accept_sampled', lambda *a, without_replacement=False,
                      **k: rule(*a, **k))
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  assert _pvalue(target, draft, 't1_g3_w2_drawn') < 1e-6


@pytest.mark.parametrize('settings', [
    dict(draft_tree_width=-1), dict(draft_tree_width=9), dict(draft_tree_width=1.5),
    dict(draft_tree_width='2'),
    dict(draft_tree_width=2, draft_siblings=1), dict(draft_tree_width=2, gamma='auto'),
    dict(draft_tree_width=2, verifier='block'), dict(draft_tree_width=2, lenience=0.5),
    dict(draft_tree_width=2, gamma_policy='confidence'), dict(draft_tree_nodes=1),
    dict(gamma=2, draft_tree_width=2, draft_tree_nodes=5),
    dict(gamma=2, draft_tree_width=2, draft_tree_nodes=-1), dict(draft_tree_sampled=True),
    dict(gamma=2, draft_tree_width=2, draft_tree_nodes=3, draft_tree_sampled=True),
    dict(draft_tree_width=2, draft_tree_sampled=1)],
    ids=lambda s: '-'.join(f'{k}={v}' for k, v in s.items()))
def test_settings_the_tree_cannot_take_raise(settings):
  with pytest.raises(ValueError, match='draft_tree_width'):
    DecodeConfig(**settings)


def test_rerank_keeps_the_best_nodes_as_a_tree():
  """Of a grown tree (levels of 2), the 3 nodes of largest log path probability, in grown
  order, parents renumbered; a child tied with its parent comes after it."""
  # nodes 1, 2 (level 1, parents root), 3, 4 (level 2, parents 2 and 1)
  parents = jnp.asarray([[-1, 0, 0, 2, 1], [-1, 0, 0, 1, 1]])
  tokens = jnp.asarray([[9, 5, 6, 7, 8], [9, 5, 6, 7, 8]])
  scores = jnp.asarray([[-1.0, -0.5, -0.6, -2.0], [-0.1, -3.0, -0.1, -0.2]])
  got_tokens, got_parents, kept = build.rerank(scores, tokens, parents, 3)
  np.testing.assert_array_equal(kept, [[0, 1, 2, 3], [0, 1, 3, 4]])
  np.testing.assert_array_equal(got_tokens, [[9, 5, 6, 7], [9, 5, 7, 8]])
  np.testing.assert_array_equal(got_parents, [[-1, 0, 0, 2], [-1, 0, 1, 1]])


@pytest.mark.parametrize('draft', ['unigram', 'copy', 'none'])
def test_drafts_the_tree_cannot_grow_with_raise(target_and_draft, draft):
  target, _ = target_and_draft
  draft = {'unigram': (UnigramDraft(VOCAB), {'logits': np.zeros((VOCAB,), np.float32)}),
           'copy': (CopyDraft(VOCAB), {}), 'none': None}[draft]
  with pytest.raises(ValueError, match='draft_tree_width'):
    generate(target, random_inputs(1, 4, VOCAB), draft=draft, gamma=2, draft_tree_width=2,
             max_decode_length=4)


def test_a_tree_wider_than_the_vocabulary_raises(models):
  target, draft = models
  with pytest.raises(ValueError, match='draft_tree_width'):
    generate(target, ENC, draft=draft, gamma=2, draft_tree_width=td.VOCAB + 1,
             max_decode_length=4)
