"""gamma='auto' (specdec_t5x/auto_gamma.py): theory's gamma from measured call costs.

The choice itself is checked with call costs stubbed to known values (the machine's
timings are not asserted on); the measured path is checked to be consistent with theory
and to change no token.
"""

import json

import gin
import jax
import numpy as np
import pytest
from conftest import random_inputs

from specdec_t5x.algorithm import api, auto_gamma, timing
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration import infer, models, tasks

pytestmark = pytest.mark.slow  # gamma chosen for speed: not an exactness guard

ENC = random_inputs(1, 16, 40, seed=5, min_len=8)


def _stub_costs(t_target, t_draft, verify_ratio):
  """call_costs returning t_target, t_draft and t_verify_k = t_target (1 + r (k - 1))."""
  def call_costs(specs, enc, num_calls, repeats, cache_len):
    del enc, num_calls, repeats, cache_len
    out = {'t_target': t_target, 't_draft': t_draft}
    out.update({k: t_target * (1 + verify_ratio * (int(k.rsplit('_', 1)[1]) - 1))
                for k in specs if k.startswith('t_verify_')})
    return out
  return call_costs


def _paper_gamma(alpha, c, verify_ratio=0.0, max_gamma=auto_gamma.MAX_GAMMA):
  """(best gamma, its improvement) by brute force over g = 1..max_gamma of the paper's
  (1 - alpha^(g+1)) / ((1 - alpha)(g c + 1)), the verify call costing 1 + verify_ratio g
  target steps instead of 1 (verify_ratio: a number, or one per g)."""
  g = np.arange(1, max_gamma + 1)
  improvement = (1 - alpha ** (g + 1)) / ((1 - alpha) * (g * c + 1 + verify_ratio * g))
  return int(g[np.argmax(improvement)]), float(improvement.max())


@pytest.mark.parametrize('alpha, c, verify_ratio, expected', [
    (0.9, 0.01, 0.0, 8),  # cheap draft, free verification, high alpha: the longest gamma
    (0.1, 0.5, 0.0, 1),  # poor draft: one draft per call
    (0.7, 0.22, 0.13, 2)])  # the demo's c and verify/target ratio at gamma 3 (1.4)
def test_choice_is_theorys_argmax_of_the_costs(monkeypatch, target_and_draft, alpha, c,
                                               verify_ratio, expected):
  monkeypatch.setattr(timing, 'call_costs', _stub_costs(1.0, c, verify_ratio))
  target, draft = target_and_draft
  choice = auto_gamma.choose_gamma(target, draft, ENC, alpha=alpha, max_len=8)
  best, improvement = _paper_gamma(alpha, c, verify_ratio)
  assert choice['gamma'] == expected == best
  assert choice['c'] == pytest.approx(c)
  assert choice['predicted_improvement'] == pytest.approx(improvement)


def test_measured_choice_is_consistent_with_its_costs(target_and_draft):
  target, draft = target_and_draft
  choice = auto_gamma.choose_gamma(target, draft, ENC, alpha=0.6, max_len=8, max_gamma=3,
                                   num_calls=4, repeats=1)
  costs = choice['costs_s']
  assert sorted(costs) == ['t_draft', 't_target', 't_verify_2', 't_verify_3', 't_verify_4']
  assert all(v > 0 for v in costs.values())
  t_target = costs['t_target']
  ratio = np.array([(costs[f't_verify_{g + 1}'] / t_target - 1) / g for g in (1, 2, 3)])
  best, improvement = _paper_gamma(0.6, costs['t_draft'] / t_target, ratio, max_gamma=3)
  assert choice['gamma'] == best
  assert choice['predicted_improvement'] == pytest.approx(improvement)


def test_warmup_alpha_of_a_perfect_draft_is_one(target_and_draft):
  target, _ = target_and_draft
  alpha = auto_gamma.warmup_alpha(target, target, ENC, max_len=10, gamma=4, eos_id=-1,
                                  rng=jax.random.PRNGKey(0), config=DecodeConfig())
  assert alpha > 0.99  # 5 tokens per target call: every draft accepted


def test_warmup_plans_with_the_runs_full_configuration(target_and_draft):
  """gamma='auto' fits alpha to a warm-up with the run's own lenience, verifier and policy:
  a lenient run accepts more, so it plans with a larger alpha than the exact one."""
  target, draft = target_and_draft
  enc = random_inputs(4, 9, 40, seed=3)
  alpha = lambda **kw: auto_gamma.warmup_alpha(
      target, draft, enc, max_len=10, eos_id=-1, rng=jax.random.PRNGKey(0),
      config=DecodeConfig(gamma='auto', temperature=1.0, **kw))
  exact, lossy = alpha(), alpha(lenience=0.05)
  assert 0.0 < exact < lossy <= 1.0
  # An adaptive policy drafts fewer tokens per step: alpha counts the lengths it drafted.
  assert alpha(gamma_policy='running_alpha') == pytest.approx(exact, abs=0.25)


