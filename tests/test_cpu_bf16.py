"""The bfloat16 x bfloat16 -> float32 kernel of mode 'packed_bf16' (algorithm/cpu/bf16.py,
cpu/kernels/matmul_dp.cc PanelMatmulDp)."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from conftest import make_model, random_inputs, run_child, tiny_config
from specdec_t5x.algorithm import layers, sampling
from specdec_t5x.algorithm.cpu import bf16, build, f32, matmul, modes, packing
import test_distribution as dist
from specdec_t5x.algorithm.api import generate

pytestmark = pytest.mark.skipif(
    not modes.cpu_has_dpbf16() or not build.status()[0],
    reason='the bfloat16 CPU matmul needs AVX-512 BF16 and the packed kernels')

_MATMUL = jax.jit(bf16.matmul, static_argnums=2)


def _bf16(a):
  """float64 copies of the bfloat16 values of `a` (what the kernel reads)."""
  return np.asarray(jnp.asarray(a, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32),
                    np.float64)


def _reference(x, w, odd_first=True):
  """x [M, K] @ w [K, N] as vdpbf16ps chains: per pair i from zero, in order, two float32
  FMAs, x[2i+1] w[2i+1] first, then x[2i] w[2i]. A bfloat16 product is exact in float64 and
  float64 (53 >= 2 * 24 + 2 bits) rounds the FMA's sum to float32 as one rounding would, so
  this is bitwise the FMA (no denormals arise from these values)."""
  xb, wb = _bf16(x), _bf16(w)
  acc = np.zeros((x.shape[0], w.shape[1]), np.float32)
  for i in range(-(-x.shape[1] // 2)):
    pair = (2 * i + 1, 2 * i) if odd_first else (2 * i, 2 * i + 1)
    for k in pair:
      if k < x.shape[1]:
        acc = (xb[:, k:k + 1] * wb[k:k + 1] + acc.astype(np.float64)).astype(np.float32)
  return acc


def test_pair_panels_layout():
  w = jnp.arange(5 * 20, dtype=jnp.float32).reshape(5, 20)
  q = np.asarray(bf16.pack_pairs(w).astype(jnp.float32))
  assert q.shape == (2, 3, 32)
  for j, i, c, h in np.ndindex(2, 3, 16, 2):
    k, n = 2 * i + h, 16 * j + c
    assert q[j, i, 2 * c + h] == (w[k, n] if k < 5 and n < 20 else 0)


@pytest.mark.parametrize('k,n', [(2, 1), (5, 1), (64, 15), (64, 17), (384, 100), (128, 1000)])
def test_matches_the_pair_order_reference_bitwise(k, n):
  rng = np.random.default_rng(k * 1000 + n)
  x = rng.standard_normal((3, k)).astype(np.float32)
  w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
  y = np.asarray(_MATMUL(jnp.asarray(x), bf16.pack_pairs(jnp.asarray(w)), n))
  np.testing.assert_array_equal(y, _reference(x, w))
  if k >= 64:  # the order is observable: even-first chains differ somewhere
    assert not np.array_equal(y, _reference(x, w, odd_first=False))


def test_rows_are_bitwise_those_of_one_row_calls():
  """1..18 rows: every tile shape and row group, several panel chunks (30 panels)."""
  rng = np.random.default_rng(0)
  k, n = 384, 470
  w = bf16.pack_pairs(jnp.asarray(rng.standard_normal((k, n)) / 20, jnp.float32))
  x = jnp.asarray(rng.standard_normal((18, k)), jnp.float32)
  alone = np.concatenate([np.asarray(_MATMUL(x[r:r + 1], w, n)) for r in range(18)])
  for rows in range(1, 19):
    np.testing.assert_array_equal(np.asarray(_MATMUL(x[:rows], w, n)), alone[:rows])


def test_leading_dimensions_and_bad_shapes():
  rng = np.random.default_rng(1)
  w = jnp.asarray(rng.standard_normal((32, 20)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((2, 3, 32)), jnp.float32)
  q = bf16.pack_pairs(w)
  y = _MATMUL(x, q, 20)
  assert y.shape == (2, 3, 20) and y.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(y).reshape(6, 20), _reference(x.reshape(6, 32), w))
  with pytest.raises(ValueError, match='do not make'):
    bf16.matmul(x, q, 40)
  with pytest.raises(ValueError, match='do not make'):
    bf16.matmul(x[..., :30], q, 20)


def test_dense_rounds_the_float32_sums_to_bfloat16_near_xla():
  """A bfloat16 Dense with pair panels: bfloat16 out, within one bfloat16 step of XLA's."""
  rng = np.random.default_rng(2)
  dense = layers.Dense(48, jnp.bfloat16)
  x = jnp.asarray(rng.standard_normal((4, 64)), jnp.bfloat16)
  params = dense.init(jax.random.PRNGKey(0), x)['params']
  pairs = matmul.pack(params['kernel'], modes.PAIR_PANELS)
  packed = {matmul.COLLECTION: {'kernel': pairs}}
  ours = dense.apply({'params': params, **packed}, x)
  xla = dense.apply({'params': params}, x)
  assert ours.dtype == jnp.bfloat16
  np.testing.assert_array_equal(ours, _reference(x, params['kernel']).astype(jnp.bfloat16))
  np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(xla, np.float32),
                             rtol=2 ** -7, atol=1e-6)


