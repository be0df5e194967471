"""A head that reads several target layers (FeatureDraftConfig.feature_layers, EAGLE-3's
fusion): the target hands it its final features and the RMS-normalised outputs of the
chosen decoder layers, the same from the cached calls as teacher forced, and speculative
decoding with such a head stays exact (greedy token for token, replayed acceptances, the
enumerated sampling distribution, the broken-rule control)."""

import collections

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import jit_apply, make_model, random_inputs, tiny_config
import test_distribution as td
from test_decoding import _eos_mid_batch
from test_feature_draft import make_head, replay_accepted
from specdec_t5x import generate
from specdec_t5x.algorithm import api, feature_draft
from specdec_t5x.research.measure import forcing


@pytest.fixture(scope='module')
def target():
  return make_model(tiny_config(vocab=16, emb=32, layers=3), seed=1)


def test_fused_features_are_the_final_ones_then_each_tapped_layer_normalised(target):
  module, params = target
  enc = random_inputs(2, 5, 16, seed=1)
  tokens = np.random.RandomState(2).randint(2, 16, (2, 7)).astype(np.int32)
  _, final, _ = module.apply({'params': params}, enc, tokens, method='features')
  (_, fused, encoded), seen = module.apply(
      {'params': params}, enc, tokens, None, (0, 2), method='features',
      capture_intermediates=lambda mdl, name: name == '__call__' and 'layers_' in mdl.name)
  assert final.shape == (2, 7, 32) and fused.shape == (2, 7, 96)
  np.testing.assert_array_equal(fused[..., :32], final)
  for i, layer in enumerate((0, 2), 1):
    out = seen['intermediates']['decoder'][f'layers_{layer}']['__call__'][0]
    rms = jnp.sqrt(jnp.mean(out * out, -1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(fused[..., 32 * i:32 * (i + 1)], out / rms, rtol=1e-5,
                               atol=1e-5)
  # The cached calls (three positions, then the rest one at a time) hand out the same.
  cache = jit_apply(module, {'params': params}, encoded, enc, 8, method='init_cache')
  dec_in = np.asarray(forcing.shift_right(tokens))
  got = []
  for start, stop in ((0, 3), (3, 4), (4, 5), (5, 6), (6, 7)):
    _, cache, f = jit_apply(module, {'params': params}, cache, dec_in[:, start:stop],
                            jnp.full(2, start), True, (0, 2), method='extend')
    got.append(f)
  _, want, _ = jit_apply(module, {'params': params}, enc, dec_in, None, (0, 2), method='features')
  np.testing.assert_allclose(jnp.concatenate(got, 1), want, atol=1e-4)


@pytest.mark.parametrize('bad', [(2, 1), (-1,), (1, 1), [0], (True,), (1.0,)])
def test_bad_feature_layers_are_refused(bad):
  with pytest.raises(ValueError, match='feature_layers'):
    feature_draft.FeatureDraftConfig(vocab_size=8, target_emb_dim=4, feature_layers=bad)


def test_a_head_reading_a_layer_the_target_lacks_is_refused(target):
  head = make_head(target[1], 16, feature_layers=(1, 3))
  with pytest.raises(ValueError, match='3 decoder layers'):
    generate(target, random_inputs(1, 4, 16), draft=head, gamma=2, max_decode_length=4)


@pytest.mark.parametrize('gamma', [3])  # gamma 1 and 4: test_feature_draft.py
def test_greedy_acceptances_replay_the_teacher_forced_passes(target, gamma):
  """The loop feeds the head the fused features of its accepted prefix: its acceptances
  equal a replay of the head's teacher-forced passes over the output."""
  head = make_head(target[1], 16, feature_layers=(0, 1), seed=0)
  enc = random_inputs(4, 6, 16, seed=5)
  out = generate(target, enc, draft=head, gamma=gamma, max_decode_length=16, eos_id=-1)
  tokens = np.asarray(out.tokens)
  dec_in = forcing.shift_right(tokens)
  _, _, before, encoded = forcing.features(*target, enc, dec_in, None, (0, 1))
  passes = jit_apply(head[0], {'params': head[1]}, encoded, enc, dec_in, before, passes=gamma)
  expected = replay_accepted(passes, tokens, gamma, 16)
  assert expected.sum() > 0
  np.testing.assert_array_equal(np.asarray(out.stats['accepted_tokens']), expected)


@pytest.mark.parametrize('batch', [4])  # batch 1: test_feature_draft.py
def test_greedy_equals_autoregressive(batch):
  target = make_model(tiny_config(vocab=40, emb=32, layers=2), seed=1)
  head = make_head(target[1], 40, feature_layers=(0,))
  enc = random_inputs(batch, 9, 40, seed=0)
  eos = _eos_mid_batch(target, enc, 14) if batch > 1 else 1
  ar = generate(target, enc, max_decode_length=14, eos_id=eos)
  for gamma in (1, 3, 8):
    spec = generate(target, enc, draft=head, gamma=gamma, max_decode_length=14, eos_id=eos)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens),
                                  err_msg=f'gamma={gamma}')


@pytest.fixture(scope='module')
def dist_models():
  target = make_model(tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)  # as there
  return target, make_head(target[1], td.VOCAB, feature_layers=(0, 1), seed=12)


@pytest.mark.parametrize('cfg', td.CASES[0::2], ids=['t1', 'topk3'])  # test_feature_draft: the others
def test_sampling_matches_exact_target_distribution(dist_models, cfg):
  target, head = dist_models
  exact = td.exact_probabilities(target, td.ENC, cfg)
  counts = td.sample_counts(target, head, td.ENC, cfg, seed=24, gamma=2)
  assert td.chi2_pvalue(exact, counts) > 1e-3


def test_the_head_fed_the_final_features_only_is_detected(target, monkeypatch):
  """The control: the target's callback hands the head its final features, the fused
  slots zeroed (a target extend that ignores feature_layers). The output distribution
  stays the target's (exactness does not depend on the draft), but the acceptances no
  longer replay the teacher-forced passes."""
  head = make_head(target[1], 16, feature_layers=(0, 1), seed=0)
  enc = random_inputs(4, 6, 16, seed=5)
  real = api._extend_fn  # pylint: disable=protected-access

  def final_only(module, variables, *extra):
    fn = real(module, variables, *extra)
    if not extra:
      return fn
    def wrapped(cache, tokens, positions, *args):
      logits, cache, feats = fn(cache, tokens, positions, *args)
      return logits, cache, feats.at[..., 32:].set(0.0)
    return wrapped

  monkeypatch.setattr(api, '_extend_fn', final_only)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  out = generate(target, enc, draft=head, gamma=3, max_decode_length=16, eos_id=-1)
  tokens = np.asarray(out.tokens)
  np.testing.assert_array_equal(tokens, np.asarray(
      generate(target, enc, max_decode_length=16, eos_id=-1).tokens))
  dec_in = forcing.shift_right(tokens)
  _, _, before, encoded = forcing.features(*target, enc, dec_in, None, (0, 1))
  passes = jit_apply(head[0], {'params': head[1]}, encoded, enc, dec_in, before, passes=3)
  assert not np.array_equal(np.asarray(out.stats['accepted_tokens']),
                            replay_accepted(passes, tokens, 3, 16))


def test_broken_rule_with_a_fused_head_is_detected(dist_models, monkeypatch):
  assert td.broken_rule_pvalue(*dist_models, monkeypatch, seed=24) < 1e-6
