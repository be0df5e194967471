"""Tests of specdec_t5x.theory: closed forms vs Monte Carlo, and the paper's statements."""
import itertools

import numpy as np
import pytest

from specdec_t5x.algorithm import theory

ALPHAS = np.linspace(0.0, 1.0, 41)
CS = np.linspace(0.0, 1.5, 31)


def _direct_sum(alpha, gamma):
  return sum(alpha ** k for k in range(gamma + 1))


@pytest.mark.parametrize('alpha,gamma', [(0.0, 1), (0.3, 2), (0.62, 5), (0.75, 7),
                                         (0.9, 4), (1.0, 3)])
def test_expected_tokens_matches_simulation(alpha, gamma):
  num_steps = 200_000
  mean, counts = theory.simulate_iid(alpha, gamma, num_steps, np.random.default_rng(0))
  dist = theory.accepted_length_distribution(alpha, gamma)
  tokens = np.arange(gamma + 1) + 1
  expected = theory.expected_tokens_per_step(alpha, gamma)
  std = np.sqrt(np.sum(dist * (tokens - expected) ** 2))
  assert counts.sum() == num_steps
  assert abs(mean - expected) <= 5 * std / np.sqrt(num_steps) + 1e-12
  # Each histogram bin is a binomial proportion; 5 standard errors.
  freq = counts / num_steps
  se = np.sqrt(dist * (1 - dist) / num_steps)
  np.testing.assert_array_less(np.abs(freq - dist), 5 * se + 1e-12)


@pytest.mark.parametrize('alpha,gamma', [(0.53, 3), (0.8, 6)])
def test_histogram_chi_square(alpha, gamma):
  scipy_stats = pytest.importorskip('scipy.stats')
  _, counts = theory.simulate_iid(alpha, gamma, 50_000, np.random.default_rng(1))
  dist = theory.accepted_length_distribution(alpha, gamma)
  assert scipy_stats.chisquare(counts, dist * counts.sum()).pvalue > 1e-3


def test_accepted_length_distribution_sums_to_one_and_gives_expected_tokens():
  for gamma in (1, 2, 5, 16):
    dist = theory.accepted_length_distribution(ALPHAS, gamma)  # [alphas, gamma+1]
    assert dist.shape == (ALPHAS.size, gamma + 1)
    np.testing.assert_allclose(dist.sum(-1), 1.0, rtol=1e-12)
    mean_tokens = dist @ (np.arange(gamma + 1) + 1)
    np.testing.assert_allclose(mean_tokens, theory.expected_tokens_per_step(ALPHAS, gamma),
                               rtol=1e-12)
  np.testing.assert_array_equal(theory.accepted_length_distribution(1.0, 3), [0, 0, 0, 1])
  np.testing.assert_array_equal(theory.accepted_length_distribution(0.0, 3), [1, 0, 0, 0])


def test_expected_tokens_alpha_to_one_limit():
  for gamma in (1, 3, 7, 16):
    assert theory.expected_tokens_per_step(1.0, gamma) == gamma + 1
    for eps in (1e-3, 1e-6, 1e-9, 1e-12, 1e-15):
      got = theory.expected_tokens_per_step(1 - eps, gamma)
      np.testing.assert_allclose(got, _direct_sum(1 - eps, gamma), rtol=1e-13)
      assert got < gamma + 1
    assert theory.expected_tokens_per_step(0.0, gamma) == 1.0
  np.testing.assert_allclose(theory.walltime_improvement(1.0, 7, 0.1), 8 / 1.7)
  np.testing.assert_allclose(theory.arithmetic_factor(1.0, 7, 0.0), 1.0)


def test_expected_tokens_vectorised_equals_scalar():
  gammas = np.arange(1, 9)[:, None]
  grid = theory.expected_tokens_per_step(ALPHAS[None, :], gammas)  # [gammas, alphas]
  assert grid.shape == (8, ALPHAS.size)
  for (i, g), (j, a) in itertools.product(enumerate(gammas[:, 0]), enumerate(ALPHAS)):
    np.testing.assert_allclose(grid[i, j], _direct_sum(a, int(g)), rtol=1e-12)


def test_improvement_exists_iff_alpha_greater_than_c():
  a, c = np.meshgrid(ALPHAS, CS, indexing='ij')
  gammas = np.arange(1, 65).reshape(-1, 1, 1)
  best = theory.walltime_improvement(a, gammas, c).max(0)  # [alphas, cs]
  assert np.all(best[a > c] > 1)
  assert np.all(best[a <= c] <= 1 + 1e-12)


