"""Inverse-CDF sampling: exact frequencies, zero-probability tokens never drawn."""

import jax
import numpy as np

from specdec_t5x.algorithm import sampling


def test_sample_matches_probabilities_and_skips_zero_mass():
  probs = np.array([0.0, 0.5, 0.0, 0.2, 0.3, 0.0], np.float32)
  n = 200000
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  draws = np.asarray(sampling.sample(keys, np.broadcast_to(probs, (n, 6))))
  freq = np.bincount(draws, minlength=6) / n
  assert freq[[0, 2, 5]].sum() == 0  # never a zero-probability token, also at the ends
  np.testing.assert_allclose(freq, probs, atol=4 / np.sqrt(n))


def test_sample_with_one_hot_is_argmax():
  probs = np.eye(7, dtype=np.float32)[[6, 0, 3]]
  keys = jax.random.split(jax.random.PRNGKey(1), 3)
  np.testing.assert_array_equal(sampling.sample(keys, probs), [6, 0, 3])
