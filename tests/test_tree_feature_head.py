"""A draft tree whose chain a feature head drafts (feature_draft.py): the head's chain, a
copy branch and the head's runner-up tokens (siblings) in one target call, and the next
step's head call reading the target's features along the accepted path.

* Greedy: token for token the target's greedy decoding (batch 1 and 3, EOS mid-batch, a
  decoder prompt, a reduced draft vocabulary), and the copy branch raises tokens per call
  above the head's chain alone. The plumbing: each step's first head call, recorded from
  inside the compiled loop, reads the target's features along the accepted path, also
  after a step that accepted copied tokens.
* Sampled: test_distribution's enumerated law (V = 4, 5 tokens) by chi-square for t = 1
  and top-k with a reduced draft vocabulary (whose siblings are ids of that vocabulary),
  every branch of a step and MIN_BRANCH accepted tokens from each kind of node; the rule
  that accepts a fixed guess with p(x) instead of the residual fails the same test.
* What a head's tree cannot take raises: more siblings beside the head's own pick, or a
  wider dynamic tree level, than its reduced draft vocabulary has ids (the head's dynamic
  trees: test_dynamic_tree_head.py).
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_inputs
import test_distribution as td
import test_tree_decoding as ttd
from test_feature_draft import make_head
from specdec_t5x import generate
from specdec_t5x.algorithm import api, sampling
from specdec_t5x.algorithm.cpu import packing
from specdec_t5x.algorithm.trees import accept as tree_accept
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import forcing

REDUCED = tuple(range(1, ttd.VOCAB, 3))  # the greedy cases' reduced draft vocabulary
GREEDY = {  # name: (batch, gamma, copy_branch, draft_siblings, draft vocabulary, prompt)
    'b3_g3_c4_s21_eos': (3, 3, 4, (2, 1), (), False),
    'b3_g2_s1_reduced_eos': (3, 2, 0, 1, REDUCED, False),
    'b1_g3_c2_s1_prompt': (1, 3, 2, 1, (), True),
}


@pytest.mark.parametrize('name', list(GREEDY))
def test_greedy_head_tree_equals_greedy_target(target_and_draft, name):
  batch, gamma, c, siblings, vocab, with_prompt = GREEDY[name]
  target = target_and_draft[0]
  head = make_head(target[1], ttd.VOCAB, draft_vocab=vocab)
  totals = collections.Counter()
  runs = ttd.greedy_runs(target, head, batch, gamma, with_prompt, max(gamma, c),
                         copy_branch=c, draft_siblings=siblings)
  compare = c and not with_prompt  # the chain's path is in the tree: copies raise tokens/call
  for enc, args, _, s in runs:
    if not compare:
      continue
    chain = generate(target, enc, draft=head, gamma=gamma, **args)
    for key, st in (('tree', s), ('chain', chain.stats)):
      for field in ('generated_tokens', 'target_calls', 'accepted_tokens', 'by_copy'):
        value = st['accepted_by_source'][1] if field == 'by_copy' else st[field]
        totals[key, field] += int(np.sum(value))
  if compare:
    rate = {k: totals[k, 'generated_tokens'] / totals[k, 'target_calls']
            for k in ('tree', 'chain')}
    assert totals['tree', 'by_copy'] > 0 and rate['tree'] > rate['chain'], (rate, dict(totals))


def _first_head_calls(target, head, enc, config, max_len):
  """One decode of each row of enc (batch 1, no EOS) -> (its output tokens, and per row:
  per step the head's first call: (tokens [1, D + 1], positions [1], features [1, D + 1, F],
  pick [1]), and the accepted tokens by source [3]), recorded from inside the compiled
  loop."""
  calls = []

  def wrap(name, fn):
    def call(cache, tokens, positions, *args, **tree):
      if name == 'draft' and len(args) == 2:  # the step's first call: features and pick
        jax.debug.callback(lambda *a: calls.append([np.asarray(x) for x in a]), tokens,
                           positions, *args, ordered=True)
      return fn(cache, tokens, positions, *args, **tree)
    return call

  program = jax.jit(api.decode_program(target[0], head[0], max_len=max_len, config=config,
                                       wrap=wrap))
  variables = [packing.decode_variables(*model, config.cpu_kernels) for model in (target, head)]
  outputs, steps = [], []
  for row in enc:
    calls.clear()
    tokens, stats = program(*variables, row[None], jax.random.PRNGKey(0), jnp.int32(-1))
    outputs.append(np.asarray(tokens))
    steps.append((list(calls), np.asarray(stats['accepted_by_source'])))
  return np.concatenate(outputs), steps


def check_first_head_calls(target, head, config, seeds=3):
  """Decodes the target's own outputs (ttd._own_output, batch 1) with `config` and checks
  that each step's first head call re-feeds the last step's accepted path: up to the kept
  position its tokens are the output's and its features the target's teacher-forced ones
  before each. Returns per row the accepted tokens by source [3]."""
  enc = np.concatenate([ttd._own_output(target, 1, seed) for seed in range(seeds)])
  tokens, steps = _first_head_calls(target, head, enc, config, ttd.L)
  dec_in = forcing.shift_right(tokens)
  before = np.asarray(forcing.features(*target, enc, dec_in)[2])
  for r, (calls, _) in enumerate(steps):
    assert len(calls) >= 2, (r, len(calls))
    for fed, (start,), features, (pick,) in calls:
      window = slice(start, start + pick + 1)
      np.testing.assert_array_equal(fed[0, :pick + 1], np.asarray(dec_in)[r, window])
      np.testing.assert_allclose(features[0, :pick + 1], before[r, window], atol=1e-4,
                                 err_msg=f'row {r}, step at {start}')
  return [by_source for _, by_source in steps]


def test_the_heads_first_call_reads_the_targets_features_along_the_path(target_and_draft):
  """Each step's first head call re-feeds the last step's accepted path with the target's
  features (a gather in node order would give a copied token's step the chain's)."""
  target = target_and_draft[0]
  accepted = check_first_head_calls(target, make_head(target[1], ttd.VOCAB),
                                    DecodeConfig(gamma=2, copy_branch=3))
  assert all(a[1] > 0 for a in accepted), accepted  # every row accepted copies
  assert sum(a[1] for a in accepted) >= 3


SAMPLED = {  # name: (sampling, copy_branch, draft_siblings, draft vocabulary, seed)
    't1_copy_siblings': (sampling.SamplingConfig(1.0), 3, 1, (), 31),
    'topk3_reduced_siblings': (sampling.SamplingConfig(1.0, topk=3), 2, (1, 1), (0, 1, 3), 32),
}


@pytest.fixture(scope='module')
def dist_target():
  return td.make_model(td.tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)


def _head_tree_pvalue(target, name):
  cfg, c, siblings, vocab, seed = SAMPLED[name]
  head = make_head(target[1], td.VOCAB, seed=12, draft_vocab=vocab)
  exact = td.exact_probabilities(target, ttd.ENC, cfg)
  counts = td.sample_counts(target, head, ttd.ENC, cfg, seed=seed, gamma=ttd.GAMMA,
                            copy_branch=c, draft_siblings=siblings,
                            sources=('copy_branch', 'draft_siblings'))
  return td.chi2_pvalue(exact, counts)


@pytest.mark.parametrize('name', list(SAMPLED))
def test_sampled_head_tree_matches_exact_target_distribution(dist_target, name):
  assert _head_tree_pvalue(dist_target, name) > 1e-3


def test_head_tree_guess_accepted_with_p_is_detected(dist_target, monkeypatch):
  """The control: t1_copy_siblings with a fixed guess accepted with p(x) after a rejected
  sibling instead of the residual r(x) must fail."""
  monkeypatch.setattr(tree_accept, 'accept_sampled', ttd._guess_accepted_with_p)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  assert _head_tree_pvalue(dist_target, 't1_copy_siblings') < 1e-6


@pytest.mark.parametrize('settings', [dict(draft_siblings=3), dict(draft_tree_width=4)])
def test_what_a_head_tree_cannot_take_raises(target_and_draft, settings):
  """More siblings beside the head's pick, or a wider level, than its reduced draft
  vocabulary has ids; the whole vocabulary takes them."""
  target = target_and_draft[0]
  head = make_head(target[1], ttd.VOCAB, draft_vocab=(1, 4, 7))
  with pytest.raises(ValueError, match='reduced draft vocabulary'):
    generate(target, random_inputs(1, 4, ttd.VOCAB), draft=head, gamma=2, max_decode_length=4,
             **settings)
  head = make_head(target[1], ttd.VOCAB)
  out = generate(target, random_inputs(1, 4, ttd.VOCAB), draft=head, gamma=2,
                 max_decode_length=4, rng=jax.random.PRNGKey(0), **settings)
  assert np.asarray(out.stats['target_calls']).sum() >= 1
