"""The packed CPU matmul of the decode path (algorithm/cpu/f32.py, matmul.py, packing.py and
cpu/kernels/matmul_f32.cc), its build (cpu/build.py) and the cached attention (cpu/attention.py)."""

import gc
import os
import subprocess
import sys
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x.algorithm import api, network
from specdec_t5x.algorithm.cpu import attention, build, f32, matmul, modes, packing
from specdec_t5x.algorithm.config import DecodeConfig

# Only a CPU without AVX2/FMA skips; on x86-64 (CI) a failed build fails these tests.
pytestmark = pytest.mark.skipif(
    not build.cpu_has_avx2_fma(),
    reason='the packed CPU matmul needs x86-64 with AVX2 and FMA')


def test_enabled_here():
  assert modes.enabled(), build.status()


def _product(x, w):
  return np.asarray(jax.jit(f32.matmul, static_argnums=2)(
      jnp.asarray(x), f32.pack(jnp.asarray(w)), w.shape[1]))


@pytest.mark.parametrize('k,n', [(5, 1), (64, 15), (64, 16), (64, 17), (384, 100), (128, 1000)])
def test_matmul_matches_float64_reference(k, n):
  rng = np.random.default_rng(k * n)
  w = rng.standard_normal((k, n)).astype(np.float32)
  for m in (1, 2, 3, 4, 5, 8, 13):
    x = rng.standard_normal((m, k)).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    bound = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
    err = np.abs(_product(x, w) - exact)
    assert np.all(err <= 4 * k * np.finfo(np.float32).eps * bound + 1e-30), (m, float(err.max()))


def test_rows_are_bitwise_independent_of_the_other_rows():
  """A row's result is the same in a 1-row call as in any larger call (gamma + 1 rows of a
  verify call equal the one-token steps of the same rows)."""
  rng = np.random.default_rng(0)
  w = rng.standard_normal((384, 1000)).astype(np.float32)
  x = rng.standard_normal((9, 384)).astype(np.float32)
  full = _product(x, w)
  for m in range(1, 9):
    np.testing.assert_array_equal(_product(x[:m], w), full[:m])
  for r in range(9):
    np.testing.assert_array_equal(_product(x[r:r + 1], w)[0], full[r])


def test_leading_dimensions_and_bad_shapes():
  rng = np.random.default_rng(1)
  w = rng.standard_normal((32, 40)).astype(np.float32)
  x = rng.standard_normal((2, 3, 32)).astype(np.float32)
  y = np.asarray(f32.matmul(jnp.asarray(x), f32.pack(jnp.asarray(w)), 40))
  assert y.shape == (2, 3, 40)
  np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match='do not make'):
    f32.matmul(jnp.asarray(x), f32.pack(jnp.asarray(w)), 20)
  with pytest.raises(ValueError, match='do not make'):
    f32.matmul(jnp.asarray(x[..., :16]), f32.pack(jnp.asarray(w)), 40)


def _bf16_valued(shape, seed):
  """float32 values that bfloat16 holds exactly (as restored from a bfloat16 checkpoint)."""
  w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  return np.array(jnp.asarray(w).astype(jnp.bfloat16).astype(jnp.float32))