def test_auto_model_decodes_the_greedy_tokens(monkeypatch, target_and_draft):
  monkeypatch.setattr(timing, 'call_costs', _stub_costs(1.0, 0.22, 0.13))
  (t_module, t_params), (d_module, d_params) = target_and_draft
  model = models.StandaloneSpeculativeModel(
      t_module, draft_module=d_module, draft_params=d_params, max_decode_length=10,
      decode_config=DecodeConfig(gamma='auto', gamma_alpha=0.5))
  assert model.describe()['gamma'] == 'auto' and model.describe()['gamma_alpha'] == 0.5
  enc = random_inputs(2, 16, 40, seed=6, min_len=8)
  tokens, _, _ = model.predict_batch_with_stats(t_params, {'encoder_input_tokens': enc})
  best, improvement = _paper_gamma(0.5, 0.22, 0.13)
  assert model.run_config.gamma == model.gamma_choice['gamma'] == best == 1  # 1.11x at 1
  assert model.gamma_choice['predicted_improvement'] == pytest.approx(improvement)
  assert model.decode_config.gamma == 'auto' and model.run_config.gamma_alpha == 0.5
  assert model.gamma_choice['alpha'] == 0.5 and model.gamma_choice['alpha_source'] == 'given'
  assert model.describe()['gamma'] == 'auto'  # the setting, stable for resumed runs
  ar = api.generate((t_module, t_params), enc, max_decode_length=10)
  np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ar.tokens))


@pytest.mark.parametrize('kw, pattern', [
    (dict(gamma=0), "gamma must be >= 1 or 'auto'"),
    (dict(gamma='auto', gamma_alpha=1.5), r'gamma_alpha .* must be in \[0, 1\]')])
def test_bad_settings_raise(target_and_draft, kw, pattern):
  (t_module, _), (d_module, d_params) = target_and_draft
  with pytest.raises(ValueError, match=pattern):
    models.StandaloneSpeculativeModel(t_module, draft_module=d_module, draft_params=d_params,
                                      decode_config=DecodeConfig(**kw))


@pytest.mark.slow  # the runner end to end
def test_infer_with_auto_gamma(monkeypatch, tmp_path, capsys):
  """The runner with --gin.GAMMA="'auto'": alpha from a warm-up, the choice in metrics."""
  monkeypatch.setattr(timing, 'call_costs', _stub_costs(1.0, 0.01, 0.0))
  tasks.register_tasks()
  try:
    metrics = infer.main(['--gin_file=configs/spec_tiny_test.gin',
                          f"--gin.INFER_OUTPUT_DIR='{tmp_path}'", "--gin.GAMMA='auto'",
                          '--gin.infer.compare_baseline=True', '--gin.infer.num_examples=4'])
  finally:
    gin.clear_config()  # main() leaves the config locked, as T5X does.
  choice = metrics['gamma_choice']
  assert metrics['gamma'] == 'auto' and choice['alpha_source'].startswith('warm-up')
  assert 0.0 < choice['alpha'] < 1.0
  # The warm-up's alpha and the stubbed costs (c = 0.01, verify = one target step) fix the
  # choice (the runner's 16 target positions leave every gamma up to MAX_GAMMA).
  best, improvement = _paper_gamma(choice['alpha'], 0.01)
  assert choice['gamma'] == best and choice['predicted_improvement'] == pytest.approx(improvement)
  assert len(metrics['accepted_length_histogram']) == choice['gamma'] + 1
  spec = tmp_path / metrics['predictions_file']
  base = tmp_path / metrics['baseline']['predictions_file']
  predictions = lambda p: [json.loads(l)['prediction'] for l in p.read_text('utf-8').splitlines()]
  assert predictions(spec) == predictions(base) and len(predictions(spec)) == 4
  assert f"gamma {choice['gamma']} (auto: alpha " in capsys.readouterr().out


def test_auto_gamma_needs_concrete_inputs(target_and_draft):
  """Under a tracing runner (T5X's infer jits the model) the error says what to do."""
  (t_module, t_params), (d_module, d_params) = target_and_draft
  model = models.StandaloneSpeculativeModel(
      t_module, draft_module=d_module, draft_params=d_params, max_decode_length=4,
      decode_config=DecodeConfig(gamma='auto', gamma_alpha=0.5))
  decode = jax.jit(lambda enc: model.predict_batch_with_stats(
      t_params, {'encoder_input_tokens': enc})[0])
  with pytest.raises(ValueError, match='concrete inputs.*integer gamma'):
    decode(ENC)
