"""Block verification: exact, equal to token-wise when greedy, never shorter on average."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x.algorithm import sampling

ROWS = 200000


def _run(rule, p_pos, q_pos, gamma, seed=0):
  """Context-independent p, q per position; rows draft from q. -> (n [rows], dist [rows, V])."""
  key_x, key_u = jax.random.split(jax.random.PRNGKey(seed))
  q = jnp.broadcast_to(jnp.asarray(q_pos[:gamma], jnp.float32), (ROWS, gamma, q_pos.shape[-1]))
  p = jnp.broadcast_to(jnp.asarray(p_pos[:gamma + 1], jnp.float32), (ROWS, gamma + 1, p_pos.shape[-1]))
  xs = jax.random.categorical(key_x, jnp.log(q))  # [rows, gamma]
  u = jax.random.uniform(key_u, (ROWS, gamma))
  k = jnp.full((ROWS,), gamma, jnp.int32)
  if rule == 'block':
    return sampling.accept_block(u, xs, q, p, k)
  n = sampling.accept_tokenwise(u, xs, q, p, k)
  return n, sampling.correction_distribution(n, k, q, p)


def test_paper_example_expected_lengths():
  """Sun et al.'s example: p = (1/3, 2/3), q = (2/3, 1/3), gamma 2: 10/9 vs 11/9 tokens."""
  p = np.tile([1 / 3, 2 / 3], (3, 1))
  q = np.tile([2 / 3, 1 / 3], (3, 1))
  n_tok, _ = _run('token', p, q, 2)
  n_blk, _ = _run('block', p, q, 2)
  se = 1.0 / np.sqrt(ROWS)
  assert abs(float(jnp.mean(n_tok)) - 10 / 9) < 4 * se
  assert abs(float(jnp.mean(n_blk)) - 11 / 9) < 4 * se


@pytest.mark.parametrize('seed', range(4))
def test_block_never_worse_and_first_token_exact(seed):
  rs = np.random.RandomState(seed)
  vocab, gamma = 4, 3
  p = rs.dirichlet(np.ones(vocab) * 0.7, size=gamma + 1)
  q = rs.dirichlet(np.ones(vocab) * 0.7, size=gamma)
  n_tok, _ = _run('token', p, q, gamma, seed)
  n_blk, dist = _run('block', p, q, gamma, seed)
  assert float(jnp.mean(n_blk)) >= float(jnp.mean(n_tok)) - 3 * np.sqrt(2.0 * gamma ** 2 / ROWS)
  # The first emitted token: x_1 when n >= 1, else a draw from the correction dist.
  xs = jax.random.categorical(jax.random.split(jax.random.PRNGKey(seed))[0],
                              jnp.log(jnp.broadcast_to(jnp.asarray(q, jnp.float32), (ROWS, gamma, vocab))))
  first = jnp.where(n_blk >= 1, xs[:, 0], -1)
  freq = np.array([float(jnp.mean(first == v)) for v in range(vocab)])
  freq += np.asarray(jnp.mean(jnp.where((n_blk == 0)[:, None], dist, 0.0), axis=0))
  np.testing.assert_allclose(freq, p[0], atol=5 / np.sqrt(ROWS))


def test_block_equals_greedy_rule_on_one_hot_distributions():
  rs = np.random.RandomState(0)
  b, gamma, vocab = 64, 5, 7
  best = rs.randint(0, vocab, size=(b, gamma + 1))
  xs = np.where(rs.rand(b, gamma) < 0.7, best[:, :gamma], rs.randint(0, vocab, (b, gamma)))
  p = jax.nn.one_hot(best, vocab)
  q = jax.nn.one_hot(xs, vocab)
  k = jnp.asarray(rs.randint(0, gamma + 1, size=b), jnp.int32)
  u = jnp.asarray(rs.rand(b, gamma), jnp.float32)
  n_blk, dist = sampling.accept_block(u, jnp.asarray(xs), q, p, k)
  n_greedy = sampling.accept_greedy(jnp.asarray(xs), jnp.asarray(best), k)
  np.testing.assert_array_equal(n_blk, n_greedy)
  np.testing.assert_array_equal(jnp.argmax(dist, -1), best[np.arange(b), np.asarray(n_greedy)])