def test_gamma_one_lower_bound():
  a, c = np.meshgrid(ALPHAS, CS, indexing='ij')
  bound = theory.min_speedup_gamma1(a, c)
  np.testing.assert_allclose(theory.walltime_improvement(a, 1, c), bound, rtol=1e-12)
  best = theory.walltime_improvement(a, theory.best_gamma(a, c), c)
  assert np.all(best >= bound - 1e-12)


def test_paper_table2_and_bigram_numbers():
  # EnDe T5-small, T=0: alpha = 0.75, gamma = 7 -> ~3.6 tokens per target call.
  tokens = theory.expected_tokens_per_step(0.75, 7)
  assert 3.5 < tokens < 3.7
  # With a small c the predicted improvement is ~3x (the paper measured 3.4x).
  assert 3.0 < theory.walltime_improvement(0.75, 7, 0.02) < tokens
  # Bigram draft: alpha ~0.2, gamma = 3, c ~ 0 -> ~1.25x.
  np.testing.assert_allclose(theory.walltime_improvement(0.2, 3, 0.0), 1.248, rtol=1e-12)


def test_arithmetic_factor():
  a, g, c_hat = 0.75, 7, 0.02
  formula = (1 - a) * (g * c_hat + g + 1) / (1 - a ** (g + 1))
  np.testing.assert_allclose(theory.arithmetic_factor(a, g, c_hat), formula, rtol=1e-12)
  # No acceptance: every step pays gamma drafts and gamma+1 target positions for 1 token.
  np.testing.assert_allclose(theory.arithmetic_factor(0.0, g, c_hat), g * c_hat + g + 1)
  assert np.all(theory.arithmetic_factor(ALPHAS, 4, 0.0) >= 1 - 1e-12)


def test_best_gamma_matches_brute_force():
  a, c = np.meshgrid(ALPHAS, CS, indexing='ij')
  got = theory.best_gamma(a, c, max_gamma=12)
  assert got.shape == a.shape and got.dtype.kind == 'i'
  for (i, j) in itertools.product(range(a.shape[0]), range(a.shape[1])):
    values = [float(theory.walltime_improvement(a[i, j], g, c[i, j])) for g in range(1, 13)]
    assert got[i, j] == 1 + int(np.argmax(values))
    assert theory.best_gamma(a[i, j], c[i, j], max_gamma=12) == got[i, j]
  assert theory.best_gamma(0.0, 0.1) == 1
  assert theory.best_gamma(1.0, 0.0, max_gamma=9) == 9
  # Better drafts (higher alpha) never want fewer guesses at fixed c.
  assert np.all(np.diff(got, axis=0) >= 0)


def test_measured_forms_reduce_to_the_paper_form():
  a, g = ALPHAS[:, None], np.arange(1, 9)[None, :]
  t_draft, t_target = 0.05, 2.0
  np.testing.assert_allclose(
      theory.walltime_improvement_measured(a, g, t_draft, t_target, t_target),
      theory.walltime_improvement(a, g, t_draft / t_target), rtol=1e-12)
  tokens = theory.expected_tokens_per_step(0.7, 4)
  np.testing.assert_allclose(theory.ideal_speedup(tokens, 4, 0.1, 1.0, 1.3),
                             tokens / (4 * 0.1 + 1.3), rtol=1e-12)
  for alpha in (0.3, 0.75, 0.95):
    assert theory.best_gamma_measured(alpha, t_draft, t_target, t_target) == \
        theory.best_gamma(alpha, t_draft / t_target)


def test_best_gamma_measured_with_gamma_dependent_verify_cost():
  t_draft, t_target, max_gamma = 0.02, 1.0, 12
  verify = lambda g: t_target * (1 + 0.15 * g)  # verification cost grows with positions.
  table = np.array([np.nan] + [verify(g) for g in range(1, max_gamma + 1)])
  for alpha in np.linspace(0.05, 0.98, 20):
    brute = [float(theory.walltime_improvement_measured(alpha, g, t_draft, t_target,
                                                        verify(g)))
             for g in range(1, max_gamma + 1)]
    want = 1 + int(np.argmax(brute))
    assert theory.best_gamma_measured(alpha, t_draft, t_target, verify, max_gamma) == want
    assert theory.best_gamma_measured(alpha, t_draft, t_target, table) == want
    # A growing verify cost never asks for more drafts than a flat one.
    assert want <= theory.best_gamma_measured(alpha, t_draft, t_target, t_target, max_gamma)
  vec = theory.best_gamma_measured(np.array([0.5, 0.9]), t_draft, t_target, table)
  assert vec.shape == (2,)


