"""Autoregressive vs speculative decoding timed on the same inputs: gamma sweeps with the
paper's and the end-to-end ideal, and batch throughput.

The row decoders, the timing grid and the call costs are grid.py's; the demo family and
its data load through evaluation.py.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from specdec_t5x.algorithm import api, batching, sampling, theory
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import batched, evaluation, grid
from specdec_t5x.research.results import harness

ModelAndParams = Tuple[Any, Any]


def _rows(grid_: grid.Grid, name: str, cost: Dict[str, float],
          alpha: Optional[float]) -> List[Dict[str, Any]]:
  t_t, t_d = cost['t_target_step'], cost[f't_draft_step_{name}']
  ar, rows = grid_.ar, []
  for timed in (r for r in grid_.rows() if r['draft'] == name):
    g, seconds, tpc = timed['gamma'], timed['seconds'], timed['tokens_per_target_call']
    dec = grid_.decoders[(name, g)]
    s = dec.stats
    t_v = cost[f't_verify_{g + 1}']
    fit = theory.alpha_from_tokens_per_call(tpc, g)
    ideal = float(theory.ideal_speedup(min(max(tpc, 1.0), g + 1), g, t_d, t_t, t_v))
    # Per generated token: when sampling, speculative and AR outputs differ in length.
    ar_tokens, spec_tokens = ar.generated_tokens, dec.generated_tokens
    measured = timed['speedup']
    e2e = None
    if 't_prefill_target' in cost:
      e2e = grid.ideal_end_to_end(len(dec.enc), float(ar.stats['target_calls'].sum()),
                             float(s['target_calls'].sum()), g, cost, name) * (
                                 spec_tokens / ar_tokens)
    rows.append({
        'gamma': g, **stats_lib.rates(s),
        'alpha_iid_fit': fit,
        'alpha_per_position': evaluation.alpha_per_position(s['accepted_length_histogram']),
        'accepted_length_histogram': s['accepted_length_histogram'].tolist(),
        'tokens_per_target_call': tpc, 'generated_tokens': float(s['generated_tokens'].sum()),
        'speedup_measured': measured, 'speedup_ideal': ideal, 'efficiency': measured / ideal,
        'speedup_ideal_end_to_end': e2e,
        'efficiency_end_to_end': None if e2e is None else measured / e2e,
        'speedup_theory': float(theory.walltime_improvement_measured(
            fit if alpha is None else alpha, g, t_d, t_t, t_v)),
        'time_ratio': grid_.median['ar'] / seconds,
        'same_tokens_as_ar': int(sum(np.array_equal(a, b) for a, b in
                                     zip(ar.tokens, dec.tokens))),
        'spec_seconds_median': seconds})
  return rows


def _choice(rows: List[Dict[str, Any]], cost: Dict[str, float], name: str,
            alpha: Optional[float]) -> Dict[str, Any]:
  """theory.best_gamma_measured at `alpha` (None: the median i.i.d. fit to tokens per call)
  vs the best measured gamma."""
  gammas = [r['gamma'] for r in rows]
  t_t, t_d = cost['t_target_step'], cost[f't_draft_step_{name}']
  tv = np.array([cost[f't_verify_{g + 1}'] for g in gammas])
  verify = lambda g: float(np.interp(g, gammas, tv))  # linear between measured gammas
  if alpha is None:
    alpha = float(np.median([r['alpha_iid_fit'] for r in rows]))
  chosen = int(theory.best_gamma_measured(alpha, t_d, t_t, verify, max_gamma=max(gammas)))
  best = max(rows, key=lambda r: r['speedup_measured'])
  nearest = min(rows, key=lambda r: (abs(r['gamma'] - chosen), r['gamma']))
  return {'alpha_for_choice': alpha, 'chosen_gamma': chosen, 'best_measured_gamma': best['gamma'],
          'chosen_measured_gamma': nearest['gamma'],
          'chosen_measured_speedup': nearest['speedup_measured'],
          'best_measured_speedup': best['speedup_measured'],
          'chosen_within_10pct_of_best':
              bool(nearest['speedup_measured'] >= 0.9 * best['speedup_measured']),
          'c': t_d / t_t,
          'theory_curve': {g: float(theory.walltime_improvement_measured(
              alpha, g, t_d, t_t, verify(g))) for g in range(1, max(gammas) + 1)}}


def sweep(target: ModelAndParams, drafts_: Dict[str, ModelAndParams], enc: np.ndarray,
          max_len: int, gammas: Sequence[int], cfg: sampling.SamplingConfig,
          cost: Dict[str, float], repeats: int = 3, seed: int = 0, eos_id: int = 1,
          alphas: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
  """Times AR and speculative decoding with every draft and gamma, interleaved in one loop.

  `cost` holds the call costs (see `costs`). Returns, per draft, per-gamma rows: measured
  speedup (median AR seconds per generated token / median speculative seconds per generated
  token: equal to the time ratio when greedy; when sampling the outputs differ), alpha (accepted/drafted and the i.i.d. fit to
  tokens per call), alpha per draft position, the ideal speedup from measured tokens per
  call and call costs, efficiency = measured / ideal, theory's prediction; and the gamma
  theory.best_gamma_measured chooses from alpha and the call costs. `alphas[name]` (e.g.
  the teacher-forced E[sum min(p, q)]) is used for theory when given, else the fit.
  """
  grid_ = grid.time_grid(target, drafts_, enc, max_len, gammas, DecodeConfig.from_sampling(cfg),
                         repeats, seed=seed, eos_id=eos_id)
  out = {'ar_seconds_median': grid_.median['ar'], 'ar_tokens': grid_.ar.generated_tokens,
         'raw_times_s': grid_.timings.seconds, 'drafts': {}}
  for name in drafts_:
    alpha = (alphas or {}).get(name)
    rows = _rows(grid_, name, cost, alpha)
    out['drafts'][name] = {'rows': rows, 'alpha_source': 'fit' if alpha is None else 'given',
                           **_choice(rows, cost, name, alpha)}
  return out


def speculative_stats(target: ModelAndParams, draft: ModelAndParams, enc: np.ndarray,
                      cfg: sampling.SamplingConfig, gamma: int, max_len: int, seed: int = 0,
                      eos_id: int = 1, batch: int = 16) -> Dict[str, np.ndarray]:
  """Summed generate() statistics of speculative decoding over the rows of enc [N, L]."""
  total: Dict[str, np.ndarray] = {}
  for _, out in batched.decode(target, batched.split(enc, batch, fill=None), max_len,
                               draft=draft, config=DecodeConfig.from_sampling(cfg, gamma=gamma),
                               seed=seed, eos_id=eos_id):
    for k, v in out.stats.items():  # per-row counters and flags are summed over rows; the
      v = np.asarray(v)  # counts over a batch's rows (histograms, outcomes) batch by batch
      per_row = k in stats_lib.PER_EXAMPLE_STATS or v.dtype == bool
      total[k] = total.get(k, 0) + (v.sum(0) if per_row else v)
  return total


def demo_speedups(target_name: str, draft_names: Sequence[str], tasks: Sequence[str],
                  temperatures: Sequence[float], gammas: Sequence[int], num_examples: int,
                  max_len: int, repeats: int = 3, cost_calls: int = 32, cost_repeats: int = 7,
                  seed: int = 0, alpha_cells: Sequence[Dict[str, Any]] = (),
                  progress: Optional[Any] = None) -> List[Dict[str, Any]]:
  """The demo family's Table 2: per task, call costs (`costs`) and, per temperature, the
  `sweep` of every draft and gamma over the task's first `num_examples` test inputs.

  `alpha_cells`: measure_alpha's cells (task, draft, temperature, alpha); their alpha
  drives theory (else the fit). `progress.update(1)` is called after each costs / sweep.
  Returns one group per (task, temperature): {'task', 'temperature', 'costs_s', **sweep}.
  """
  target = evaluation.load_model(target_name)
  examples = {t: evaluation.load_examples(t, num_examples) for t in tasks}
  groups = []
  for task in tasks:
    enc = batching.pad_batch([e.inputs for e in examples[task]])  # rows run at their buckets
    drafts_ = {name: evaluation.load_model(name, task) for name in draft_names}
    cost = grid.costs(target, drafts_, enc, gammas, cost_calls, cost_repeats, max_len=max_len)
    if progress is not None:
      progress.update(1)
    for temp in temperatures:
      alphas = {c['draft']: c['alpha'] for c in alpha_cells
                if c['task'] == task and c['temperature'] == temp}
      jax.clear_caches()  # the last group's programs: the JIT's memory mappings are bounded
      res = sweep(target, drafts_, enc, max_len, gammas, sampling.SamplingConfig(temp), cost,
                  repeats, seed, alphas=alphas)
      groups.append({'task': task, 'temperature': temp, 'costs_s': cost, **res})
      if progress is not None:
        progress.update(1)
  return groups


def batch_throughput(target: ModelAndParams, draft: ModelAndParams, enc: np.ndarray,
                     batches: Sequence[int], gammas: Sequence[int], max_len: int,
                     repeats: int = 2, check_rows: int = 16, eos_id: int = 1,
                     report: Optional[Any] = None) -> List[Dict[str, Any]]:
  """Greedy tokens/s of AR and speculative decoding (each gamma) on enc[:b] in one call,
  for each batch size b; per batch the methods are timed interleaved after compilation.

  Each row: batch, method ('ar' / 'spec_g{gamma}'), gamma, median seconds, tokens/s
  (generated tokens / seconds), speedup_vs_ar at the same batch, stats_lib.summarize, and
  whether the first `check_rows` rows equal their batch-1 decodes. `report(row)` is
  called as each row is ready.
  """
  if max(batches) > len(enc):
    raise ValueError(f'batch {max(batches)} needs {max(batches)} encoder rows, got {len(enc)}.')
  methods = {'ar': None, **{f'spec_g{g}': g for g in gammas}}

  def decode(rows, g):  # each batch at its length bucket
    kw = {} if g is None else {'draft': draft, 'gamma': g}
    rows = batching.trim_batch(rows)
    return lambda: api.generate(target, rows, max_decode_length=max_len, eos_id=eos_id, **kw)
  checked = min(max(batches), check_rows)
  single = {m: [np.asarray(decode(enc[r:r + 1], g)().tokens[0]) for r in range(checked)]
            for m, g in methods.items()}
  rows = []
  for b in batches:
    timings = harness.interleaved({m: decode(enc[:b], g) for m, g in methods.items()},
                                  repeats)
    med = timings.median
    for m, g in methods.items():
      out = timings.outputs[m]
      st = stats_lib.summarize(out.stats)
      tokens, n = np.asarray(out.tokens), min(b, checked)
      row = dict(batch=b, method=m, gamma=g, seconds=med[m],
                 tokens_per_s=st['generated_tokens'] / med[m],
                 rows_equal_batch1=all(np.array_equal(tokens[r], single[m][r]) for r in range(n)),
                 rows_checked=n, **st)
      rows.append(row)
    ar = next(r for r in rows if r['batch'] == b and r['method'] == 'ar')
    for r in rows:
      if r['batch'] == b:
        r['speedup_vs_ar'] = r['tokens_per_s'] / ar['tokens_per_s']
        if report is not None:
          report(r)
  return rows
