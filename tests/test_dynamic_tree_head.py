"""A feature head's own dynamic tree (DecodeConfig.draft_tree_width with a feature_draft.py
head; algorithm/decode/dynamic_tree.py): EAGLE-2's expansion for an encoder-decoder target.
The head's first call re-reads the accepted path with the target's features; each level is
one head TREE call in which every node reads its parent's predicted feature (the root: the
target's feature before it); ONE target call verifies the tree, and the next step's head
reads the target's features along the accepted path.

* Greedy: token for token the target's greedy decoding (batch 1 and 3, EOS mid-batch, a
  decoder prompt, a reduced draft vocabulary, reranked nodes). At W = 1 the tree is the
  head's own greedy chain: recorded from inside the compiled loop, every target call
  verifies the tokens the chain's does, so a node fed the wrong feature (which greedy
  output alone would never show) fails it; each step's first head call reads the
  target's features along the last accepted path, whichever branch it took.
* Sampled: test_distribution's enumerated law (V = 4, 5 tokens) by chi-square, top-W
  levels at t = 1 with a reduced draft vocabulary, and levels drawn from the head's q
  without replacement under top-k; every outcome of a step occurs MIN_BRANCH times. The
  acceptance rules and their broken controls are test_dynamic_tree.py's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_distribution as td
import test_tree_decoding as ttd
from test_feature_draft import make_head
from test_tree_feature_head import (check_first_head_calls,
                                    dist_target)  # pylint: disable=unused-import
from specdec_t5x import generate
from specdec_t5x.algorithm import api, sampling
from specdec_t5x.algorithm.cpu import packing
from specdec_t5x.algorithm.config import DecodeConfig

REDUCED = tuple(range(1, ttd.VOCAB, 3))
GREEDY = {  # name: (batch, gamma, width, nodes kept, draft vocabulary, decoder prompt)
    'b3_g3_w1_eos': (3, 3, 1, 0, (), False),  # the head's chain as a tree
    'b3_g3_w2_n4_reduced_eos': (3, 3, 2, 4, REDUCED, False),
    'b1_g2_w3_prompt': (1, 2, 3, 0, (), True),
}


@pytest.mark.parametrize('name', list(GREEDY))
def test_greedy_head_dynamic_tree_equals_greedy_target(target_and_draft, name):
  batch, gamma, width, nodes, vocab, with_prompt = GREEDY[name]
  target = target_and_draft[0]
  head = make_head(target[1], ttd.VOCAB, draft_vocab=vocab)
  for _, _, _, s in ttd.greedy_runs(target, head, batch, gamma, with_prompt, gamma,
                                    draft_tree_width=width, draft_tree_nodes=nodes):
    assert s['accepted_by_source'][1:].sum() == 0  # every node is the head's


def _verified(target, head, enc, config):
  """Per row of enc (batch 1, no EOS), the tokens of every target call, recorded from
  inside the compiled loop."""
  calls = []

  def wrap(name, fn):
    def call(cache, tokens, positions, *args, **tree):
      if name == 'target':
        jax.debug.callback(lambda x: calls.append(np.asarray(x)), tokens, ordered=True)
      return fn(cache, tokens, positions, *args, **tree)
    return call

  program = jax.jit(api.decode_program(target[0], head[0], max_len=ttd.L, config=config,
                                       wrap=wrap))
  variables = [packing.decode_variables(*model, config.cpu_kernels) for model in (target, head)]
  out = []
  for row in enc:
    calls.clear()
    program(*variables, row[None], jax.random.PRNGKey(0), jnp.int32(-1))
    out.append(np.concatenate(calls))
  return out


def test_a_one_wide_tree_verifies_the_heads_own_chain(target_and_draft):
  """At W = 1 each level's node is the head's pick after its parent, which it drafted
  reading its parent's predicted feature: every target call verifies the tokens the head's
  chain verifies (a node fed another feature drafts other tokens below it)."""
  target = target_and_draft[0]
  head = make_head(target[1], ttd.VOCAB)
  enc = np.concatenate([ttd._own_output(target, 1, seed) for seed in range(2)])
  tree = _verified(target, head, enc, DecodeConfig(gamma=3, draft_tree_width=1))
  chain = _verified(target, head, enc, DecodeConfig(gamma=3))
  for r, (got, want) in enumerate(zip(tree, chain)):
    assert got.shape == want.shape and got.shape[1] == 4, (r, got.shape, want.shape)
    assert len(np.unique(want[:, 2:], axis=0)) > 1  # deeper drafts vary from step to step
    np.testing.assert_array_equal(got, want, err_msg=f'row {r}')


def test_the_heads_first_call_reads_the_targets_features_along_the_path(target_and_draft):
  """After a step whose accepted path ran through any of a level's W nodes, the next step's
  first head call re-feeds that path with the target's features (the tree call's gathered
  along the path; in node order they would be the first branch's)."""
  target = target_and_draft[0]
  accepted = check_first_head_calls(target, make_head(target[1], ttd.VOCAB, seed=5),
                                    DecodeConfig(gamma=2, draft_tree_width=6))
  assert sum(int(a[0]) for a in accepted) >= 3, accepted


SAMPLED = {  # name: (sampling, gamma, width, nodes kept, drawn, draft vocabulary, seed)
    't1_g3_w2_n4_reduced': (sampling.SamplingConfig(1.0), 3, 2, 4, False, (0, 1, 3), 41),
    'topk3_w2_drawn': (sampling.SamplingConfig(1.0, topk=3), 2, 2, 0, True, (), 42),
}


@pytest.mark.parametrize('name', list(SAMPLED))
def test_sampled_head_dynamic_tree_matches_exact_target_distribution(dist_target, name):
  cfg, gamma, width, nodes, drawn, vocab, seed = SAMPLED[name]
  head = make_head(dist_target[1], td.VOCAB, seed=12, draft_vocab=vocab)
  exact = td.exact_probabilities(dist_target, ttd.ENC, cfg)
  counts = td.sample_counts(dist_target, head, ttd.ENC, cfg, seed=seed, gamma=gamma,
                            draft_tree_width=width, draft_tree_nodes=nodes,
                            draft_tree_sampled=drawn)
  assert td.chi2_pvalue(exact, counts) > 1e-3
