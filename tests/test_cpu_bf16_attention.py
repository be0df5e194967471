"""The bfloat16 cached attention of mode 'packed_bf16' (attention.cached_attention_bf16,
cpu/kernels/attention.cc CachedAttentionBf16) and the decode cache's 16-bit float bits
(rows.storage_dtype)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from test_cpu_bf16 import _bf16 as _round  # float32 values -> bfloat16 values, as float64
from specdec_t5x.algorithm import feature_draft, rows
from specdec_t5x.algorithm.cpu import attention, build, matmul, modes, packing
from specdec_t5x.algorithm.api import generate

needs_kernels = pytest.mark.skipif(not build.status()[0],
                                   reason='the CPU kernels need x86-64 with AVX2/FMA and g++')
_ATTEND = jax.jit(attention.cached_attention_bf16, static_argnums=4)


def _operands(b, q_len, h, d, s, seed):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((b, q_len, h, d)) * 0.4, jnp.bfloat16)
  k_t = jnp.asarray(rng.standard_normal((b, h, d, s)), jnp.bfloat16)
  v = jnp.asarray(rng.standard_normal((b, h, s, d)), jnp.bfloat16)
  bias = _round(rng.standard_normal((1, h, q_len, s)) * 2).astype(np.float32)
  bias[..., s // 2 + 1:] = -1e10  # masked slots
  return q, k_t, v, bias


def _reference(q, k_t, v, bias, f32_logits):
  """T5X's bfloat16 attention (float32 sums; scores, bias sum, differences, exps, the sum of
  the exps and the weights rounded to bfloat16; with f32_logits only the weights), float64
  for everything else."""
  q, k_t, v, bias = (np.asarray(jnp.asarray(a, jnp.float32), np.float64)
                     for a in (q, k_t, v, bias))
  scores = np.einsum('bqhd,bhdk->bhqk', q, k_t)
  r = (lambda a: a) if f32_logits else _round
  scores = r(r(scores) + bias)
  diff = r(scores - scores.max(-1, keepdims=True))
  e = r(np.exp(diff))
  w = _round(e / r(e.sum(-1, keepdims=True)))
  return np.einsum('bhqk,bhkd->bqhd', w, v)


@needs_kernels
@pytest.mark.parametrize('s,d', [(1, 8), (7, 5), (40, 64), (75, 72)])
@pytest.mark.parametrize('f32_logits', [False, True])
def test_matches_t5x_bfloat16_rounding_and_each_query_alone(s, d, f32_logits):
  """Slot counts around the kernel's 8- and 32-slot groups, head sizes around its 8- and
  64-element blocks; the context agrees with the reference to bfloat16 rounding, and a
  query's context is bitwise the same alone as among the others."""
  q, k_t, v, bias = _operands(2, 5, 3, d, s, seed=s * d)
  out = np.asarray(_ATTEND(q, k_t, v, bias, f32_logits))
  np.testing.assert_allclose(out, _reference(q, k_t, v, bias, f32_logits), rtol=2e-2,
                             atol=2e-2)
  for i in range(5):
    alone = _ATTEND(q[:, i:i + 1], k_t, v, bias[:, :, i:i + 1], f32_logits)
    np.testing.assert_array_equal(np.asarray(alone)[:, 0], out[:, i])


@needs_kernels
def test_agrees_with_xla_bfloat16_attention():
  """Rounded to bfloat16 as the layer rounds it, the kernel's context equals XLA's bfloat16
  einsum / softmax / einsum (layers.Attention._context's casts) nearly everywhere, and
  differs elsewhere by at most one bfloat16 step."""
  q, k_t, v, bias = _operands(2, 4, 6, 64, 70, seed=7)
  logits = jnp.einsum('bqhd,bhdk->bhqk', q, k_t) + jnp.asarray(bias).astype(jnp.bfloat16)
  weights = jax.nn.softmax(logits, axis=-1).astype(jnp.bfloat16)
  xla = np.asarray(jnp.einsum('bhqk,bhkd->bqhd', weights, v).astype(jnp.float32))
  ours = np.asarray(_ATTEND(q, k_t, v, bias, False).astype(jnp.bfloat16).astype(jnp.float32))
  assert np.mean(ours == xla) > 0.97
  np.testing.assert_allclose(ours, xla, rtol=2 ** -7, atol=1e-6)


@needs_kernels
def test_reads_a_caches_bits_as_its_bfloat16_values():
  q, k_t, v, bias = _operands(1, 3, 2, 16, 20, seed=3)
  bits = lambda a: jax.lax.bitcast_convert_type(a, jnp.uint16)
  np.testing.assert_array_equal(_ATTEND(q, bits(k_t), bits(v), bias, False),
                                _ATTEND(q, k_t, v, bias, False))


@needs_kernels
def test_nonfinite_scores_and_bad_operands():
  q, k_t, v, bias = _operands(1, 2, 2, 8, 6, seed=4)
  q = q.at[0, 1, 0, 2].set(jnp.nan)
  out = np.asarray(_ATTEND(q, k_t, v, bias, False))
  assert np.isnan(out[0, 1, 0]).all() and np.isfinite(out[0, 0]).all()
  assert np.isfinite(out[0, 1, 1]).all()
  with pytest.raises(ValueError, match='4-d'):
    attention.cached_attention_bf16(q, k_t, v, bias[0])
  with pytest.raises(Exception, match='cached_attention_bf16 needs'):
    attention.cached_attention_bf16(q, k_t.astype(jnp.float32), v, bias)
  with pytest.raises(Exception, match='cached_attention_bf16 needs'):
    attention.cached_attention_bf16(q, k_t, v[:, :, :5], bias)