def _paths(variables, pairs=True):
  """keystr paths of the packed collection's pair panels (`pairs`) or other panels."""
  flat = jax.tree_util.tree_flatten_with_path(
      variables.get(matmul.COLLECTION, {}), is_leaf=lambda v: isinstance(v, matmul.PackedKernel))[0]
  return {jax.tree_util.keystr(p) for p, v in flat
          if (v.panel_format == modes.PAIR_PANELS) == pairs}


@pytest.fixture(scope='module')
def bf16_models():
  target = make_model(tiny_config(dtype=jnp.bfloat16), seed=0, logit_scale=3.0)
  draft = make_model(tiny_config(emb=16, layers=1, dtype=jnp.bfloat16), seed=1, logit_scale=3.0)
  return target, draft


def test_only_bf16_networks_in_mode_packed_bf16_get_pair_panels(bf16_models):
  (module, params), _ = bf16_models
  variables = packing.decode_variables(module, params, 'packed_bf16')
  assert len(_paths(variables)) == 2 * (4 + 3) + 2 * (4 + 4 + 3)  # encoder, decoder layers
  assert _paths(variables, pairs=False) == {"['decoder']['logits_dense']['kernel']"}  # float32
  assert not _paths(packing.decode_variables(module, params, 'packed'))
  f32_module, f32_params = make_model(tiny_config(), seed=0)
  assert not _paths(packing.decode_variables(f32_module, f32_params, 'packed_bf16'))


def _bf16_valued(params):
  """The params as restored from a bfloat16 checkpoint (float32 holding bfloat16 values)."""
  return jax.tree_util.tree_map(lambda w: w.astype(jnp.bfloat16).astype(jnp.float32), params)


@pytest.mark.parametrize('tied', [False, True])
def test_float32_logits_join_the_pairs_when_bfloat16_holds_their_weights(tied):
  """Restored from a bfloat16 checkpoint, the logits (Dense or tied embedding) run on pair
  panels too, and greedy speculative decoding still gives the target's tokens."""
  target = make_model(tiny_config(v11=not tied, dtype=jnp.bfloat16), seed=2, logit_scale=3.0)
  target = (target[0], _bf16_valued(target[1]))
  draft = make_model(tiny_config(emb=16, layers=1, v11=not tied, dtype=jnp.bfloat16), seed=3)
  variables = packing.decode_variables(*target, 'packed_bf16')
  assert not _paths(variables, pairs=False)
  logits_path = "['token_embedder']['embedding']" if tied else "['decoder']['logits_dense']['kernel']"
  assert logits_path in _paths(variables)
  enc = random_inputs(2, 8, 40, seed=9)
  plain = generate(target, enc, max_decode_length=10, cpu_kernels='packed_bf16')
  for gamma in ((2,) if tied else (4,)):  # one gamma each: the kernel does not see gamma
    spec = generate(target, enc, draft=draft, gamma=gamma, max_decode_length=10,
                    cpu_kernels='packed_bf16')
    np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_a_float32_layer_on_pair_panels_takes_only_bfloat16_inputs():
  q = bf16.pack_pairs(jnp.ones((8, 4), jnp.float32))
  with pytest.raises(ValueError, match='needs bfloat16 inputs'):
    bf16.layer(jnp.ones((1, 8), jnp.float32), q, 4, jnp.float32)
  np.testing.assert_array_equal(bf16.layer(jnp.ones((1, 8), jnp.bfloat16), q, 4,
                                               jnp.float32), np.full((1, 4), 8.0, np.float32))
  rng = np.random.default_rng(3)  # exact products, summed in pair order: float32 rounding
  x = jnp.asarray(rng.standard_normal((3, 256)), jnp.bfloat16)
  w = _bf16(rng.standard_normal((256, 50)))
  y = bf16.layer(x, bf16.pack_pairs(jnp.asarray(w, jnp.float32)), 50, jnp.float32)
  np.testing.assert_allclose(y, _bf16(x) @ w, rtol=1e-5, atol=1e-5)


