"""Inverse-CDF sampling: exact frequencies, zero-probability tokens never drawn; the argmax."""

import contextlib

import jax
import numpy as np
import pytest

from specdec_t5x.algorithm import sampling
from specdec_t5x.algorithm.cpu import modes

FORMS = pytest.mark.parametrize('accelerator_forms', [False, True],
                                ids=['cpu_forms', 'accelerator_forms'])


def _sampler(accelerator_forms, keys, probs):
  """sampling.sample jitted in the chosen form (on CPU the row kernel, elsewhere the
  two-level CDF of XLA ops), checked to take it."""
  form = modes.accelerator_forms() if accelerator_forms else contextlib.nullcontext()
  with form:  # a fresh function: jit reuses a function's trace, whatever the form
    fn = jax.jit(lambda k, p: sampling.sample(k, p))  # pylint: disable=unnecessary-lambda
    uses_kernel = 'specdec_row_sample' in fn.lower(keys, probs).as_text()
  assert uses_kernel == (not accelerator_forms and modes.enabled())
  return fn


@FORMS
def test_sample_matches_probabilities_and_skips_zero_mass(accelerator_forms):
  probs = np.array([0.0, 0.5, 0.0, 0.2, 0.3, 0.0], np.float32)
  n = 200000
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  probs_n = np.broadcast_to(probs, (n, 6))
  draws = np.asarray(_sampler(accelerator_forms, keys, probs_n)(keys, probs_n))
  freq = np.bincount(draws, minlength=6) / n
  assert freq[[0, 2, 5]].sum() == 0  # never a zero-probability token, also at the ends
  np.testing.assert_allclose(freq, probs, atol=4 / np.sqrt(n))


@FORMS
def test_sample_with_one_hot_is_argmax(accelerator_forms):
  probs = np.eye(7, dtype=np.float32)[[6, 0, 3]]
  keys = jax.random.split(jax.random.PRNGKey(1), 3)
  np.testing.assert_array_equal(_sampler(accelerator_forms, keys, probs)(keys, probs), [6, 0, 3])


@FORMS
def test_sample_over_blocks_matches_probabilities_with_zero_blocks_and_a_ragged_tail(
    accelerator_forms):
  # 300 entries = two full blocks and a ragged one; mass at block edges, a whole block
  # without mass, and zero entries beside the drawn ones.
  v = 2 * sampling.SAMPLE_BLOCK + 44
  probs = np.zeros(v, np.float32)
  support = {0: 0.1, sampling.SAMPLE_BLOCK - 1: 0.2, 2 * sampling.SAMPLE_BLOCK: 0.05,
             2 * sampling.SAMPLE_BLOCK + 1: 0.25, v - 1: 0.4}
  for i, p in support.items():
    probs[i] = p
  n = 200000
  keys = jax.random.split(jax.random.PRNGKey(2), n)
  probs_n = np.broadcast_to(probs, (n, v))
  draws = np.asarray(_sampler(accelerator_forms, keys, probs_n)(keys, probs_n))
  freq = np.bincount(draws, minlength=v) / n
  assert set(np.flatnonzero(freq)) <= set(support)
  np.testing.assert_allclose(freq, probs, atol=4 / np.sqrt(n))


@FORMS
def test_sample_never_draws_zero_mass_when_the_block_sums_round(accelerator_forms):
  # Many tiny masses: the running block sums and the in-block sums round differently,
  # which must not let a draw land on a zero-probability entry.
  rng = np.random.RandomState(0)
  v = 8192
  probs = np.where(rng.rand(8, v) < 0.5, rng.rand(8, v) ** 8, 0.0).astype(np.float32)
  probs[:, -300:] = 0.0
  keys = jax.random.split(jax.random.PRNGKey(3), 4096)
  rows = np.arange(4096) % 8
  draws = np.asarray(_sampler(accelerator_forms, keys, probs[rows])(keys, probs[rows]))
  assert np.all(probs[rows, draws] > 0)


