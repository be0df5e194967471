"""research/predict/ceiling.py: speedups from step costs, and the acceptance a speedup needs."""

import numpy as np
import pytest

from specdec_t5x.algorithm import theory
from specdec_t5x.research.predict import ceiling


def paper_costs(c, gammas=range(1, 9), t=2e-3):
  """The paper's assumptions: a verify call costs one step, a draft call c steps."""
  return ceiling.Costs.from_calls(t, {g + 1: t for g in gammas}, t_draft=c * t)


@pytest.mark.parametrize('alpha,gamma,c', [(0.6, 1, 0.05), (0.8, 3, 0.1), (0.9, 7, 0.02),
                                           (1.0, 4, 0.2), (0.0, 2, 0.3)])
def test_with_the_papers_assumptions_it_is_the_papers_improvement(alpha, gamma, c):
  got = ceiling.speedup(paper_costs(c), alpha, gamma)
  np.testing.assert_allclose(got, theory.walltime_improvement(alpha, gamma, c), rtol=1e-12)


def test_a_step_is_the_first_draft_call_the_other_draft_calls_and_the_verify_call():
  costs = ceiling.Costs.from_calls(1.0, {2: 1.5, 3: 2.0, 4: 2.6}, t_draft=0.1,
                                   t_first={1: 0.3, 2: 0.35, 3: 0.4})
  assert costs.gammas() == (1, 2, 3)
  np.testing.assert_allclose([costs.t_step[g] for g in (1, 2, 3)],
                             [0.3 + 1.5, 0.35 + 0.1 + 2.0, 0.4 + 0.2 + 2.6])
  one_token = ceiling.Costs.from_calls(1.0, {3: 2.0}, t_draft=0.1)
  np.testing.assert_allclose(one_token.t_step[2], 0.2 + 2.0)


def test_end_to_end_adds_the_prefill_both_decoders_pay():
  costs = ceiling.Costs(t_target=1.0, t_step={2: 1.5}, prefill_target=6.0, prefill_draft=0.5)
  tokens = theory.expected_tokens_per_step(0.7, 2)
  want = (6.0 + 20 * 1.0) / (6.0 + 0.5 + 20 / tokens * 1.5)
  np.testing.assert_allclose(ceiling.speedup(costs, 0.7, 2, output_tokens=20), want)
  decode = ceiling.speedup(costs, 0.7, 2)
  assert decode > 1 and 1 < ceiling.speedup(costs, 0.7, 2, output_tokens=20) < decode


def test_best_takes_the_fastest_gamma():
  costs = ceiling.Costs(1.0, {1: 1.2, 2: 1.4, 3: 3.0})
  for alpha in (0.3, 0.7, 0.95):
    speeds = {g: ceiling.speedup(costs, alpha, g) for g in (1, 2, 3)}
    gamma, speed = ceiling.best(costs, alpha)
    assert speed == max(speeds.values()) and speeds[gamma] == speed


def test_alpha_needed_is_the_lowest_acceptance_that_reaches_the_speedup():
  costs = ceiling.Costs(1.0, {1: 1.1, 2: 1.5, 4: 2.2}, prefill_target=4.0, prefill_draft=0.2)
  for target, length in ((1.2, 0.0), (1.3, 25.0), (1.5, 0.0)):
    alpha = ceiling.alpha_needed(costs, target, length, tol=1e-6)
    assert 0 < alpha < 1
    assert ceiling.best(costs, alpha, length)[1] >= target
    assert ceiling.best(costs, alpha - 1e-5, length)[1] < target


def test_alpha_needed_says_when_no_acceptance_reaches_it_and_when_any_does():
  costs = ceiling.Costs(1.0, {1: 1.5, 2: 2.5})  # at alpha 1: 2/1.5, 3/2.5
  assert ceiling.alpha_needed(costs, 1.34) is None
  assert ceiling.alpha_needed(costs, 1.33) is not None
  cheap = ceiling.Costs(1.0, {1: 0.9})
  assert ceiling.alpha_needed(cheap, 1.1) == 0.0
