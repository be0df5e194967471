"""No silent skip on the decode path: a cache write that does not fit is reported by the
statistics and raised by generate, and a batch row decodes as it would alone (a dropped
write, or any coupling between rows, would change its acceptances)."""

import collections

import jax
import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x import generate
from specdec_t5x.algorithm import api
from specdec_t5x.algorithm.cpu import packing
from specdec_t5x.algorithm.decode import core
from specdec_t5x.algorithm.config import DecodeConfig
from test_feature_draft import make_head

VOCAB = 12


@pytest.fixture(scope='module')
def models():
  target = make_model(tiny_config(vocab=VOCAB), seed=20, logit_scale=2.0)
  draft = make_model(tiny_config(vocab=VOCAB, emb=16, layers=1), seed=21, logit_scale=2.0)
  return {'target': target, 'model draft': draft, 'feature head': make_head(target[1], VOCAB)}


@pytest.fixture
def fresh_programs(monkeypatch):
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())


@pytest.mark.parametrize('draft', [None, 'feature head'])  # the target's extend, the head's
def test_caches_too_small_are_reported_and_raised(models, draft, fresh_programs, monkeypatch):
  target, enc = models['target'], random_inputs(3, 7, VOCAB, seed=2)
  drafted = None if draft is None else models[draft]
  config = DecodeConfig(gamma=2)
  program = api.decode_program(target[0], drafted and drafted[0], max_len=6, config=config)
  args = (packing.decode_variables(*target), drafted and packing.decode_variables(*drafted), enc,
          jax.random.PRNGKey(0), 1)
  _, stats = jax.jit(program)(*args)
  assert not np.any(stats['skipped_cache_writes'])
  monkeypatch.setattr(core, 'cache_length', lambda *a: 3)  # positions 0..2 of 6
  _, stats = jax.jit(api.decode_program(target[0], drafted and drafted[0], max_len=6,
                                        config=config))(*args)
  assert np.all(stats['skipped_cache_writes'])  # every row's writes of that call were dropped
  with pytest.raises(RuntimeError, match='did not fit the decode cache'):
    generate(target, enc, draft=drafted, max_decode_length=6, config=config)
  traced = jax.jit(lambda x: generate(target, x, draft=drafted, max_decode_length=6,
                                      config=config).tokens)  # as T5X's infer calls it
  with pytest.raises(Exception, match='did not fit the decode cache'):
    jax.block_until_ready(traced(enc))


@pytest.mark.parametrize('draft,policy', [('model draft', 'fixed'), ('feature head', 'fixed'),
                                          ('model draft', 'confidence')])
def test_each_row_decodes_in_a_batch_as_it_does_alone(models, draft, policy):
  """Greedy: each row's tokens and every per-row counter (target calls, drafts, acceptances)
  are the same in a batch of rows of different lengths as alone; and the batch's step
  outcomes are the rows' summed."""
  target, drafted = models['target'], models[draft]
  enc = random_inputs(5, 9, VOCAB, seed=4, min_len=2)
  run = lambda x: generate(target, x, draft=drafted, gamma=3, max_decode_length=10,
                           gamma_policy=policy)
  batch = run(enc)
  outcomes = np.zeros(3, np.int64)
  for r in range(len(enc)):
    alone = run(enc[r:r + 1])
    np.testing.assert_array_equal(batch.tokens[r], alone.tokens[0])
    for key in ('target_calls', 'drafted_tokens', 'accepted_tokens', 'generated_tokens'):
      assert int(batch.stats[key][r]) == int(alone.stats[key][0]), (r, key)
    outcomes += np.asarray(alone.stats['step_outcomes'])
  np.testing.assert_array_equal(batch.stats['step_outcomes'], outcomes)
  lengths = np.asarray(batch.stats['generated_tokens'])
  assert len(set(lengths.tolist())) > 1, lengths  # rows finish at different steps