def test_cpu_caches_keep_16_bit_floats_as_bits():
  assert rows.storage_dtype(jnp.bfloat16) == jnp.uint16
  assert rows.storage_dtype(jnp.float16) == jnp.uint16
  assert rows.storage_dtype(jnp.float32) == jnp.float32
  with modes.accelerator_forms():  # an accelerator's program keeps bfloat16
    assert rows.storage_dtype(jnp.bfloat16) == jnp.bfloat16
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3)), jnp.bfloat16)
  buffer = jnp.zeros((2, 3), jnp.uint16)
  np.testing.assert_array_equal(rows.load(rows.store(x, buffer), jnp.bfloat16), x)
  with pytest.raises(ValueError, match='16-bit float bits'):
    rows.store(x.astype(jnp.float32), buffer)
  with pytest.raises(ValueError, match='rows.store'):
    rows.update(buffer, x, jnp.zeros((2,), jnp.int32), axis=1)


def test_a_write_into_a_bits_cache_converts_nothing():
  """XLA:CPU computes a bfloat16 write in float32, converting the whole buffer; a write of
  the bits into the uint16 buffer compiles to no float conversion of the buffer."""
  def write(cache, new, start):
    return rows.update_all((cache,), (rows.store(new, cache),), start, axes=(3,))[0][0]
  hlo = jax.jit(write).lower(jnp.zeros((1, 4, 8, 300), jnp.uint16),
                             jnp.ones((1, 4, 8, 1), jnp.bfloat16),
                             jnp.zeros((1,), jnp.int32)).compile().as_text()
  assert 'f32[1,4,8,300]' not in hlo and 'bf16[1,4,8,300]' not in hlo


@needs_kernels
def test_bf16_decodes_run_the_bf16_attention_and_cast_params_pair_their_logits():
  """Mode 'packed_bf16' decodes a bfloat16 network's cached attention with the kernel
  (mode 'packed' with XLA's ops); params cast to bfloat16 put the tied logits on pair
  panels too; greedy speculative decoding gives the target's tokens either way."""
  if not modes.cpu_has_dpbf16():
    pytest.skip('pair panels need AVX-512 BF16')
  module, params = make_model(tiny_config(v11=False, dtype=jnp.bfloat16), seed=2,
                              logit_scale=3.0)
  params = jax.tree_util.tree_map(lambda w: w.astype(jnp.bfloat16), params)
  target = (module, params)
  draft = make_model(tiny_config(emb=16, layers=1, v11=False, dtype=jnp.bfloat16), seed=3)
  variables = packing.decode_variables(module, params, 'packed_bf16')
  embedding = variables[matmul.COLLECTION]['token_embedder']['embedding']
  assert embedding.panel_format == modes.PAIR_PANELS
  enc = random_inputs(2, 8, 40, seed=9)
  cache = module.apply(variables, module.apply(variables, enc, method='encode'), enc, 12,
                       method='init_cache')
  assert cache['layers'][0]['k'].dtype == jnp.uint16
  for mode, runs_kernel in (('packed_bf16', True), ('packed', False)):
    def extend(variables, cache):
      with modes.decode_mode(mode):
        return module.apply(variables, cache, jnp.ones((2, 3), jnp.int32),
                            jnp.zeros((2,), jnp.int32), method='extend')[0]
    hlo = jax.jit(extend).lower(packing.decode_variables(module, params, mode), cache).as_text()
    assert ('specdec_cached_attention_bf16' in hlo) == runs_kernel
  plain = generate(target, enc, max_decode_length=10, cpu_kernels='packed_bf16')
  for gamma in (1, 4):
    spec = generate(target, enc, draft=draft, gamma=gamma, max_decode_length=10,
                    cpu_kernels='packed_bf16')
    np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_a_bfloat16_feature_head_gets_pair_panels_and_keeps_greedy_exact():
  """In mode 'packed_bf16' a bfloat16 feature head's bfloat16 layers run on pair panels, as
  the target's do (not XLA's bfloat16 dot), and greedy speculative decoding with it gives
  the target's tokens."""
  if not modes.cpu_has_dpbf16():
    pytest.skip('pair panels need AVX-512 BF16')
  target = make_model(tiny_config(v11=False, dtype=jnp.bfloat16), seed=2, logit_scale=3.0)
  config = feature_draft.FeatureDraftConfig(vocab_size=40, target_emb_dim=32, emb_dim=16,
                                            num_heads=2, head_dim=8, mlp_dim=32,
                                            dtype='bfloat16')
  head = (feature_draft.FeatureDraft(config),
          feature_draft.init_params(config, jax.random.PRNGKey(3), target[1]))
  packed = packing.decode_variables(*head, 'packed_bf16')[matmul.COLLECTION]
  assert packed['feature_in']['kernel'].panel_format == modes.PAIR_PANELS
  packed = packing.decode_variables(*head, 'packed')[matmul.COLLECTION]  # XLA's bfloat16 dot
  assert 'feature_in' not in packed
  assert packed['feature_out']['kernel'].panel_format == modes.F32_PANELS
  enc = random_inputs(2, 8, 40, seed=9)
  plain = generate(target, enc, max_decode_length=10, cpu_kernels='packed_bf16')
  for gamma in (1, 3):
    spec = generate(target, enc, draft=head, gamma=gamma, max_decode_length=10,
                    cpu_kernels='packed_bf16')
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert int(np.sum(spec.stats['drafted_tokens'])) > 0  # the head drafted
