"""The paper's alpha, as every decode loop measures it: E[beta], beta = sum_x min(p, q).

Context-free pairs (constant logits for target and draft) have one known beta at every
position, so each loop's estimate must equal it and the chain's tokens per target call must
follow the paper's formula from it. On real (tiny) models alpha must not move with gamma
while the acceptance rate (accepted / drafted tokens) falls, at temperature 0 and 1.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x import generate
from specdec_t5x.algorithm import rows, stats, theory
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.decode import chain, dynamic_tree, static_tree

V, ROWS, MAX_LEN = 8, 256, 160
_rs = np.random.RandomState(3)
P_LOGITS = (1.5 * _rs.randn(V)).astype(np.float32)
Q_LOGITS = (P_LOGITS + _rs.randn(V)).astype(np.float32)
NEVER = V  # an EOS id no model emits: every row runs to MAX_LEN


def _constant(logits):
  """An ExtendFn whose distribution is the same after every prefix."""
  def extend(cache, tokens, positions, *features, tree=None):
    del positions, features, tree
    return jnp.broadcast_to(jnp.asarray(logits), tokens.shape + (V,)), cache
  return extend


def _decode(loop, config):
  kwargs = dict(batch=ROWS, max_len=MAX_LEN, config=config, eos_id=NEVER)
  target, draft, rng = _constant(P_LOGITS), _constant(Q_LOGITS), jax.random.PRNGKey(0)
  cache = {'layers': [], rows.SKIPPED: jnp.zeros((), bool)}  # a tree step compacts it
  if loop is chain.speculative_decode:
    return jax.jit(lambda: loop(target, draft, cache, cache, rng, **kwargs))()
  encoder_tokens = jnp.zeros((ROWS, 4), jnp.int32)
  return jax.jit(lambda: loop(target, draft, cache, cache, rng, encoder_tokens, **kwargs))()


def _overlap(temperature):
  if temperature == 0:
    return float(np.argmax(P_LOGITS) == np.argmax(Q_LOGITS))
  p, q = (np.asarray(jax.nn.softmax(x / temperature)) for x in (P_LOGITS, Q_LOGITS))
  return float(np.minimum(p, q).sum())


LOOPS = [
    ('chain', chain.speculative_decode, {}),
    ('static tree', static_tree.tree_speculative_decode, {'draft_siblings': (1, 1)}),
    ('dynamic tree', dynamic_tree.dynamic_tree_decode, {'draft_tree_width': 2}),
]


@pytest.mark.parametrize('name,loop,tree', LOOPS, ids=[n for n, _, _ in LOOPS])
@pytest.mark.parametrize('temperature', [0.0, 1.0, 0.7])
def test_each_loop_measures_the_known_beta_of_a_context_free_pair(name, loop, tree,
                                                                  temperature):
  config = DecodeConfig(gamma=3, temperature=temperature, **tree)
  _, st = _decode(loop, config)
  s = stats.summarize(st)
  assert s['beta_positions'] >= ROWS * MAX_LEN // 8, name  # measured at many positions
  assert s['alpha'] == pytest.approx(_overlap(temperature), abs=1e-5), name


@pytest.mark.parametrize('gamma', [1, 2, 5])
def test_tokens_per_call_follow_the_formula_from_alpha_for_an_iid_draft(gamma):
  _, st = _decode(chain.speculative_decode, DecodeConfig(gamma=gamma, temperature=1.0))
  s = stats.summarize(st)
  beta = _overlap(1.0)
  assert s['alpha'] == pytest.approx(beta, abs=1e-5)
  # Rows draft fewer tokens in their last step or two (the length limit): a bias below 1%.
  assert s['mean_tokens_per_target_call'] == pytest.approx(
      float(theory.expected_tokens_per_step(s['alpha'], gamma)), rel=0.015)
  # The acceptance rate is the chance a drafted token is accepted, drafts after a
  # rejection counted as not accepted: below alpha once gamma > 1.
  if gamma == 1:
    assert s['acceptance_rate'] == pytest.approx(beta, abs=0.02)
  else:
    assert s['acceptance_rate'] < beta - 0.05


@pytest.fixture(scope='module')
def tiny_pair():
  """A target and a draft that agree often but not always: the target's weights mixed
  with another model's."""
  config = tiny_config(vocab=12)
  target, (module, other) = make_model(config, seed=20, logit_scale=1.5), make_model(config, 21)
  draft = (module, jax.tree_util.tree_map(lambda t, o: 0.85 * t + 0.15 * o, target[1], other))
  return target, draft, random_inputs(ROWS, 9, 12, seed=5)


def _alpha_and_stderr(st):
  """alpha over the rows' measured positions, and its standard error with each row a unit
  (positions of one row are not independent): the ratio estimator's delta method."""
  num, den = (np.asarray(st[k], np.float64) for k in ('beta_sum', 'beta_positions'))
  alpha = num.sum() / den.sum()
  resid = num - alpha * den
  return alpha, float(np.sqrt(np.sum(resid ** 2)) / den.sum())


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_alpha_does_not_move_with_gamma_while_the_acceptance_rate_does(tiny_pair, temperature):
  target, draft, enc = tiny_pair
  runs = {g: generate(target, enc, draft=draft, gamma=g, temperature=temperature,
                      max_decode_length=24, eos_id=NEVER + 100, rng=jax.random.PRNGKey(g))
          for g in (1, 4)}
  (a1, e1), (a4, e4) = (_alpha_and_stderr(runs[g].stats) for g in (1, 4))
  r1, r4 = (stats.summarize(runs[g].stats)['acceptance_rate'] for g in (1, 4))
  print(f'alpha {a1:.3f} +- {e1:.3f} (gamma 1), {a4:.3f} +- {e4:.3f} (gamma 4); '
        f'acceptance rate {r1:.3f}, {r4:.3f}')
  assert 0.3 < a1 < 0.9  # a pair that disagrees often enough to tell
  assert abs(a1 - a4) < 3 * np.hypot(e1, e4)
  assert r4 < r1 - 0.1
