"""Tests of specdec_t5x/evaluation.py and the evaluation scripts (tiny models made here)."""

import json
import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import load_script, make_model, random_inputs, tiny_config
from specdec_t5x.algorithm import sampling, theory, timing
from specdec_t5x.research.measure import evaluation, grid, speed
from test_infer import _flags, env  # pylint: disable=unused-import  (tiny ckpts, mock WMT)

pytestmark = pytest.mark.slow  # the results' scripts and tables, run end to end


@pytest.fixture(autouse=True)
def _unlock_gin():
  yield
  gin.clear_config()


@pytest.fixture(scope='module')
def models():
  target = make_model(tiny_config(), seed=0, logit_scale=3.0)
  draft = make_model(tiny_config(emb=16, layers=1), seed=1, logit_scale=3.0)
  enc = random_inputs(5, 9, 40, seed=3, min_len=3)
  return target, draft, enc


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_alpha_of_identical_models_is_one(models, temperature):
  target, _, enc = models
  cfg = sampling.SamplingConfig(temperature)
  outs = evaluation.target_outputs(target, enc, cfg, max_len=8, batch=4)
  assert len(outs) == len(enc) and all(1 <= len(o) <= 8 for o in outs)
  beta = evaluation.betas(target, target, enc, outs, cfg, batch=4)
  assert beta.shape == (sum(map(len, outs)),)
  np.testing.assert_allclose(beta, 1.0, atol=1e-5)


def test_betas_equal_sum_min_of_standardised_distributions(models):
  target, draft, enc = models
  cfg = sampling.SamplingConfig(0.7, topk=5)
  outs = evaluation.target_outputs(target, enc[:2], cfg, max_len=6, batch=4)
  beta = evaluation.betas(target, draft, enc[:2], outs, cfg)
  # The same quantity computed by hand on the first sequence.
  dec = np.asarray(outs[0], np.int32)[None]  # [1, len]
  dec_in = np.concatenate([np.zeros((1, 1), np.int32), dec[:, :-1]], 1)
  p = sampling.standardize(target[0].apply({'params': target[1]}, enc[:1], dec_in), cfg)
  q = sampling.standardize(draft[0].apply({'params': draft[1]}, enc[:1], dec_in), cfg)
  by_hand = np.minimum(np.asarray(p), np.asarray(q)).sum(-1)[0]
  np.testing.assert_allclose(beta[:len(outs[0])], by_hand, atol=1e-5)
  assert 0.0 < beta.mean() < 1.0
  np.testing.assert_allclose(theory.alpha_from_distributions(np.asarray(p)[0], np.asarray(q)[0]),
                             by_hand.mean(), atol=1e-5)


def test_alpha_per_position_from_histogram():
  # 10 steps: 2 accepted none, 3 accepted one, 5 accepted both (gamma = 2).
  assert evaluation.alpha_per_position([2, 3, 5]) == [0.8, 5 / 8]
  assert evaluation.alpha_per_position([4, 0, 0]) == [0.0, None]


@pytest.mark.parametrize('alpha,gamma', [(0.0, 3), (0.3, 1), (0.62, 7), (0.95, 4)])
def test_alpha_fit_inverts_expected_tokens(alpha, gamma):
  tokens = float(theory.expected_tokens_per_step(alpha, gamma))
  assert theory.alpha_from_tokens_per_call(tokens, gamma) == pytest.approx(alpha, abs=1e-6)


def test_speculative_stats_self_draft_accepts_everything(models):
  target, _, enc = models
  stats = speed.speculative_stats(target, target, enc, sampling.SamplingConfig(0.0), 3, 8)
  assert stats['accepted_tokens'] == stats['drafted_tokens'] > 0
  assert evaluation.alpha_per_position(stats['accepted_length_histogram'])[0] == 1.0


def test_sweep_rows(models):
  target, draft, enc = models
  cost = {'t_target_step': 1e-3, 't_draft_step_d': 1e-4, 't_draft_step_self': 1e-3,
          't_verify_2': 1.2e-3, 't_verify_3': 1.3e-3}  # call costs: see the paper-row test
  res = speed.sweep(target, {'d': draft, 'self': target}, enc[:2], 4, [1, 2],
                         sampling.SamplingConfig(0.0), cost, repeats=1, alphas={'self': 1.0})
  for name, d in res['drafts'].items():
    assert [r['gamma'] for r in d['rows']] == [1, 2]
    assert d['chosen_gamma'] in (1, 2) and isinstance(d['chosen_within_10pct_of_best'], bool)
    for r in d['rows']:
      assert r['same_tokens_as_ar'] == 2  # greedy speculative == greedy target
      assert r['efficiency'] == pytest.approx(r['speedup_measured'] / r['speedup_ideal'])
      assert 1.0 <= r['tokens_per_target_call'] <= r['gamma'] + 1
  assert res['drafts']['self']['alpha_source'] == 'given'
  assert all(r['alpha'] == r['acceptance_rate'] == 1.0 for r in res['drafts']['self']['rows'])