@pytest.mark.parametrize('k,n', [(5, 1), (64, 15), (64, 17), (384, 100), (128, 1000)])
def test_bf16_panels_give_the_float32_panels_products_bitwise(k, n):
  """bfloat16 panels are widened to the very float32 weights: the same products, bit for bit,
  for any number of rows (every tile) and widths that end inside a panel."""
  w = _bf16_valued((k, n), k + n)
  assert bool(f32.holds_in_bf16(jnp.asarray(w)))
  p32, p16 = f32.pack(jnp.asarray(w)), f32.pack(jnp.asarray(w), bf16_storage=True)
  assert p16.dtype == jnp.bfloat16 and p16.shape == p32.shape
  # The interleaved layout: p[j, k, 2 i + h] = w[k, 16 j + 8 h + i].
  np.testing.assert_array_equal(np.asarray(p16[0, :, 1].astype(jnp.float32)),
                                np.asarray(p32[0, :, 8]))
  x = np.random.default_rng(k).standard_normal((18, k)).astype(np.float32)
  for m in range(1, 19):  # every tile and remainder: 2..8 rows in one, 9 = 8 + 1, 17, 18
    got = jax.jit(f32.matmul, static_argnums=2)(jnp.asarray(x[:m]), p16, n)
    want = jax.jit(f32.matmul, static_argnums=2)(jnp.asarray(x[:m]), p32, n)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_bf16_panels_without_avx512_tiles_give_the_same_products():
  """Where the CPU has AVX-512, calls of 2+ rows on bfloat16 panels use its tiles; the AVX2
  tiles (every other x86-64 CPU) must give the same bits: run them in a child process."""
  code = (
      'import jax, jax.numpy as jnp, numpy as np\n'
      'from specdec_t5x.algorithm.cpu import f32 as ck\n'
      'rng = np.random.default_rng(7)\n'
      'w = jnp.asarray(rng.standard_normal((96, 200)), jnp.bfloat16).astype(jnp.float32)\n'
      'x = jnp.asarray(rng.standard_normal((9, 96)), jnp.float32)\n'
      'print(np.asarray(ck.matmul(x, ck.pack(w, bf16_storage=True), 200)).tobytes().hex())\n')
  rng = np.random.default_rng(7)
  w = jnp.asarray(rng.standard_normal((96, 200)), jnp.bfloat16).astype(jnp.float32)
  x = jnp.asarray(rng.standard_normal((9, 96)), jnp.float32)
  want = np.asarray(f32.matmul(x, f32.pack(w), 200)).tobytes().hex()
  for avx512 in ('0', '1'):
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         env=dict(os.environ, SPECDEC_CPU_KERNELS_AVX512=avx512), check=True)
    assert out.stdout.strip().splitlines()[-1] == want, avx512


def test_holds_in_bf16_only_for_bfloat16_values():
  w = _bf16_valued((8, 8), 0)
  assert bool(f32.holds_in_bf16(jnp.asarray(w)))
  w[3, 4] += np.float32(2.0 ** -20) * max(1.0, abs(float(w[3, 4])))  # below bfloat16's step
  assert not bool(f32.holds_in_bf16(jnp.asarray(w)))


def _tiny(logits_via_embedding, dtype='float32'):
  cfg = network.T5Config(vocab_size=300, dtype=dtype, emb_dim=48, num_heads=2, num_encoder_layers=1,
                         num_decoder_layers=2, head_dim=16, mlp_dim=80,
                         mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
                         logits_via_embedding=logits_via_embedding)
  module = network.Transformer(cfg)
  enc = jnp.asarray(np.random.default_rng(2).integers(2, 300, (2, 9)), jnp.int32)
  params = module.init(jax.random.PRNGKey(0), enc, enc)['params']
  return module, params, enc


@pytest.mark.parametrize('tied,dtype', [(True, 'float32'), (False, jnp.float32)])
def test_decode_kernels_cover_every_dense_layer_and_agree_with_xla(tied, dtype):
  """dtype as gin gives it (a name) or as a type."""
  module, params, enc = _tiny(tied, dtype)
  packed = packing.decode_kernels(params)
  dense = [p for p, _ in jax.tree_util.tree_leaves_with_path(params) if p[-1].key == 'kernel']
  assert len(jax.tree_util.tree_leaves(packed)) == len(dense) + tied
  assert ('token_embedder' in packed) == tied
  plain = {'params': params}
  fast = dict(plain, **{matmul.COLLECTION: packed})
  tokens = jnp.asarray([[0, 5, 7, 9], [0, 3, 4, 4]], jnp.int32)

  def logits(variables):
    encoded = module.apply(variables, enc, method='encode')
    cache = module.apply(variables, encoded, enc, 12, method='init_cache')
    return module.apply(variables, cache, tokens, jnp.zeros((2,), jnp.int32),
                        method='extend')[0]

  np.testing.assert_allclose(jax.jit(logits)(fast), jax.jit(logits)(plain), rtol=1e-5, atol=1e-5)
  fast_jaxpr, plain_jaxpr = (str(jax.make_jaxpr(logits)(v)) for v in (fast, plain))
  calls = fast_jaxpr.count('specdec_panel_matmul')
  assert calls == len(dense) + tied  # every Dense layer once, plus the tied logits
  assert 'specdec_panel_matmul' not in plain_jaxpr
  # The cached attention is the row kernels' (with or without packed weights): one call
  # per attention block of each decoder layer.
  for jaxpr in (fast_jaxpr, plain_jaxpr):
    assert jaxpr.count(build.CACHED_ATTENTION) == 2 * 2


