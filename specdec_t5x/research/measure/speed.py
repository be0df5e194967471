"""Autoregressive vs speculative decoding timed on the same inputs: row decoders, call
costs, gamma sweeps with the paper's and the end-to-end ideal, and batch throughput.

Everything is timed interleaved in one process after compilation (algorithm/timing.py);
the demo family and its data load through evaluation.py.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, batching, sampling, theory, timing
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import batched, evaluation, timed_rows
from specdec_t5x.research.results import harness

ModelAndParams = Tuple[Any, Any]


@dataclasses.dataclass
class Decoder:
  """A decode over a list of encoder rows, `batch` rows at a time (1: one at a time), each
  batch at its length bucket (batching.trim_batch), remembering the last run's stats
  (summed over the batches), its tokens per row, and `iterations`: the target calls of the
  loops (a batch's loop runs until its last row is done: its rows' most calls)."""
  target: ModelAndParams
  draft: Optional[ModelAndParams]
  enc: np.ndarray  # [N, L]
  max_len: int
  config: DecodeConfig = DecodeConfig(gamma=1)
  seed: int = 0
  eos_id: int = 1
  stats: Optional[stats_lib.DecodeStats] = None
  tokens: Optional[List[np.ndarray]] = None
  batch: int = 1
  iterations: Optional[int] = None

  def __post_init__(self):
    if len(self.enc) % self.batch:
      raise ValueError(f'{len(self.enc)} encoder rows do not split into batches of '
                       f'{self.batch}; pass a multiple of the batch.')
    # Each batch at its length bucket, cut once rather than inside the timed loop.
    self._batches = batched.split(self.enc, self.batch, fill=None)

  def __call__(self):
    outs = [out for _, out in batched.decode(
        self.target, self._batches, self.max_len, draft=self.draft, config=self.config,
        seed=self.seed, eos_id=self.eos_id, key_by='index')]
    timing.block(outs)
    self.stats = jax.tree_util.tree_map(lambda *xs: np.sum([np.asarray(x) for x in xs], axis=0),
                                        *[o.stats for o in outs])
    self.tokens = [row for o in outs for row in batched.outputs(o, self.batch)]
    self.iterations = sum(int(np.max(o.stats['target_calls'])) for o in outs)
    return outs


def costs(target: ModelAndParams, drafts_: Dict[str, ModelAndParams], enc: np.ndarray,
          gammas: Sequence[int], num_calls: int = 32, repeats: int = 7,
          max_len: int = 0, batch: int = 1) -> Dict[str, float]:
  """Seconds per call (timing.call_cost): t_target_step, t_draft_step_{name},
  t_verify_{g+1}; and per sequence (prefill_cost): t_prefill_target, t_prefill_draft_{name};
  each call over the first `batch` rows of `enc` (a batch's call, prefill per batch).

  With `max_len`, caches have the decode's own size (max_len + max gamma + 1). The call
  costs' repeats are interleaved (timing.call_costs).
  """
  enc = jnp.asarray(batching.trim_batch(enc[:batch]))
  cache_len = max_len + max(gammas) + 1 if max_len else 0
  specs = {'t_target_step': (*target, 1)}
  specs.update({f't_draft_step_{name}': (*draft, 1) for name, draft in drafts_.items()})
  specs.update({f't_verify_{g + 1}': (*target, g + 1) for g in gammas})
  out = timing.call_costs(specs, enc, num_calls, repeats, cache_len)
  out['t_prefill_target'] = timing.prefill_cost(*target, enc, max(cache_len, 2), repeats)
  for name, draft in drafts_.items():
    out[f't_prefill_draft_{name}'] = timing.prefill_cost(*draft, enc, max(cache_len, 2),
                                                               repeats)
  return out


def ideal_end_to_end(num_sequences: int, ar_calls: float, spec_calls: float, gamma: int,
                     cost: Dict[str, float], draft: str, refeed: bool = False) -> float:
  """AR time / speculative time predicted from call costs alone, per-sequence prefill
  (encoder + cache) included (theory.end_to_end_speedup at a step of g t_d + t_v).

  The paper's ideal (theory.ideal_speedup) leaves out the prefill, which both methods pay
  once per sequence; at batch 1 on a CPU it is a sizeable share of short decodes.
  `refeed`: the draft calls as the loop makes them, the first of each step the 2-token
  catch-up (cost['t_draft_refeed_{draft}']; the last draft of a fully accepted block was
  never fed) instead of g one-token calls.
  """
  pre_t, pre_d = cost['t_prefill_target'], cost[f't_prefill_draft_{draft}']
  t_t, t_d, t_v = cost['t_target_step'], cost[f't_draft_step_{draft}'], cost[f't_verify_{gamma + 1}']
  drafting = gamma * t_d
  if refeed:
    drafting = cost[f't_draft_refeed_{draft}'] + (gamma - 1) * t_d
  return theory.end_to_end_speedup(num_sequences, ar_calls, spec_calls, t_t, drafting + t_v,
                                   pre_t, pre_d)


def _rows(ar: Decoder, decs: Dict[int, Decoder], timed: Dict[str, timed_rows.Timed], name: str,
          cost: Dict[str, float], alpha: Optional[float]) -> List[Dict[str, Any]]:
  t_t, t_d = cost['t_target_step'], cost[f't_draft_step_{name}']
  rows = []
  for g, dec in decs.items():
    s, spec = dec.stats, timed[f'{name}_g{g}']
    tpc = float(s['generated_tokens'].sum()) / float(s['target_calls'].sum())
    t_v = cost[f't_verify_{g + 1}']
    fit = theory.alpha_from_tokens_per_call(tpc, g)
    ideal = float(theory.ideal_speedup(min(max(tpc, 1.0), g + 1), g, t_d, t_t, t_v))
    # Per generated token: when sampling, speculative and AR outputs differ in length.
    ar_tokens, spec_tokens = float(ar.stats['generated_tokens'].sum()), float(
        s['generated_tokens'].sum())
    measured = (timed['ar'].seconds / ar_tokens) / (spec.seconds / spec_tokens)
    e2e = None
    if 't_prefill_target' in cost:
      e2e = ideal_end_to_end(len(dec.enc), float(ar.stats['target_calls'].sum()),
                             float(s['target_calls'].sum()), g, cost, name) * (
                                 spec_tokens / ar_tokens)
    rows.append({
        'gamma': g, 'alpha_empirical': float(s['accepted_tokens'].sum() /
                                             max(1, s['drafted_tokens'].sum())),
        'alpha_iid_fit': fit,
        'alpha_per_position': evaluation.alpha_per_position(s['accepted_length_histogram']),
        'accepted_length_histogram': s['accepted_length_histogram'].tolist(),
        'tokens_per_target_call': tpc, 'generated_tokens': float(s['generated_tokens'].sum()),
        'speedup_measured': measured, 'speedup_ideal': ideal, 'efficiency': measured / ideal,
        'speedup_ideal_end_to_end': e2e,
        'efficiency_end_to_end': None if e2e is None else measured / e2e,
        'speedup_theory': float(theory.walltime_improvement_measured(
            fit if alpha is None else alpha, g, t_d, t_t, t_v)),
        'time_ratio': spec.speedup_vs_ar,
        'same_tokens_as_ar': int(sum(np.array_equal(a, b) for a, b in
                                     zip(ar.tokens, dec.tokens))),
        'spec_seconds_median': spec.seconds})
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
  ar = Decoder(target, None, enc, max_len, DecodeConfig.from_sampling(cfg, gamma=1), seed, eos_id)
  decs = {name: {g: Decoder(target, d, enc, max_len, DecodeConfig.from_sampling(cfg, gamma=g),
                            seed, eos_id) for g in gammas}
          for name, d in drafts_.items()}
  fns: Dict[str, Any] = {'ar': ar}
  fns.update({f'{name}_g{g}': dec for name, by_g in decs.items() for g, dec in by_g.items()})
  timings = harness.interleaved(fns, repeats)
  timed = {t.name: t for t in timed_rows.timed(timings, 'ar')}
  out = {'ar_seconds_median': timed['ar'].seconds,
         'ar_tokens': float(ar.stats['generated_tokens'].sum()), 'raw_times_s': timings.seconds,
         'drafts': {}}
  for name in drafts_:
    alpha = (alphas or {}).get(name)
    rows = _rows(ar, decs[name], timed, name, cost, alpha)
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
    for k, v in out.stats.items():  # per-row counters are summed; the histogram is [g+1]
      v = np.asarray(v)
      total[k] = total.get(k, 0) + (v if k == 'accepted_length_histogram' else v.sum(0))
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
    cost = costs(target, drafts_, enc, gammas, cost_calls, cost_repeats, max_len=max_len)
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
    fns = {m: decode(enc[:b], g) for m, g in methods.items()}
    med = {m: statistics.median(t) for m, t in timing.median_times(fns, repeats).items()}
    for m, g in methods.items():
      out = fns[m]()
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