def test_costs_measure_calls_and_prefill_separately(models):
  target, draft, enc = models
  cost = grid.costs(target, {'d': draft}, enc, [2], num_calls=2, repeats=1, max_len=8)
  assert set(cost) == {'t_target_step', 't_prefill_target', 't_draft_step_d',
                       't_prefill_draft_d', 't_verify_3'}
  assert all(v > 0 for v in cost.values())
  # The 0-call program still computes the encoder and cache (its result depends on them),
  # so the encoder cancels out of call_cost's difference instead of being dead code.
  module, params = target
  run = timing._repeated_extend(module, 1, 12)  # pylint: disable=protected-access
  doubled = jax.tree_util.tree_map(lambda x: 2 * x, params)
  e = jnp.asarray(enc[:1])
  assert not np.allclose(np.asarray(run({'params': params}, e, 0)),
                         np.asarray(run({'params': doubled}, e, 0)))


def test_timed_calls_are_chained_like_a_decode(models):
  """call_costs' program feeds each call the argmax of the last call's logits (a decode's
  dependence), not one fixed token; its result is every call's last logit, plus the cache."""
  (module, params), _, enc = models
  e = jnp.asarray(enc[:2])
  variables = {'params': params}
  cache_len, k = 12, 2
  run = timing._repeated_extend(module, k, cache_len)  # pylint: disable=protected-access
  encoded = module.apply(variables, e, method='encode')
  cache = module.apply(variables, encoded, e, cache_len, method='init_cache')
  seen = sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(cache)
             if jnp.issubdtype(x.dtype, jnp.floating))
  tokens, want, fed = jnp.full((2, k), 3, jnp.int32), seen, []
  for i in range(3):
    fed.append(np.asarray(tokens))
    logits, cache = module.apply(variables, cache, tokens, jnp.full((2,), i, jnp.int32),
                                 method='extend')
    want = want + logits[:, -1, 0]
    tokens = sampling.argmax(logits)
  assert any((f != 3).any() for f in fed[1:])  # the chain moved off the first token
  np.testing.assert_allclose(np.asarray(run(variables, e, 3)), np.asarray(want), rtol=1e-5)


def test_ideal_end_to_end_counts_prefill():
  cost = {'t_prefill_target': 5.0, 't_prefill_draft_d': 1.0, 't_target_step': 1.0,
          't_draft_step_d': 0.1, 't_verify_3': 1.5}
  # 2 sequences, AR 20 calls, speculative 8 calls of gamma 2:
  want = (2 * 5.0 + 20 * 1.0) / (2 * 6.0 + 8 * (2 * 0.1 + 1.5))
  assert grid.ideal_end_to_end(2, 20, 8, 2, cost, 'd') == pytest.approx(want)
  no_prefill = dict(cost, t_prefill_target=0.0, t_prefill_draft_d=0.0)
  # Without prefill it is the paper's ideal: tokens/call * t_t / (g t_d + t_v).
  assert grid.ideal_end_to_end(2, 20, 8, 2, no_prefill, 'd') == pytest.approx(
      (20 / 8) * 1.0 / (2 * 0.1 + 1.5))
  # As the loop makes the calls: each step's first draft call the 2-token re-feed.
  made = dict(cost, t_draft_refeed_d=0.16)
  assert grid.ideal_end_to_end(2, 20, 8, 2, made, 'd', refeed=True) == pytest.approx(
      (2 * 5.0 + 20 * 1.0) / (2 * 6.0 + 8 * (0.16 + 0.1 + 1.5)))


def test_speedup_table_runs_a_paper_row_config(env, tmp_path):
  """configs/spec_t5_small_xxl.gin unchanged, tiny checkpoints, mocked WMT data."""
  out = tmp_path / 'speedup'
  flags = [f for f in _flags(env, None, output_dir=False)]
  result = load_script('compare_decodes').main(
      ['--experiment=speedup_table'] + flags + [
          '--gammas', '1,2', '--num_examples', '2', '--repeats', '1', '--cost_calls', '2',
          '--cost_repeats', '1', '--out', str(out)])
  (group,) = result['groups']
  assert group['task'] == 'specdec_wmt_t2t_ende_v003' and group['temperature'] == 0.0
  (draft,) = group['drafts'].values()
  assert [r['gamma'] for r in draft['rows']] == [1, 2]
  assert all(r['same_tokens_as_ar'] == 2 for r in draft['rows'])
  saved = json.loads(pathlib.Path(f'{out}.json').read_text())
  assert saved['command'].startswith(
      'python scripts/compare_decodes.py --experiment=speedup_table --gin_file=')
  assert '| specdec_wmt_t2t_ende_v003 |' in pathlib.Path(f'{out}.md').read_text()
  assert pathlib.Path(f'{out}_specdec_wmt_t2t_ende_v003.png').stat().st_size > 0
