"""timing.paired_speedup and timing.per_call_seconds on synthetic timings whose answer is
known."""

import functools

import numpy as np
import pytest

from specdec_t5x.algorithm import timing


def test_constant_ratio_has_no_spread():
  spec = np.random.RandomState(0).uniform(0.02, 0.08, 50)
  s = timing.paired_speedup(2 * spec, spec)
  assert s['num_batches'] == 50
  for k in ('pooled', 'per_batch_median', 'per_batch_q25', 'per_batch_q75'):
    assert s[k] == pytest.approx(2.0)
  assert s['pooled_ci95'] == pytest.approx([2.0, 2.0])


def test_known_quartiles_pooled_and_interval():
  s = timing.paired_speedup([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0])
  assert s['pooled'] == pytest.approx(2.5)  # 10 s / 4 s
  assert s['per_batch_median'] == pytest.approx(2.5)
  assert (s['per_batch_q25'], s['per_batch_q75']) == pytest.approx((1.75, 3.25))
  lo, hi = s['pooled_ci95']
  assert 1.0 <= lo < 2.5 < hi <= 4.0
  assert timing.paired_speedup([1.0, 2.0, 3.0, 4.0], [1.0] * 4) == s  # fixed seed


def test_interval_covers_the_true_speedup_and_narrows_with_more_batches():
  """Noisy batches around a true 1.5x: the 95% interval holds 1.5 and shrinks ~1/sqrt(n)."""
  rs = np.random.RandomState(1)
  widths = []
  for n in (25, 400):
    spec = rs.uniform(0.03, 0.07, n) * rs.lognormal(0.0, 0.2, n)
    base = 1.5 * spec * rs.lognormal(0.0, 0.2, n) / np.exp(0.02)  # E[lognormal] = e^0.02
    s = timing.paired_speedup(base, spec)
    lo, hi = s['pooled_ci95']
    assert lo < 1.5 < hi and lo < s['pooled'] < hi
    widths.append(hi - lo)
  assert widths[1] < 0.5 * widths[0]


def test_one_stalled_batch_moves_the_pooled_ratio_not_the_median():
  spec, base = np.full(99, 0.05), np.full(99, 0.06)  # 1.2x everywhere
  spec[0] = 5.0  # the machine stalled during one speculative batch
  s = timing.paired_speedup(base, spec)
  assert s['per_batch_median'] == pytest.approx(1.2)
  assert s['pooled'] == pytest.approx(99 * 0.06 / (98 * 0.05 + 5.0)) and s['pooled'] < 0.7


def test_format_and_empty():
  s = timing.paired_speedup([0.2, 0.3, 0.4], [0.1, 0.2, 0.2])
  line = timing.format_speedup(s)
  assert line.startswith(f"{s['pooled']:.2f}x (95% CI ")
  assert f"per-batch median {s['per_batch_median']:.2f}x, IQR " in line
  assert line.endswith(', 3 batches)')
  empty = timing.paired_speedup([], [])
  assert empty['num_batches'] == 0 and empty['pooled'] is None
  assert timing.format_speedup(empty).startswith('n/a')


@pytest.mark.parametrize('base, spec, pattern', [
    ([1.0, 2.0], [1.0], 'one length'), ([1.0, 0.0], [1.0, 1.0], '> 0')])
def test_bad_timings_raise(base, spec, pattern):
  with pytest.raises(ValueError, match=pattern):
    timing.paired_speedup(base, spec)


def test_per_call_seconds_is_the_median_difference_over_at_least_min_rounds(monkeypatch):
  """A call cheaper than the machine's jitter: one round with a disturbed 0-call run has
  a negative difference, and asking for one round still times MIN_ROUNDS, whose median
  difference is the call's cost."""
  assert timing.MIN_ROUNDS == 5
  walls = {('a', 8): iter([1.9, 1.8, 1.85, 1.8, 1.8]), ('a', 0): iter([2.5, 1.0, 1.05, 1.0, 1.0]),
           ('b', 8): iter([5.0, 4.2, 4.0, 4.0, 4.1]), ('b', 0): iter([1.0, 1.2, 1.0, 1.0, 1.0])}
  order = []

  def run(name, n):
    order.append((name, n))
    return name, n
  monkeypatch.setattr(timing, 'wall', lambda fn: next(walls[fn()]))
  runs = {name: functools.partial(run, name) for name in ('a', 'b')}
  got = timing.per_call_seconds(runs, num_calls=8, repeats=1)
  assert got == pytest.approx({'a': 0.8 / 8, 'b': 3.0 / 8})
  timed = order[4:]  # after one compile run of each count
  assert timed[:4] == [('a', 8), ('a', 0), ('b', 8), ('b', 0)]  # interleaved
  assert len(timed) == 4 * timing.MIN_ROUNDS