def test_generate_uses_the_kernels_once_per_params_and_matches_xla():
  module, params, enc = _tiny(True)
  variables = packing.decode_variables(module, params)
  assert matmul.COLLECTION in variables
  assert packing.decode_variables(module, params)[matmul.COLLECTION] is \
      variables[matmul.COLLECTION]  # packed once, cached while params live
  fast = api.generate((module, params), enc, draft=(module, params), gamma=3,
                      max_decode_length=10)
  ar_fast = api.generate((module, params), enc, max_decode_length=10)
  assert not modes.enabled('xla')
  assert matmul.COLLECTION not in packing.decode_variables(module, params, 'xla')
  plain = api.generate((module, params), enc, max_decode_length=10, cpu_kernels='xla')
  for mode, kernel_calls in (('xla', False), ('packed', True)):  # traced in the config's mode
    program = api.decode_program(module, None, max_len=10, config=DecodeConfig(cpu_kernels=mode))
    jaxpr = str(jax.make_jaxpr(program)(packing.decode_variables(module, params, mode), None, enc,
                                        jax.random.PRNGKey(0), 1))
    assert ('specdec_' in jaxpr) == kernel_calls, mode  # every kernel's FFI target
  np.testing.assert_array_equal(fast.tokens, ar_fast.tokens)  # greedy: exact either way
  np.testing.assert_array_equal(ar_fast.tokens, plain.tokens)


def test_the_panels_of_params_freed_are_freed_with_them():
  """The cache of packed panels (a second copy of every weight) holds an entry only while
  its params live: a process that drops one model and loads the next keeps no copy of the
  first."""
  module, params, _ = _tiny(False)
  params = jax.tree_util.tree_map(lambda x: x + 0, params)  # leaves only this test holds
  panels = weakref.ref(jax.tree_util.tree_leaves(
      packing.decode_variables(module, params)[matmul.COLLECTION])[0])
  cached = lambda: [m for m in packing.cached_collections()
                    if any(x is panels() for x in jax.tree_util.tree_leaves(m))]
  assert panels() is not None and len(cached()) == 1  # cached while the params live
  del params
  gc.collect()  # (other tests' dead params may go too: only this entry is checked)
  assert panels() is None and not cached()


def test_params_restored_from_bfloat16_decode_with_bf16_panels_and_the_same_tokens():
  """Params that bfloat16 holds exactly get bfloat16 panels (half the bytes per call) and
  decode to the very tokens of float32 panels; other params, or kernel mode 'packed_f32',
  get float32 panels."""
  module, params, enc = _tiny(True)
  assert not bool(packing.kernels_hold_in_bf16(params))  # a float32 init
  dtypes = lambda v: {str(x.dtype) for x in jax.tree_util.tree_leaves(v[matmul.COLLECTION])}
  assert dtypes(packing.decode_variables(module, params)) == {'float32'}
  restored = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
  assert bool(packing.kernels_hold_in_bf16(restored))
  assert dtypes(packing.decode_variables(module, restored)) == {'bfloat16'}
  run = lambda **kw: api.generate((module, restored), enc, max_decode_length=10, **kw).tokens
  half = [run(), run(draft=(module, restored), gamma=3)]
  assert dtypes(packing.decode_variables(module, restored, 'packed_f32')) == {'float32'}
  full = [run(cpu_kernels='packed_f32'), run(draft=(module, restored), gamma=3,
                                            cpu_kernels='packed_f32')]
  for a, b in zip(half, full):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(half[0], half[1])  # greedy speculative == AR, as always