@pytest.mark.parametrize('accelerator_forms', [False, True])
@pytest.mark.parametrize('vocab', [5, 300, 8192])
def test_argmax_is_jnp_argmax_on_ties_infinities_and_nans(accelerator_forms, vocab):
  """Both forms (on CPU the row kernel, one pass per row; elsewhere float reductions) give
  jnp.argmax's index and flag exactly the rows holding a NaN or an infinity."""
  rng = np.random.RandomState(vocab)
  x = np.round(rng.randn(64, 3, vocab), 1).astype(np.float32)  # many ties
  x[1, 0, :] = -np.inf
  x[2, 1, [1, 3]] = np.inf
  x[3, 2, 2] = np.nan
  x[4, 0, [vocab - 1, 0]] = np.nan
  x[5, 1, :] = np.nan
  x[6, 2, :] = 0.0
  x[6, 2, 3 % vocab] = -0.0
  x[7, 0, vocab - 1] = -np.inf
  x[8, 1, :] = -3.0
  x[8, 1, vocab - 1] = 1e30
  form = modes.accelerator_forms() if accelerator_forms else contextlib.nullcontext()
  with form:  # fresh functions: jit reuses a function's trace, whatever the form
    fn = jax.jit(lambda a: sampling.argmax_checked(a))  # pylint: disable=unnecessary-lambda
    uses_kernel = 'specdec_row_argmax' in fn.lower(x).as_text()
    assert uses_kernel == (not accelerator_forms and modes.enabled())
    for dtype in (np.float32, jax.numpy.bfloat16):
      index, bad = fn(x.astype(dtype))
      np.testing.assert_array_equal(index, np.asarray(jax.numpy.argmax(x.astype(dtype), -1)))
      np.testing.assert_array_equal(bad, ~np.isfinite(x).all(-1))
      assert index.dtype == np.int32 and bad.dtype == np.bool_
      np.testing.assert_array_equal(jax.jit(lambda a: sampling.argmax(a))(x.astype(dtype)),  # pylint: disable=unnecessary-lambda
                                    index)


def _standardized_by_reductions(logits, cfg):
  """standardize written with jnp.max and jax.nn.softmax: what standardize_checked's one
  kernel pass per row (row max from the argmax; softmax without a second max) must equal."""
  logits = logits.astype(np.float32)
  top = jax.numpy.max(logits, axis=-1, keepdims=True)
  shifted = logits - top
  logits = jax.numpy.where(shifted < 0, shifted / cfg.temperature, 0.0)
  if cfg.topk:
    kth = jax.lax.top_k(logits, cfg.topk)[0][..., -1:]
    logits = jax.numpy.where(logits < kth, -np.inf, logits)
  elif cfg.topp:
    sorted_logits = -jax.numpy.sort(-logits, axis=-1)
    cum = jax.numpy.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    cut = jax.numpy.minimum(jax.numpy.sum(cum < cfg.topp, axis=-1, keepdims=True),
                            logits.shape[-1] - 1)
    cutoff = jax.numpy.take_along_axis(sorted_logits, cut, axis=-1)
    logits = jax.numpy.where(logits < cutoff, -np.inf, logits)
  return jax.nn.softmax(logits, axis=-1)


@pytest.mark.parametrize('accelerator_forms', [False, True])
@pytest.mark.parametrize('cfg', [sampling.SamplingConfig(temperature=0.7),
                                 sampling.SamplingConfig(temperature=1.0, topk=3),
                                 sampling.SamplingConfig(temperature=1.3, topp=0.8)],
                         ids=['t0.7', 'topk3', 'topp0.8'])
def test_standardize_checked_is_the_reductions_form_on_edge_rows(accelerator_forms, cfg):
  """The row max taken at the argmax and the softmax without a second max (on CPU the row
  kernel's vectorised exp) give the same distributions as jnp.max and jax.nn.softmax
  (ties, -inf and +inf rows, the exp's whole range included), and the
  flag marks exactly the rows holding a NaN or an infinity. (A row holding a NaN has no
  distribution to agree on: XLA:CPU's max may skip the NaN; the decoders stop on the flag.)"""
  rng = np.random.RandomState(7)
  x = np.round(rng.randn(16, 3, 300) * 3, 1).astype(np.float32)  # many ties
  x[1, 0, :] = -np.inf
  x[1, 1, 5:] = -np.inf
  x[2, 1, [1, 3]] = np.inf
  x[3, 2, 2] = np.nan
  x[4, 0, :] = np.nan
  x[5, 1, :] = 0.0
  x[6, 2, 7] = 1e30
  x[7, 0, :] = np.linspace(-130.0, 0.0, 300) * cfg.temperature  # exp's whole range, underflow
  x[7, 1, :] = np.linspace(-1.0, 1.0, 300)
  form = modes.accelerator_forms() if accelerator_forms else contextlib.nullcontext()
  with form:
    fn = jax.jit(lambda a: sampling.standardize_checked(a, cfg))
    uses_kernel = 'specdec_row_softmax' in fn.lower(x).as_text()
    probs, bad = fn(x)
  # The kernel takes the plain temperature form; top-k / top-p keep XLA's ops.
  assert uses_kernel == (not accelerator_forms and modes.enabled()
                         and not cfg.topk and not cfg.topp)
  np.testing.assert_array_equal(bad, ~np.isfinite(x).all(-1))
  no_nan = ~np.isnan(x).any(-1)
  np.testing.assert_allclose(np.asarray(probs)[no_nan],
                             np.asarray(_standardized_by_reductions(x, cfg))[no_nan],
                             rtol=1e-6, atol=1e-7)
  good = np.isfinite(x).all(-1)
  np.testing.assert_allclose(np.asarray(probs)[good].sum(-1), 1.0, rtol=1e-5)
