"""Adaptive draft lengths (gamma_policy): still exact, and the draft count really varies."""

import numpy as np
import pytest

from conftest import random_inputs
from specdec_t5x import generate
from specdec_t5x.algorithm import sampling
from specdec_t5x.algorithm.config import GammaPolicy

import test_distribution as td

POLICIES = {'confidence': GammaPolicy('confidence', threshold=0.35),
            'running_alpha': GammaPolicy('running_alpha', cost_ratio=0.05)}


@pytest.mark.parametrize('name', sorted(POLICIES))
def test_greedy_adaptive_equals_greedy_target(target_and_draft, name):
  target, draft = target_and_draft
  enc = random_inputs(4, 9, 40, seed=3)
  ar = generate(target, enc, max_decode_length=14, eos_id=-1)
  for gamma in (2, 6):
    sp = generate(target, enc, draft=draft, gamma=gamma, max_decode_length=14, eos_id=-1,
                  gamma_policy=POLICIES[name])
    np.testing.assert_array_equal(sp.tokens, ar.tokens, err_msg=f'gamma={gamma}')
    fixed = generate(target, enc, draft=draft, gamma=gamma, max_decode_length=14, eos_id=-1)
    hist = np.asarray(sp.stats['draft_length_histogram'])
    # The draft count varies beyond the fixed policy's (which shrinks only near max_len).
    assert np.count_nonzero(hist[1:]) >= 2, hist
    assert not np.array_equal(hist, np.asarray(fixed.stats['draft_length_histogram'])), hist


def test_fixed_policy_is_the_default(target_and_draft):
  """Without a gamma_policy every step drafts gamma tokens (fewer only where max_len leaves
  no room), as 'fixed' does; an adaptive policy on the same run drafts other lengths."""
  target, draft = target_and_draft
  enc = random_inputs(2, 9, 40, seed=5)
  kw = dict(draft=draft, gamma=3, max_decode_length=24, temperature=1.0, eos_id=-1)
  default = generate(target, enc, **kw)
  hist = np.asarray(default.stats['draft_length_histogram'])
  calls = int(np.sum(default.stats['target_calls']))
  assert hist.sum() == calls
  # Fewer than gamma only once room < gamma: at most gamma such steps per row (2 rows).
  assert hist[3] >= calls - 2 * 3 and hist[3] > 0.8 * calls
  fixed = generate(target, enc, gamma_policy='fixed', **kw)
  np.testing.assert_array_equal(default.tokens, fixed.tokens)
  np.testing.assert_array_equal(hist, fixed.stats['draft_length_histogram'])
  adaptive = generate(target, enc, gamma_policy=POLICIES['running_alpha'], **kw)
  assert not np.array_equal(hist, adaptive.stats['draft_length_histogram'])


def test_confidence_policy_stops_on_a_flat_draft():
  """A uniform draft (max q = 1/V) never passes a 0.5 threshold: one draft per step."""
  from specdec_t5x.algorithm.drafts import UnigramDraft
  import jax.numpy as jnp
  target = td.make_model(td.tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)
  flat = (UnigramDraft(td.VOCAB), {'logits': jnp.zeros((td.VOCAB,))})
  out = generate(target, np.repeat(td.ENC, 8, 0), draft=flat, gamma=4, temperature=1.0,
                 max_decode_length=6, eos_id=-1, gamma_policy='confidence')
  hist = np.asarray(out.stats['draft_length_histogram'])
  assert hist[2:].sum() == 0 and hist[1] > 0


@pytest.mark.parametrize('name', sorted(POLICIES))
def test_adaptive_matches_exact_target_distribution(name):
  target = td.make_model(td.tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)
  draft = td.make_model(td.tiny_config(vocab=td.VOCAB, emb=16, layers=1), seed=11,
                        logit_scale=1.5)
  cfg = sampling.SamplingConfig(1.0)
  exact = td.exact_probabilities(target, td.ENC, cfg)
  counts = td.sample_counts(target, draft, td.ENC, cfg, seed=8, gamma=3,
                            gamma_policy=POLICIES[name])
  assert td.chi2_pvalue(exact, counts) > 1e-3


def test_block_verifier_with_running_alpha_is_exact():
  target = td.make_model(td.tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)
  draft = td.make_model(td.tiny_config(vocab=td.VOCAB, emb=16, layers=1), seed=11,
                        logit_scale=1.5)
  cfg = sampling.SamplingConfig(1.0)
  exact = td.exact_probabilities(target, td.ENC, cfg)
  counts = td.sample_counts(target, draft, td.ENC, cfg, seed=9, gamma=3, verifier='block',
                            gamma_policy=POLICIES['running_alpha'])
  assert td.chi2_pvalue(exact, counts) > 1e-3


def test_bad_policy_raises(target_and_draft):
  target, draft = target_and_draft
  with pytest.raises(ValueError, match='gamma_policy'):
    generate(target, random_inputs(1, 4, 40), draft=draft, max_decode_length=4,
             gamma_policy='sometimes')
  with pytest.raises(ValueError, match='block'):
    generate(target, random_inputs(1, 4, 40), draft=draft, max_decode_length=4,
             gamma_policy='confidence', verifier='block')