def test_packing_inside_a_trace_is_never_cached():
  """Concrete params first packed inside an outer jit (T5X's infer calls the model so) must
  not leave that trace's values in the cache for the next call outside it."""
  module, params, enc = _tiny(True)
  params = jax.tree_util.tree_map(jnp.array, params)  # fresh leaves: nothing cached yet
  inside = jax.jit(lambda e: api.generate((module, params), e, draft=(module, params),
                                          gamma=2, max_decode_length=6).tokens)(enc)
  outside = api.generate((module, params), enc, draft=(module, params), gamma=2,
                         max_decode_length=6)
  np.testing.assert_array_equal(inside, outside.tokens)
  packed = packing.decode_variables(module, params)[matmul.COLLECTION]
  assert not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(packed))


def test_params_cast_to_bfloat16_get_bfloat16_panels_inside_a_trace_too():
  """Params cast to bfloat16 (as T5X's infer restores a bfloat16 checkpoint, then traces them
  under its jit) are packed as bfloat16 panels by their dtype, tied logits included, with no
  value check (inside a trace it would be a tracer), and decode to the tokens of the same
  values in float32 and of XLA's ops."""
  module, params, enc = _tiny(True)
  half = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
  packed = lambda p: packing.decode_variables(module, p)[matmul.COLLECTION]
  for made in (packed(half), jax.jit(packed)(half)):
    assert {str(x.dtype) for x in jax.tree_util.tree_leaves(made)} == {'bfloat16'}
    assert 'embedding' in made['token_embedder']  # the tied logits: no per-step transpose
  run = jax.jit(lambda t, d, e: api.generate((module, t), e, draft=(module, d), gamma=2,
                                             max_decode_length=6).tokens)
  inside = run(half, half, enc)
  outside = api.generate((module, half), enc, draft=(module, half), gamma=2,
                         max_decode_length=6)
  np.testing.assert_array_equal(inside, outside.tokens)
  widened = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), half)
  for kw in ({}, {'cpu_kernels': 'xla'}):
    np.testing.assert_array_equal(
        api.generate((module, widened), enc, max_decode_length=6, **kw).tokens, inside)


def test_without_a_compiler_decoding_falls_back_to_xla(tmp_path):
  code = (
      'import jax, jax.numpy as jnp, numpy as np\n'
      'from specdec_t5x.algorithm import api, network\n'
      'from specdec_t5x.algorithm.cpu import matmul, modes, packing\n'
      'cfg = network.T5Config(vocab_size=64, emb_dim=16, num_heads=1, num_encoder_layers=1,'
      ' num_decoder_layers=1, head_dim=8, mlp_dim=32, dropout_rate=0.0)\n'
      'm = network.Transformer(cfg); enc = jnp.ones((1, 4), jnp.int32)\n'
      'p = m.init(jax.random.PRNGKey(0), enc, enc)["params"]\n'
      'assert not modes.enabled()\n'
      'assert matmul.COLLECTION not in packing.decode_variables(m, p)\n'
      'print(api.generate((m, p), enc, max_decode_length=3).tokens.shape)\n')
  env = dict(os.environ, CXX=str(tmp_path / 'no-such-compiler'),
             SPECDEC_KERNEL_CACHE=str(tmp_path / 'cache'), JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert '(1, 3)' in out.stdout
  assert 'packed CPU matmul is off (no C++ compiler' in out.stderr


def test_build_is_cached_and_atomic(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECDEC_KERNEL_CACHE', str(tmp_path))
  path = build.build()
  stamp = os.stat(path).st_mtime_ns
  assert build.build() == path and os.stat(path).st_mtime_ns == stamp
  assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(path),
                                                 os.path.basename(path) + '.lock'])


