"""Properties of the cached decoder: cache == teacher forcing, rollback == recomputation."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import jit_apply, make_model, random_inputs, tiny_config
from specdec_t5x.algorithm.cpu import build, matmul, modes, packing
from specdec_t5x.algorithm.network import Transformer, relative_position_bucket


def _apply(model, method, *args):
  module, params = model
  return jit_apply(module, {'params': params}, *args, method=method)


@pytest.mark.parametrize('v11', [True, False])
def test_cached_extend_equals_teacher_forcing(v11):
  model = make_model(tiny_config(v11=v11), seed=3)
  enc = jnp.asarray(random_inputs(3, 9, 40, seed=1))
  dec_in = jnp.asarray(np.random.RandomState(2).randint(1, 40, size=(3, 10)), jnp.int32)
  dec_in = dec_in.at[:, 0].set(0)
  full = _apply(model, None, enc, dec_in)  # [3, 10, V]

  encoded = _apply(model, 'encode', enc)
  cache = _apply(model, 'init_cache', encoded, enc, 12)
  # Mixed chunk sizes (1-token and k-token appends).
  pieces, pos = [], 0
  for k in (1, 3, 1, 4, 1):
    logits, cache = _apply(model, 'extend', cache, dec_in[:, pos:pos + k], jnp.full((3,), pos))
    pieces.append(logits)
    pos += k
  np.testing.assert_allclose(np.concatenate(pieces, 1), full, atol=2e-5, rtol=2e-5)


def test_rows_at_different_positions_and_rollback():
  model = make_model(tiny_config(), seed=4)
  enc = jnp.asarray(random_inputs(2, 8, 40, seed=5))
  rs = np.random.RandomState(6)
  dec = jnp.asarray(rs.randint(2, 40, size=(2, 12)), jnp.int32).at[:, 0].set(0)
  full = np.asarray(_apply(model, None, enc, dec))
  encoded = _apply(model, 'encode', enc)
  cache = _apply(model, 'init_cache', encoded, enc, 14)
  # Row 0 gets 6 tokens, row 1 gets 3 tokens, via one call each at per-row positions.
  _, cache = _apply(model, 'extend', cache, jnp.stack([dec[0, :3], dec[1, :3]]),
                    jnp.array([0, 0]))
  _, cache = _apply(model, 'extend', cache, jnp.stack([dec[0, 3:6], dec[1, 3:6]]),
                    jnp.array([3, 3]))
  # Speculative-style garbage written at positions 6..9 for row 0 and 3..6 for row 1.
  junk = jnp.asarray(rs.randint(2, 40, size=(2, 4)), jnp.int32)
  _, cache = _apply(model, 'extend', cache, junk, jnp.array([6, 3]))
  # Roll back: row 0 to 6 tokens, row 1 to 3 tokens; re-decode the true continuation.
  logits, _ = _apply(model, 'extend', cache, jnp.stack([dec[0, 6:10], dec[1, 3:7]]),
                     jnp.array([6, 3]))
  np.testing.assert_allclose(logits[0], full[0, 6:10], atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(logits[1], full[1, 3:7], atol=2e-5, rtol=2e-5)


def test_relative_position_bucket_known_values():
  rel = np.arange(-200, 201)
  bi = relative_position_bucket(rel, bidirectional=True)
  causal = relative_position_bucket(rel, bidirectional=False)
  # Exact buckets near zero, log-spaced beyond, saturating at the last bucket.
  assert bi[200] == 0 and bi[201] == 17 and bi[199] == 1
  assert causal[200] == 0 and causal[199] == 1 and np.all(causal[201:] == 0)
  assert causal[0] == 31 and bi[0] == 15 and bi[-1] == 31
  assert np.all(np.diff(causal[:201]) <= 0)
  np.testing.assert_array_equal(relative_position_bucket(jnp.asarray(rel), False), causal)


def test_param_tree_matches_t5x_names():
  module, params = make_model(tiny_config(v11=True))
  flat = {'/'.join(p.key for p in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  for name in ['token_embedder/embedding', 'encoder/relpos_bias/rel_embedding',
               'encoder/layers_0/attention/query/kernel', 'encoder/layers_1/mlp/wi_1/kernel',
               'encoder/encoder_norm/scale', 'decoder/layers_1/encoder_decoder_attention/out/kernel',
               'decoder/layers_0/pre_cross_attention_layer_norm/scale',
               'decoder/logits_dense/kernel', 'decoder/decoder_norm/scale']:
    assert name in flat, name
  assert params['encoder']['layers_0']['attention']['query']['kernel'].shape == (32, 32)
  _, p10 = make_model(tiny_config(v11=False))
  assert 'logits_dense' not in p10['decoder']
  assert 'wi' in p10['encoder']['layers_0']['mlp']


_DENSE_DOT = re.compile(r'/(query|key|value|out|wi|wi_\d|wo|logits_dense)/dot_general')


def _extend_program(model, variables, cache, num_tokens):
  module = model[0]
  return jax.jit(lambda v, c, t, p: module.apply(v, c, t, p, method='extend')).lower(
      variables, cache, jnp.zeros((2, num_tokens), jnp.int32), jnp.zeros((2,), jnp.int32))


@pytest.mark.skipif(jax.default_backend() != 'cpu', reason='the XLA:CPU form of attention')
@pytest.mark.parametrize('packed', [False, True])
@pytest.mark.parametrize('mode', ['packed', 'xla'])
def test_each_query_of_a_cached_call_attends_as_a_one_token_call(packed, mode):
  """On XLA:CPU a k-token call (a verify window, a draft's catch-up) attends one query at a
  time: with the row kernels, one cpu.attention.cached_attention call per attention block
  (whatever k); without them, k times the attention products of a one-token call (a
  product over a few queries would be a separate dot of a fixed cost); under
  accelerator_forms, one product over all queries. Each row's logits are bitwise those of
  one-token calls, with XLA's dot or the packed kernel."""
  model = make_model(tiny_config(), seed=7)
  variables = packing.decode_variables(*model) if packed else {'params': model[1]}
  assert (matmul.COLLECTION in variables) == (packed and modes.enabled())
  with modes.decode_mode(mode):  # programs traced here take this kernel mode
    _check_cached_calls(model, variables, mode)


def _check_cached_calls(model, variables, mode):
  attention_kernel = modes.enabled(mode)
  assert attention_kernel == (mode == 'packed' and build.cpu_has_avx2_fma())
  enc = jnp.asarray(random_inputs(2, 9, 40, seed=8))
  dec = jnp.asarray(np.random.RandomState(9).randint(2, 40, size=(2, 7)), jnp.int32)
  module = model[0]
  encoded = jit_apply(module, variables, enc, method='encode')
  cache = jit_apply(module, variables, encoded, enc, 12, method='init_cache')

  def count(num_tokens):  # (attention products: dots that are not a Dense layer's, kernel calls)
    text = _extend_program(model, variables, cache, num_tokens).compile().as_text()
    lines = text.splitlines()
    return (sum(' dot(' in line and not _DENSE_DOT.search(line) for line in lines),
            sum(build.CACHED_ATTENTION in line and 'custom-call(' in line
                for line in lines))
  blocks = 2 * tiny_config().num_decoder_layers  # self- and cross-attention per layer
  if attention_kernel:
    assert count(1) == count(3) == (0, blocks)
  else:
    assert count(1)[0] > 0 and count(3) == (3 * count(1)[0], 0)
  with modes.accelerator_forms():  # as compiled_costs lowers an accelerator's programs
    assert count(3) == count(1) and count(1)[0] > 0

  step = jax.jit(lambda c, t, p: module.apply(variables, c, t, p, method='extend'))
  one, c1 = [], cache
  for i in range(7):
    logits, c1 = step(c1, dec[:, i:i + 1], jnp.full((2,), i, jnp.int32))
    one.append(np.asarray(logits))
  many, c3 = [], cache
  for start, k in ((0, 3), (3, 4)):
    logits, c3 = step(c3, dec[:, start:start + k], jnp.full((2,), start, jnp.int32))
    many.append(np.asarray(logits))
  np.testing.assert_array_equal(np.concatenate(many, 1), np.concatenate(one, 1))
