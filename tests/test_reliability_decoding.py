"""Reliability of `generate`: bad token ids, non-finite
numerics and bad arguments raise clear errors instead of returning silent garbage."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_inputs
from specdec_t5x import generate
from specdec_t5x.algorithm import sampling


@pytest.mark.parametrize('value,dtype', [(5000, np.int32), (-3, np.int32),
                                         (2 ** 31 + 5, np.int64)],
                         ids=['too_large', 'negative', 'int64_overflow'])
def test_out_of_range_token_ids_are_named(target_and_draft, value, dtype):
  target, _ = target_and_draft
  enc = random_inputs(2, 9, 40, seed=0).astype(dtype)
  enc[1, 3] = value
  with pytest.raises(ValueError, match=rf'encoder_input_tokens\[1, 3\] = {value} .*'
                                       r'\[0, 40\)'):
    generate(target, enc, max_decode_length=8)
  with pytest.raises(ValueError, match=rf'\[1, 3\] = {value}'):  # jax arrays too
    generate(target, jnp.asarray(enc) if dtype == np.int32 else enc, max_decode_length=8)


def test_valid_ids_at_the_vocabulary_edge_pass(target_and_draft):
  target, _ = target_and_draft
  enc = random_inputs(2, 9, 40, seed=1).astype(np.int64)
  enc[0, 0] = 39
  assert generate(target, enc, max_decode_length=8).tokens.shape == (2, 8)


@pytest.mark.parametrize('temperature', [float('nan'), float('inf'), -1.0])
def test_non_finite_or_negative_temperature_is_rejected(target_and_draft, temperature):
  target, _ = target_and_draft
  with pytest.raises(ValueError, match=r'temperature must be a finite number >= 0'):
    generate(target, random_inputs(1, 9, 40), max_decode_length=4, temperature=temperature)


def test_tiny_temperature_is_argmax_not_nan(target_and_draft):
  """As T -> 0 sampling tends to greedy (no ties in random logits): same tokens, no NaN.
  (Before: softmax(logits / 1e-10) was NaN under jit and every row came back padding.)"""
  target, draft = target_and_draft
  enc = random_inputs(3, 9, 40, seed=2)
  greedy = generate(target, enc, max_decode_length=10, eos_id=-1).tokens
  for d in (None, draft):
    out = generate(target, enc, draft=d, gamma=3, max_decode_length=10, eos_id=-1,
                   temperature=1e-10, rng=jax.random.PRNGKey(3))
    np.testing.assert_array_equal(out.tokens, greedy)
    assert np.all(np.asarray(out.stats['generated_tokens']) == 10)


def test_tiny_temperature_splits_ties_evenly():
  logits = jnp.array([[1.0, 3.0, 3.0, -2.0]])
  for temperature in (1e-10, 1e-30, 1e-45, 1e-300):
    p = jax.jit(lambda x, t=temperature: sampling.standardize(
        x, sampling.SamplingConfig(t)))(logits)
    np.testing.assert_array_equal(p, [[0.0, 0.5, 0.5, 0.0]])
  p = jax.jit(lambda x: sampling.standardize(x, sampling.SamplingConfig(1e-10, topk=2)))(logits)
  np.testing.assert_array_equal(p, [[0.0, 0.5, 0.5, 0.0]])


def _nan(model_and_params):
  module, params = model_and_params
  return module, jax.tree_util.tree_map(lambda x: x * jnp.nan, params)


@pytest.mark.parametrize('speculative', [False, True])
def test_nan_params_raise_instead_of_padding(target_and_draft, speculative):
  """Greedy AR and sampled speculative: healthy params flag nothing; NaN target (or NaN
  draft) params raise, naming the model, instead of returning all-padding rows."""
  target, draft = target_and_draft
  enc = random_inputs(2, 9, 40, seed=4)
  kw = dict(draft=draft, temperature=1.0) if speculative else dict(draft=None)
  out = generate(target, enc, max_decode_length=6, **kw)
  assert not np.asarray(out.stats['nonfinite_target_logits']).any()
  assert not np.asarray(out.stats['nonfinite_draft_logits']).any()
  with pytest.raises(FloatingPointError, match=r'The target model produced NaN or infinite '
                                               r'logits for batch rows \[0, 1\].*target params'):
    generate(_nan(target), enc, max_decode_length=6, **kw)
  if speculative:
    with pytest.raises(FloatingPointError, match=r'The draft model produced NaN'):
      generate(target, enc, max_decode_length=6, **dict(kw, draft=_nan(draft)))


@pytest.mark.parametrize('kwargs,pattern', [
    (dict(eos_id=None), r'eos_id must be an integer token id.*got None'),
    (dict(eos_id=1.5), r'eos_id must be an integer'),
], ids=['eos_none', 'eos_float'])
def test_bad_eos_id(target_and_draft, kwargs, pattern):
  target, _ = target_and_draft
  with pytest.raises(ValueError, match=pattern):
    generate(target, random_inputs(1, 9, 40), max_decode_length=4, **kwargs)


def test_empty_batch_is_a_clear_error(target_and_draft):
  target, _ = target_and_draft
  with pytest.raises(ValueError, match=r'encoder_input_tokens is empty \(shape \(0, 9\)\)'):
    generate(target, np.zeros((0, 9), np.int32), max_decode_length=4)


# ------------------------------- decode settings against the models, before any tracing


def _no_trace(monkeypatch):
  """Makes any compilation of the decode fail loudly: the checks must come first."""
  from specdec_t5x.algorithm import api  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(api, 'compiled_program', lambda *a, **k: pytest.fail('traced before checks'))


@pytest.mark.parametrize('kwargs,pattern', [
    (dict(topk=41), r'topk must be <= the vocabulary size \(40\), got 41'),
    (dict(gamma=9), r'gamma must be <= max_decode_length \(8\).*got 9'),
    (dict(gamma=10000), r'gamma must be <= 64 \(MAX_GAMMA'),
    (dict(topk=2.5), r'topk must be an integer >= 0 \(0 = off\), got 2.5'),
    (dict(topp='0.5'), r"topp must be a number, got '0.5'"),
    (dict(lenience=None), r'lenience must be a number, got None'),
], ids=['topk_over_vocab', 'gamma_over_length', 'gamma_huge', 'topk_float', 'topp_str',
        'lenience_none'])
def test_decode_settings_checked_against_the_models(target_and_draft, monkeypatch, kwargs,
                                                    pattern):
  target, draft = target_and_draft
  _no_trace(monkeypatch)
  with pytest.raises(ValueError, match=pattern):
    generate(target, random_inputs(1, 9, 40), draft=draft, max_decode_length=8, **kwargs)


def test_gamma_bound_applies_to_drafting_only(target_and_draft):
  """Without a draft gamma is unused; the largest gamma a decode can take still decodes
  exactly (greedy: the target's tokens)."""
  target, draft = target_and_draft
  enc = random_inputs(2, 9, 40, seed=3)
  ar = generate(target, enc, max_decode_length=3, gamma=4)
  sp = generate(target, enc, draft=draft, max_decode_length=3, gamma=3)
  np.testing.assert_array_equal(sp.tokens, ar.tokens)


def test_gamma_policy_numbers_must_be_finite():
  from specdec_t5x.algorithm.config import GammaPolicy  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r'cost_ratio must be a finite number >= 0, got nan'):
    GammaPolicy('running_alpha', cost_ratio=float('nan'))
  with pytest.raises(ValueError, match=r"gamma_policy threshold must be a number, got 'x'"):
    GammaPolicy('confidence', threshold='x')
