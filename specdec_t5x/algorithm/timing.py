"""Timing of decoder calls and speedup statistics (used by gamma="auto", the runner, the benchmarks).

Everything is timed inside one process after compilation, with `block_until_ready`;
scripts report medians and ratios of runs interleaved in the same loop.
"""

from __future__ import annotations

import collections
import functools
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, programs, sampling
from specdec_t5x.algorithm.cpu import packing


def block(x):
  return jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, 'block_until_ready')
                                else a, x)


def wall(fn: Callable[[], Any]) -> float:
  """Seconds for one call of fn, its outputs ready."""
  start = time.perf_counter()
  block(fn())
  return time.perf_counter() - start


_EXTEND_FNS: 'collections.OrderedDict[Any, Callable]' = collections.OrderedDict()
MIN_ROUNDS = 5  # per_call_seconds' fewest timed rounds, whatever `repeats` asks


def _repeated_extend(module, num_tokens: int, cache_len: int):
  """A jitted fn(variables, enc, num_calls) that encodes, builds the cache and runs
  `num_calls` cached calls of `num_tokens` tokens, chained as in a decode: each call's
  tokens are the argmax of the call before at every position.

  Chained, because identical calls are not a decode's: with fixed tokens XLA hoists the
  token's embedding and the first layer's input projections out of the timed loop, and
  may start one call before the last has finished (its inputs do not wait on the logits),
  so a loop of them measures a call cheaper than any decode can run it. The argmax (a
  vocabulary-sized reduction every greedy decode does too) also makes every logit live,
  so no part of the output layer is dead code.

  `num_calls` is traced, so ONE compiled program serves every count, 0 included (compile
  time per shape dominates on an accelerator). The result depends on the cache even for
  0 calls, so the encoder is never dead code and cancels out of `call_costs`' difference.
  Memoised per (module, num_tokens, cache_len) and the CPU kernels' trace-time switches
  (programs.program_key, programs.memoized_program).
  """
  key = programs.program_key(module, None, num_tokens, cache_len)  # and the kernel mode
  return programs.memoized_program(_EXTEND_FNS, key, lambda: jax.jit(_extend_loop(
      module, num_tokens, cache_len)))