def _attention_reference(q, k_t, v, bias):
  """XLA's form of layers.Attention.attend_cached, in float64."""
  q, k_t, v, bias = (np.asarray(a, np.float64) for a in (q, k_t, v, bias))
  scores = np.einsum('bqhd,bhdk->bhqk', q, k_t) + bias
  w = np.exp(scores - scores.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum('bhqk,bhkd->bqhd', w, v)


@pytest.mark.parametrize('s,d', [(1, 8), (7, 5), (69, 64), (130, 16)])
def test_cached_attention_matches_float64_and_each_query_alone(s, d):
  """Every bias broadcast the decoder uses; a query's context is bitwise the same alone
  as among the others (a verify window's rows are the one-token steps')."""
  rng = np.random.default_rng(s * d)
  b, q_len, h = 2, 5, 3
  q = rng.standard_normal((b, q_len, h, d)).astype(np.float32)
  k_t = rng.standard_normal((b, h, d, s)).astype(np.float32)
  v = rng.standard_normal((b, h, s, d)).astype(np.float32)
  attend = jax.jit(attention.cached_attention)
  for shape in ((b, h, q_len, s), (b, 1, 1, s), (1, h, q_len, s), (1, 1, 1, s)):
    bias = rng.standard_normal(shape).astype(np.float32) * 3
    bias[..., s // 2 + 1:] = -1e10  # masked slots: weight 0
    out = np.asarray(attend(q, k_t, v, bias))
    np.testing.assert_allclose(out, _attention_reference(q, k_t, v, bias), rtol=1e-5, atol=1e-5)
    for i in range(q_len):
      row = bias[:, :, i:i + 1] if shape[2] > 1 else bias
      np.testing.assert_array_equal(np.asarray(attend(q[:, i:i + 1], k_t, v, row))[:, 0],
                                    out[:, i])


def test_cached_attention_nonfinite_scores_and_bad_shapes():
  rng = np.random.default_rng(3)
  q = rng.standard_normal((1, 2, 2, 4)).astype(np.float32)
  k_t = rng.standard_normal((1, 2, 4, 6)).astype(np.float32)
  v = rng.standard_normal((1, 2, 6, 4)).astype(np.float32)
  bias = np.zeros((1, 1, 1, 6), np.float32)
  q[0, 1, 0, 2] = np.nan
  out = np.asarray(attention.cached_attention(q, k_t, v, bias))
  assert np.isnan(out[0, 1, 0]).all() and np.isfinite(np.delete(out.reshape(4, 4), 2, 0)).all()
  bias_inf = bias.copy()
  bias_inf[..., 3] = np.inf
  assert np.isnan(np.asarray(attention.cached_attention(q[:, :1], k_t, v, bias_inf))).all()
  with pytest.raises(ValueError, match='4-d'):
    attention.cached_attention(q, k_t, v, bias[0])
  with pytest.raises(Exception, match='cached_attention needs'):
    attention.cached_attention(q, k_t, v[:, :, :5], bias)


def test_cached_attention_differentiates_as_xla_attention():
  """A feature head trains through its cached attention: the kernel's gradient is the XLA
  form's (and its forward agrees with it to float32 rounding)."""
  from specdec_t5x.algorithm import layers  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(4)
  q, k_t, v = (jnp.asarray(rng.standard_normal(s), jnp.float32)
               for s in ((2, 3, 2, 8), (2, 2, 8, 11), (2, 2, 11, 8)))
  bias = jnp.asarray(rng.standard_normal((2, 1, 1, 11)), jnp.float32)
  probe = jnp.asarray(rng.standard_normal((2, 3, 2, 8)), jnp.float32)
  loss = lambda f: lambda *a: jnp.sum(f(*a) * probe)
  kernel = jax.jit(jax.grad(loss(layers._kernel_cached_context), argnums=(0, 1, 2, 3)))  # pylint: disable=protected-access
  xla = jax.grad(loss(layers._xla_cached_context), argnums=(0, 1, 2, 3))  # pylint: disable=protected-access
  for got, want in zip(kernel(q, k_t, v, bias), xla(q, k_t, v, bias)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert build.CACHED_ATTENTION in str(jax.make_jaxpr(kernel)(q, k_t, v, bias))