def test_alpha_from_distributions():
  p = np.array([0.5, 0.3, 0.2, 0.0])
  assert theory.alpha_from_distributions(p, p) == pytest.approx(1.0)
  assert theory.alpha_from_distributions([1, 0, 0, 0], [0, 0.5, 0.5, 0]) == 0.0
  q = np.array([0.25, 0.25, 0.25, 0.25])
  assert theory.alpha_from_distributions(p, q) == pytest.approx(0.25 + 0.25 + 0.2 + 0.0)
  assert theory.alpha_from_distributions(p, q) == pytest.approx(1 - 0.5 * np.abs(p - q).sum())
  # Leading axes are averaged: [batch, length, vocab].
  rng = np.random.default_rng(0)
  pp = rng.dirichlet(np.ones(5), size=(3, 4))
  qq = rng.dirichlet(np.ones(5), size=(3, 4))
  betas = [np.minimum(pp[i, j], qq[i, j]).sum() for i in range(3) for j in range(4)]
  assert theory.alpha_from_distributions(pp, qq) == pytest.approx(np.mean(betas))
  # One-hot (temperature 0) distributions: alpha is the argmax agreement rate.
  eye = np.eye(5)
  assert theory.alpha_from_distributions(eye[[0, 1, 2, 3]], eye[[0, 1, 4, 4]]) == 0.5


@pytest.mark.parametrize('call', [
    lambda: theory.expected_tokens_per_step(-0.1, 3),
    lambda: theory.expected_tokens_per_step(1.1, 3),
    lambda: theory.expected_tokens_per_step(np.nan, 3),
    lambda: theory.expected_tokens_per_step(0.5, 0),
    lambda: theory.expected_tokens_per_step(0.5, 2.5),
    lambda: theory.walltime_improvement(0.5, 3, -0.01),
    lambda: theory.arithmetic_factor(0.5, 3, -1.0),
    lambda: theory.min_speedup_gamma1(0.5, -1.0),
    lambda: theory.best_gamma(1.5, 0.1),
    lambda: theory.best_gamma(0.5, -0.1),
    lambda: theory.best_gamma(0.5, 0.1, max_gamma=0),
    lambda: theory.ideal_speedup(0.5, 3, 0.1, 1.0, 1.0),  # < 1 token per call
    lambda: theory.ideal_speedup(5.0, 3, 0.1, 1.0, 1.0),  # > gamma + 1
    lambda: theory.ideal_speedup(2.0, 3, 0.1, 0.0, 1.0),
    lambda: theory.walltime_improvement_measured(0.5, 3, -0.1, 1.0, 1.0),
    lambda: theory.best_gamma_measured(0.5, 0.1, 1.0, np.ones(4), max_gamma=4),
    lambda: theory.best_gamma_measured(0.5, 0.1, 1.0, np.ones((2, 3))),
    lambda: theory.alpha_from_distributions([0.5, 0.5], [1.0, 0.0, 0.0]),
    lambda: theory.alpha_from_distributions([1.5, -0.5], [1.0, 0.0]),
    lambda: theory.alpha_from_distributions([0.5, 0.4], [1.0, 0.0]),
    lambda: theory.simulate_iid(0.5, 0, 10, 0),
    lambda: theory.simulate_iid(0.5, 2, 0, 0),
    lambda: theory.accepted_length_distribution(2.0, 3),
])
def test_invalid_inputs_raise_value_error(call):
  with pytest.raises(ValueError):
    call()


def test_simulate_iid_is_reproducible_and_edge_cases():
  a = theory.simulate_iid(0.6, 4, 1000, np.random.default_rng(7))
  b = theory.simulate_iid(0.6, 4, 1000, np.random.default_rng(7))
  assert a[0] == b[0] and np.array_equal(a[1], b[1])
  mean, counts = theory.simulate_iid(1.0, 4, 100, 0)
  assert mean == 5.0 and counts.tolist() == [0, 0, 0, 0, 100]
  mean, counts = theory.simulate_iid(0.0, 4, 100, 0)
  assert mean == 1.0 and counts.tolist() == [100, 0, 0, 0, 0]
