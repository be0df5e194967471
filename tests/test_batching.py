"""Length buckets (specdec_t5x/batching.py): the sizes, and that bucketing changes no token.

A batch decoded at its bucket must give the tokens and statistics of the same batch padded
to the full feature length: greedy and sampled (same rng), autoregressive and speculative.
The infer runner must hand the model bucketed inputs and leave compiling batches out of
its timing.
"""

import jax
import numpy as np
import pytest
from conftest import random_inputs

from specdec_t5x.algorithm import api, batching
from specdec_t5x.integration import infer_run


@pytest.mark.parametrize('n, max_len, min_len, expected', [
    (0, 128, 16, 16), (1, 128, 16, 16), (16, 128, 16, 16), (17, 128, 16, 32),
    (32, 128, 16, 32), (33, 128, 16, 64), (64, 128, 16, 64), (65, 128, 16, 128),
    (128, 128, 16, 128), (5, 128, 8, 8), (9, 128, 8, 16), (3, 8, 16, 8),
    (40, 100, 16, 64), (65, 100, 16, 100), (300, None, 16, 512)])
def test_bucket_sizes(n, max_len, min_len, expected):
  assert batching.bucket_length(n, max_len, min_len) == expected


def test_buckets_of_a_feature_length_are_few():
  assert sorted({batching.bucket_length(n, 128) for n in range(129)}) == [16, 32, 64, 128]
  assert sorted({batching.bucket_length(n, 512) for n in range(513)}) == [
      16, 32, 64, 128, 256, 512]


@pytest.mark.parametrize('call, pattern', [
    (lambda: batching.bucket_length(129, 128), 'does not fit the feature length 128'),
    (lambda: batching.bucket_length(-1, 128), 'must be >= 0'),
    (lambda: batching.bucket_length(4, 128, min_len=12), 'power of two'),
    (lambda: batching.pad_batch([[3] * 20], 16), 'does not fit the feature length 16'),
    (lambda: batching.pad_batch([], 16), 'at least one row'),
    (lambda: batching.trim_batch(np.zeros(4, np.int32)), r'\[batch, length\]')])
def test_clear_errors(call, pattern):
  with pytest.raises(ValueError, match=pattern):
    call()


def test_pad_and_trim_agree():
  rows = [np.arange(2, 7), np.arange(2, 22), np.arange(2, 4)]  # 5, 20, 2 tokens
  padded = batching.pad_batch(rows, 128)
  assert padded.shape == (3, 32) and padded.dtype == np.int32
  for r, row in enumerate(rows):
    assert padded[r, :len(row)].tolist() == row.tolist() and not padded[r, len(row):].any()
  full = np.zeros((3, 128), np.int32)
  full[:, :32] = padded
  np.testing.assert_array_equal(batching.trim_batch(full), padded)
  np.testing.assert_array_equal(batching.trim_batch(np.zeros((2, 64), np.int32)),
                                np.zeros((2, 16), np.int32))


@pytest.mark.parametrize('temperature', [0.0, 1.0])
@pytest.mark.parametrize('speculative', [False, True])
def test_bucketed_equals_padded_to_max(target_and_draft, temperature, speculative):
  target, draft = target_and_draft
  full = np.zeros((4, 64), np.int32)  # the feature length
  full[:, :24] = random_inputs(4, 24, 40, seed=3, min_len=10)
  bucketed = batching.trim_batch(full)
  assert bucketed.shape == (4, batching.bucket_length(int((full > 0).sum(1).max()), 64))
  assert bucketed.shape[1] < 64
  kw = dict(draft=draft if speculative else None, gamma=3, temperature=temperature,
            max_decode_length=12, rng=jax.random.PRNGKey(7))
  a, b = api.generate(target, full, **kw), api.generate(target, bucketed, **kw)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  assert (np.asarray(a.tokens)[:, 0] > 0).all()  # something was decoded
  for k in a.stats:  # beta_sum: a float sum over logits of other encoder lengths
    check = (lambda x, y, err_msg: np.testing.assert_allclose(x, y, rtol=1e-5, err_msg=err_msg)
             ) if k == 'beta_sum' else np.testing.assert_array_equal
    check(np.asarray(a.stats[k]), np.asarray(b.stats[k]), err_msg=k)


class _Vocab:
  def decode(self, ids):
    return ' '.join(map(str, ids))


class _RecordingModel:
  """Stands in for the model in infer_run.BatchRunner: records input shapes, decodes 5 7 EOS."""
  eos_id = 1

  def __init__(self):
    self.shapes = []

  def predict_batch_with_stats(self, params, batch, rng):
    del params, rng
    self.shapes.append(batch['encoder_input_tokens'].shape)
    b = batch['encoder_input_tokens'].shape[0]
    decodes = np.tile(np.array([[5, 7, 1, 0]], np.int32), (b, 1))
    aux = {k: np.full((b,), 3, np.int32) for k in infer_run.COUNTERS}
    return decodes, aux, {'accepted_length_histogram': np.array([1, 2], np.int32),
                          'accepted_by_source': np.array([2, 0, 0], np.int32)}


def test_runner_pads_to_buckets_and_times_only_compiled_shapes():
  model = _RecordingModel()
  runner = infer_run.BatchRunner(model, None, None, _Vocab(), input_len=128, max_len=4,
                              rng=jax.random.PRNGKey(0))
  rows = lambda *lengths: [{'inputs': np.arange(2, 2 + n, dtype=np.int32)} for n in lengths]
  first, second = {}, {}
  lines = runner.run(0, rows(5, 12), first)  # bucket 16: compiles
  runner.run(1, rows(9, 3), first)  # bucket 16 again: timed
  runner.run(2, rows(40, 3), second)  # bucket 64: compiles
  runner.run(3, rows(100), second)  # [1, 128]: a new shape, compiles
  runner.run(4, rows(33, 64), second)  # bucket 64 again: timed
  assert model.shapes == [(2, 16), (2, 16), (2, 64), (1, 128), (2, 64)]
  assert '"prediction": "5 7"' in lines[0]
  total = infer_run.sum_chunks([first, second])
  assert [b for b, _ in total['warm_batch_seconds']] == [1, 4]
  assert total['warm_tokens'] == 2 * 2 * 3 and total['generated_tokens'] == 5 * 2 * 3 - 3
  assert total['warm_seconds'] == pytest.approx(sum(s for _, s in total['warm_batch_seconds']))