def _extend_loop(module, num_tokens: int, cache_len: int):
  """_repeated_extend's function, before jit."""
  features = api.reads_features(module)  # a head: fed zeros for the target's outputs

  def run(variables, enc, num_calls):
    if features:
      encoded = jnp.zeros(enc.shape + (module.config.target_emb_dim,), jnp.float32)
    else:
      encoded = module.apply(variables, enc, method='encode')
    cache = module.apply(variables, encoded, enc, cache_len, method='init_cache')
    tokens = jnp.full((enc.shape[0], num_tokens), 3, jnp.int32)
    extra = ((jnp.zeros((enc.shape[0], num_tokens, module.config.feature_dim)),)
             if features else ())
    seen = sum((jnp.sum(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(cache)
                if jnp.issubdtype(x.dtype, jnp.floating)), jnp.float32(0.0))

    def body(i, carry):
      cache, tokens, acc = carry
      logits, cache = module.apply(variables, cache, tokens,
                                   jnp.full((enc.shape[0],), i, jnp.int32), *extra,
                                   method='extend')[:2]
      return cache, sampling.argmax(logits), acc + logits[:, -1, 0].astype(jnp.float32)
    acc0 = jnp.zeros((enc.shape[0],), jnp.float32) + seen
    return jax.lax.fori_loop(0, num_calls, body, (cache, tokens, acc0))[2]
  return run


def call_costs(specs: Dict[str, tuple], enc, num_calls: int = 32, repeats: int = 5,
               cache_len: int = 0) -> Dict[str, float]:
  """Seconds of ONE cached decoder call, for several (module, params, num_tokens).

  Each is measured by per_call_seconds: num_calls chained calls (each call's tokens the
  argmax of the last, as in a decode: _repeated_extend) against 0 calls of one compiled
  program, so the encoder and cache set-up cancel, the repeats interleaved across all
  `specs` so that their ratios (c, t_verify / t_target) stay comparable. `cache_len`: the
  cache's slots (0: just enough); give the decode's own (max_len + gamma + 1) to include
  attention over the whole cache. A cost lost in the noise is reported as 1e-9 s.
  """
  runs = {}
  for name, (module, params, num_tokens) in specs.items():
    fn = _repeated_extend(module, num_tokens, max(cache_len, num_calls + num_tokens + 1))
    variables = packing.decode_variables(module, params)  # as generate decodes
    runs[name] = functools.partial(fn, variables, enc)
  return {name: max(seconds, 1e-9)
          for name, seconds in per_call_seconds(runs, num_calls, repeats).items()}


def per_call_seconds(runs: Dict[str, Callable[[int], Any]], num_calls: int,
                     repeats: int) -> Dict[str, float]:
  """Seconds of ONE call for each name, where runs[name](n) does a fixed set-up and then n
  calls in one compiled program (n traced: both counts run the same program).

  The median over max(repeats, MIN_ROUNDS) rounds of (time of num_calls calls - time of 0
  calls) / num_calls, the rounds interleaved across all names so that a drift in machine
  speed moves every name alike and ratios between them stay comparable. A median, as
  every decode timing of the project, so that costs and the decodes they predict are
  estimated alike; at least MIN_ROUNDS rounds, because one round's difference can be
  negative when a call costs less than the machine's jitter. Compiles first. Not
  floored: a result <= 0 means the call was lost in the noise.
  """
  for run in runs.values():
    block(run(num_calls)), block(run(0))  # compile
  diffs: Dict[str, List[float]] = {name: [] for name in runs}
  for _ in range(max(repeats, MIN_ROUNDS)):
    for name, run in runs.items():
      diffs[name].append(wall(lambda: run(num_calls))  # pylint: disable=cell-var-from-loop
                         - wall(lambda: run(0)))  # pylint: disable=cell-var-from-loop
  return {name: statistics.median(d) / num_calls for name, d in diffs.items()}


def prefill_cost(module, params, enc, cache_len: int, repeats: int = 5) -> float:
  """Median seconds of encoding `enc` and building a `cache_len` cache (one jitted call):
  the per-sequence cost that every decode pays once, before its first decoder call.

  It is the 0-call run of call_costs' one-token program, so after `call_costs` at the same
  cache_len it compiles nothing new.
  """
  fn = _repeated_extend(module, 1, cache_len)
  variables = packing.decode_variables(module, params)
  block(fn(variables, enc, 0))  # compile
  return statistics.median(wall(lambda: fn(variables, enc, 0)) for _ in range(repeats))


def random_params(module, seed: int = 0, dtype: Any = jnp.bfloat16) -> Any:
  """Random parameters of a Transformer-like module, made on the device in `dtype`.

  For cost measurements, where values do not matter: the shapes come from the module's
  init traced abstractly (jax.eval_shape, nothing computed), and all leaves are drawn
  inside one jit directly in `dtype` (an 11B-parameter model is 22 GB in bfloat16; flax's
  init would first build it in float32). Leaves of one shape and kind are drawn in one
  call (few distinct shapes, so little to compile). Kernels have variance 1/fan_in,
  embeddings 1, anything else 0.01 (uniform draws), norm scales are 1, so activations
  and logits stay O(1). Not random_init.init_params (flax's init): committed results record
  decode lengths and acceptance from these values (loop_efficiency_t5_1_1_*, device_*).
  """
  dummy = jnp.ones((1, 4), jnp.int32)  # encoder and decoder input tokens
  shapes = jax.eval_shape(lambda k: module.init(k, dummy, dummy)['params'],
                          jax.random.PRNGKey(0))
  paths, treedef = jax.tree_util.tree_flatten_with_path(shapes)

  def std(path, shape) -> float:
    name = getattr(path[-1], 'key', str(path[-1]))
    if name == 'scale':
      return 0.0  # ones
    if name == 'kernel':
      return 1.0 / float(shape[0]) ** 0.5
    return 1.0 if name == 'embedding' else 0.1

  groups: Dict[Any, List[int]] = {}
  for i, (path, leaf) in enumerate(paths):
    groups.setdefault((tuple(leaf.shape), std(path, leaf.shape)), []).append(i)

  def make(key):
    leaves = [None] * len(paths)
    for k, ((shape, s), idx) in zip(jax.random.split(key, len(groups)), groups.items()):
      if s == 0.0:
        drawn = jnp.ones((len(idx),) + shape, dtype)
      else:  # uniform on [-s sqrt(3), s sqrt(3)]: standard deviation s
        bound = s * 3.0 ** 0.5
        drawn = jax.random.uniform(k, (len(idx),) + shape, dtype, -bound, bound)
      for j, i in enumerate(idx):
        leaves[i] = drawn[j]
    return jax.tree_util.tree_unflatten(treedef, leaves)
  # 'rbg' (XLA's RngBitGenerator): cheap to compile, unlike threefry's unrolled rounds.
  return jax.jit(make)(jax.random.key(seed, impl='rbg'))


def paired_speedup(baseline_seconds: Sequence[float], seconds: Sequence[float],
                   num_resamples: int = 2000, seed: int = 0) -> Dict[str, Any]:
  """The speedup of paired timings (the same batches, baseline vs. new) with its spread.

  Args:
    baseline_seconds: [n] seconds of each batch with the baseline.
    seconds: [n] seconds of the same batches with the method measured.
    num_resamples: bootstrap resamples of the batches for the pooled ratio's interval.
    seed: the bootstrap's seed (fixed: the same timings give the same interval).

  Returns:
    {'pooled': sum(baseline) / sum(seconds), 'pooled_ci95': [lo, hi] (percentile
    bootstrap over batches), 'per_batch_median', 'per_batch_q25', 'per_batch_q75' (of
    the ratios baseline_i / seconds_i), 'num_batches'}; the figures are None for n = 0.
  """
  base, new = np.asarray(baseline_seconds, np.float64), np.asarray(seconds, np.float64)
  if base.shape != new.shape or base.ndim != 1:
    raise ValueError(f'Paired timings must be two 1-D lists of one length, got shapes '
                     f'{base.shape} and {new.shape}.')
  if np.any(base <= 0) or np.any(new <= 0):
    raise ValueError('Timings must be > 0 seconds.')
  out: Dict[str, Any] = {'num_batches': int(base.size)}
  if not base.size:
    return dict(out, pooled=None, pooled_ci95=None, per_batch_median=None,
                per_batch_q25=None, per_batch_q75=None)
  ratios = base / new
  picks = np.random.RandomState(seed).randint(0, base.size, (num_resamples, base.size))
  resampled = base[picks].sum(1) / new[picks].sum(1)  # [num_resamples]
  q25, median, q75 = np.percentile(ratios, [25, 50, 75])
  return dict(out, pooled=float(base.sum() / new.sum()),
              pooled_ci95=[float(x) for x in np.percentile(resampled, [2.5, 97.5])],
              per_batch_median=float(median), per_batch_q25=float(q25),
              per_batch_q75=float(q75))


def format_speedup(stats: Optional[Dict[str, Any]]) -> str:
  """One line of `paired_speedup`'s figures, e.g. '1.23x (95% CI 1.18-1.29x; per-batch
  median 1.21x, IQR 1.10-1.35x, 99 batches)'."""
  if not stats or stats.get('pooled') is None:
    return 'n/a (no batch without compilation)'
  lo, hi = stats['pooled_ci95']
  return (f"{stats['pooled']:.2f}x (95% CI {lo:.2f}-{hi:.2f}x; per-batch median "
          f"{stats['per_batch_median']:.2f}x, IQR {stats['per_batch_q25']:.2f}-"
          f"{stats['per_batch_q75']:.2f}x, {stats['num_batches']} batches)")