def test_without_avx512_bf16_the_mode_falls_back_with_one_log_line(bf16_models, monkeypatch,
                                                                   caplog):
  (module, params), _ = bf16_models
  monkeypatch.setattr(modes, 'cpu_has_dpbf16', lambda: False)
  modes._log_fallback.cache_clear()  # pylint: disable=protected-access
  with caplog.at_level(logging.WARNING):
    for _ in range(2):
      assert not _paths(packing.decode_variables(module, params, 'packed_bf16'))
  assert sum('falls back' in r.getMessage() for r in caplog.records) == 1
  enc = random_inputs(1, 6, 40, seed=4)
  fallback = generate((module, params), enc, max_decode_length=5, cpu_kernels='packed_bf16')
  packed = generate((module, params), enc, max_decode_length=5, cpu_kernels='packed')
  np.testing.assert_array_equal(fallback.tokens, packed.tokens)


@pytest.mark.parametrize('batch', [1, 3])
def test_greedy_speculative_equals_greedy_target_in_bfloat16(bf16_models, batch):
  """Token for token, for verify calls of 2 to 6 rows: every row of a verify call is
  computed as a one-token step computes it (the kernel's rows are independent)."""
  target, draft = bf16_models
  enc = random_inputs(batch, 9, 40, seed=5 + batch)
  plain = generate(target, enc, max_decode_length=12, cpu_kernels='packed_bf16')
  for gamma in ((1, 5) if batch == 1 else (3,)):
    spec = generate(target, enc, draft=draft, gamma=gamma, max_decode_length=12,
                    cpu_kernels='packed_bf16')
    np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_the_environment_names_the_mode():
  code = ('import json\nfrom specdec_t5x.algorithm.config import DecodeConfig\n'
          "print('RESULT', json.dumps(DecodeConfig().cpu_kernels))")
  assert run_child(code, SPECDEC_CPU_KERNELS='bf16') == 'packed_bf16'


@pytest.mark.parametrize('cfg', [sampling.SamplingConfig(1.0),
                                 sampling.SamplingConfig(0.8, topk=3)], ids=['t1', 'topk3'])
def test_sampling_in_bfloat16_follows_the_targets_law(cfg):
  """Mode packed_bf16, bfloat16 target and draft, sequences of up to 5 tokens at gamma 2:
  speculative samples follow the target's law as this mode's one-token steps compute it
  (autoregressive samples in the same mode, two-sample chi-square), and its exact law by
  teacher forcing; every branch of the acceptance rule occurs."""
  target = make_model(tiny_config(vocab=dist.VOCAB, dtype=jnp.bfloat16), seed=10,
                      logit_scale=1.5)
  draft = make_model(tiny_config(vocab=dist.VOCAB, emb=16, layers=1, dtype=jnp.bfloat16),
                     seed=11, logit_scale=1.5)
  spec = dist.sample_counts(target, draft, dist.ENC, cfg, seed=21, cpu_kernels='packed_bf16')
  ar = dist.sample_counts(target, None, dist.ENC, cfg, seed=22, cpu_kernels='packed_bf16')
  keys = sorted(set(spec) | set(ar))
  table = np.array([[spec.get(k, 0) for k in keys], [ar.get(k, 0) for k in keys]])
  assert stats.chi2_contingency(table[:, table.sum(0) >= 10]).pvalue > 1e-3
  assert dist.chi2_pvalue(dist.exact_probabilities(target, dist.ENC, cfg), spec) > 1e-3


def test_the_plan_names_each_layers_format_from_its_role(bf16_models):
  """modes.panel_format decides every layer: in mode 'packed' a bfloat16 network packs only
  its float32 logits (its bfloat16 layers keep XLA's dot); the roles match the layers'
  dtypes as the modules declare them."""
  (module, params), _ = bf16_models
  plan = packing.plan(module, params, 'packed')
  assert {p for p, (f, _) in plan.items() if f} == {('decoder', 'logits_dense', 'kernel')}
  assert all(why for _, why in plan.values())
  assert set(packing.decode_variables(module, params, 'packed')[matmul.COLLECTION]) == {'decoder'}
  float32_layers = set()

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, layers.Dense) and context.method_name == '__call__':
      if jnp.dtype(context.module.dtype) == jnp.float32:
        float32_layers.add(context.module.path + ('kernel',))
    return next_fun(*args, **kwargs)
  enc = jnp.ones((1, 4), jnp.int32)
  with nn.intercept_methods(record):
    module.apply({'params': params}, enc, enc)
  assert float32_layers == {p for p in packing.packed_weights(params)
                            if packing.role(p) != 'dtype'}


def test_apply_takes_only_tagged_panels():
  w = jnp.ones((8, 4), jnp.float32)
  with pytest.raises(TypeError, match='PackedKernel'):
    matmul.apply(jnp.ones((1, 8)), f32.pack(w), 4, jnp.float32)
  with pytest.raises(ValueError, match='only float32 layers'):
    matmul.apply(jnp.ones((1, 8)), matmul.pack(w, modes.F32_PANELS), 4, jnp.bfloat16)
  np.testing.assert_array_equal(
      matmul.apply(jnp.ones((1, 8)), matmul.pack(w, modes.BF16_PANELS), 4, 'float32'),
      np.full((1, 4), 8.0, np.float32))
