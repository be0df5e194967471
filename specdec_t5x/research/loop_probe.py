"""Where a decode loop's time goes: host clock stamps around every model call inside the
compiled loop, and the per-iteration phases they delimit.

`probed_decode` runs api.decode_program with each ExtendFn wrapped between two ordered
`io_callback`s: one before the call (its tokens wait for it) and one after (its logits
wait for it), each stamping time.perf_counter() on the host. From the stamps of one
decode (batch 1), per loop iteration:

  draft_calls     the draft's calls, start to end, summed
  draft_sampling  between consecutive draft calls and from the last one to the verify
                  call (sampling x_i from q_i)
  verify          the target's call over gamma + 1 positions
  accept          from the verify call's end to the next iteration's first call
                  (rejection sampling, statistics, the sequence buffer, the loop's test)

Autoregressive decoding has only `verify` (its one-token step) and `accept`. The stamps
cost time themselves (`callback_overhead` measures a pair, ~0.09 ms on 2 CPU cores) and
perturb what they bracket: on the demo family the probed calls read 1.3-2.4x their
isolated cost while the unprobed loop runs at 0.83-0.92 of its ideal, so read the phases
as shares of a slowed loop, not as timers of record (XLA's profiler sees inside without
host round trips). The tokens are those of the unprobed decode.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List, Optional, Tuple

import jax
from jax.experimental import io_callback
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api
from specdec_t5x.algorithm.config import DecodeConfig

PHASES = ('draft_calls', 'draft_sampling', 'verify', 'accept')


class Stamps:
  """Host-side (label, seconds) records, appended by the compiled program's callbacks."""

  def __init__(self):
    self.records: List[Tuple[str, float]] = []

  def stamp(self, label: str):
    def record(_):
      self.records.append((label, time.perf_counter()))
      return np.int32(1)
    return record

  def wrap(self, name: str, fn):
    """An ExtendFn that stamps `{name}_start` before and `{name}_end` after `fn`."""
    def probed(cache, tokens, positions):
      go = io_callback(self.stamp(f'{name}_start'), jax.ShapeDtypeStruct((), jnp.int32),
                       tokens[0, 0], ordered=True)
      tokens = jnp.where(go > 0, tokens, 0)  # the call waits for the stamp
      logits, cache = fn(cache, tokens, positions)
      done = io_callback(self.stamp(f'{name}_end'), jax.ShapeDtypeStruct((), jnp.int32),
                         logits[0, 0, 0], ordered=True)
      return jnp.where(done > 0, logits, 0.0), cache  # what follows waits for it
    return probed


def phases(records: List[Tuple[str, float]]) -> Dict[str, Any]:
  """Stamps of one batch-1 decode -> seconds per phase summed over its loop iterations
  (see the module doc), the iteration count and the loop's span (first to last stamp)."""
  totals = {p: 0.0 for p in PHASES}
  iterations, accept_gaps, last_label, last_time = 0, 0, None, None
  for label, t in records:
    if last_label is not None:
      gap = t - last_time
      if last_label.endswith('_start'):
        totals['draft_calls' if last_label.startswith('draft') else 'verify'] += gap
      elif last_label == 'draft_end':
        totals['draft_sampling'] += gap
      else:  # target_end -> the next iteration
        totals['accept'] += gap
        accept_gaps += 1
    if label == 'target_end':
      iterations += 1
    last_label, last_time = label, t
  span = records[-1][1] - records[0][1] if records else 0.0
  return dict(totals, iterations=iterations, accept_gaps=accept_gaps, span=span)


def probed_decode(target, draft, enc: np.ndarray, *, max_len: int, config: DecodeConfig,
                  rng: Optional[jax.Array] = None, eos_id: int = 1):
  """-> (run, stamps): `run()` decodes the batch-1 `enc` [1, L] as generate does, with the
  model calls stamped into `stamps.records` (cleared at each run); returns its tokens."""
  if draft is None:
    config = DecodeConfig.from_sampling(config.sampling, gamma=1)
  stamps = Stamps()
  program = jax.jit(api.decode_program(target[0], draft and draft[0], max_len=max_len,
                                       config=config, wrap=stamps.wrap))
  target_vars = api.decode_variables(*target)
  draft_vars = None if draft is None else api.decode_variables(*draft)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  enc = jnp.asarray(enc, jnp.int32)

  def run():
    stamps.records.clear()
    tokens, _ = program(target_vars, draft_vars, enc, rng, jnp.int32(eos_id))
    return np.asarray(tokens)

  return run, stamps


def callback_overhead(repeats: int = 200) -> float:
  """Seconds that one stamped pair of ordered callbacks adds to a compiled loop."""
  stamps = Stamps()

  def body(i, x):
    go = io_callback(stamps.stamp('a'), jax.ShapeDtypeStruct((), jnp.int32), x, ordered=True)
    x = jnp.where(go > 0, x + 1, x)
    done = io_callback(stamps.stamp('b'), jax.ShapeDtypeStruct((), jnp.int32), x, ordered=True)
    return jnp.where(done > 0, x, 0)

  with_stamps = jax.jit(lambda n: jax.lax.fori_loop(0, n, body, jnp.int32(0)))
  plain = jax.jit(lambda n: jax.lax.fori_loop(0, n, lambda i, x: x + 1, jnp.int32(0)))
  times = []
  for fn in (with_stamps, plain):
    fn(2).block_until_ready()
    start = time.perf_counter()
    fn(repeats).block_until_ready()
    times.append(time.perf_counter() - start)
  return max(times[0] - times[1], 0.0) / repeats


def attribute(runs: List[Any], repeats: int = 3) -> Dict[str, float]:
  """Median over `repeats` of each phase, summed over `runs` (their (run, stamps) pairs,
  one per input row), per loop iteration, in seconds; plus `iterations` (total). The last
  iteration of a decode has no next call to end its `accept`: that phase is the mean of
  the gaps it has. `span` is first to last stamp, per iteration."""
  per_repeat: Dict[str, List[float]] = {p: [] for p in PHASES + ('span',)}
  iterations = 0
  for _ in range(repeats):
    sums = {p: 0.0 for p in PHASES + ('span', 'accept_gaps')}
    iterations = 0
    for run, stamps in runs:
      run()
      got = phases(stamps.records)
      iterations += got['iterations']
      for p in sums:
        sums[p] += got[p]
    for p in PHASES + ('span',):
      per = sums['accept_gaps'] if p == 'accept' else iterations
      per_repeat[p].append(sums[p] / max(per, 1))
  return dict({p: statistics.median(v) for p, v in per_repeat.items()}, iterations=iterations)
