"""The measurements behind results/speedup_ceiling (scripts/speedup_ceiling.py): the demo's
real loops on the timing grid, single calls, and research/predict/ceiling.py on both.

1. The real loops (grid.time_grid, one input at a time, greedy): per draft and gamma the
   measured speedup, tokens per target call, the i.i.d. acceptance that gives them, and
   the seconds of one loop iteration (decode time less the prefills, per target call).
2. Single calls at the median-length input's bucket (grid.costs): verify calls of
   k = 2..max_gamma + 1 positions, each draft's one-token call and the first call of its
   steps (the head: gamma + 1 positions of the target's features; the small T5: the
   2-token catch-up).
3. ceiling.py from those step costs: the acceptance 1.0x, 1.3x and 1.5x need, end to end
   and decode only, and the best gamma's speedup at each acceptance.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

from specdec_t5x.algorithm import batching, theory
from specdec_t5x.research.measure import grid, loop_ladder
from specdec_t5x.research.predict import ceiling

HEAD, DRAFT, TARGET = 'demo_feature_head_kd', 'demo_draft_m', 'demo_target'
SPEEDUPS = (1.0, 1.3, 1.5)
ALPHAS = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)


def call_costs(target, drafts, row, max_gamma, max_len):
  """(grid.costs' raw seconds with each draft's first call of a step, ceiling.Costs per
  draft's calls alone and for a free draft) from single calls at `row`."""
  gammas = list(range(1, max_gamma + 1))
  firsts = {f'first_{HEAD}_{g}': (*drafts[HEAD], g + 1) for g in gammas}
  firsts[f'first_{DRAFT}'] = (*drafts[DRAFT], 2)
  raw = grid.costs(target, drafts, row, gammas, max_len=max_len, extra=firsts)
  verify = {g + 1: raw[f't_verify_{g + 1}'] for g in gammas}
  out = {'free draft': ceiling.Costs.from_calls(raw['t_target_step'], verify,
                                                prefill_target=raw['t_prefill_target'])}
  for name in drafts:
    first = {g: raw[f'first_{HEAD}_{g}'] if name == HEAD else raw[f'first_{DRAFT}']
             for g in gammas}
    out[f'{name} (calls alone)'] = ceiling.Costs.from_calls(
        raw['t_target_step'], verify, raw[f't_draft_step_{name}'], first,
        raw['t_prefill_target'], raw[f't_prefill_draft_{name}'])
  return raw, out


def measure(target, drafts: Dict[str, Any], inputs: Sequence[Any], gammas: Sequence[int],
            max_gamma: int, max_len: int, repeats: int) -> Dict[str, Any]:
  """The fields of results/speedup_ceiling.json beyond the command and flags, for the
  encoder inputs `inputs` (token lists) and drafts named HEAD and DRAFT."""
  enc = batching.pad_batch(list(inputs))
  timed = grid.time_grid(target, drafts, enc, max_len, gammas, repeats=repeats)
  ar, med, n = timed.ar, timed.median, len(inputs)
  length = ar.generated_tokens / n
  rows = [batching.trim_batch(enc[i:i + 1]) for i in range(n)]
  cache_len = max_len + max(gammas) + 1
  pre_t = grid.prefill_per_sequence(target, rows, cache_len)
  pre = {name: grid.prefill_per_sequence(d, rows, cache_len) for name, d in drafts.items()}
  t_ar = loop_ladder.loop_seconds(med['ar'], n * pre_t, ar.iterations)
  loops, costs = [], {}
  for name in drafts:
    steps = {}
    for g in gammas:
      dec = timed.decoders[(name, g)]
      steps[g] = loop_ladder.loop_seconds(med[grid.key(name, g)], n * (pre_t + pre[name]),
                                          dec.iterations)
      tokens = float(dec.stats['generated_tokens'].sum() / dec.stats['target_calls'].sum())
      loops.append({'draft': name, 'gamma': g, 'tokens_per_target_call': tokens,
                    'alpha': float(dec.stats['accepted_tokens'].sum()
                                   / max(1, dec.stats['drafted_tokens'].sum())),
                    'alpha_iid': float(theory.alpha_from_tokens_per_call(tokens, g)),
                    'speedup_measured': med['ar'] / med[grid.key(name, g)],
                    'iteration_s': steps[g]})
    costs[f'{name} (real loop)'] = ceiling.Costs(t_ar, steps, pre_t, pre[name])
  median = sorted(range(n), key=lambda i: len(inputs[i]))[n // 2]
  raw, alone = call_costs(target, drafts, batching.pad_batch([inputs[median]]), max_gamma,
                          max_len)
  costs.update(alone)
  for r in loops:
    r['calls_alone_s'] = alone[f'{r["draft"]} (calls alone)'].t_step[r['gamma']]
  needed = {name: {f'{s:g}x': {kind: ceiling.alpha_needed(c, s, length if kind == 'end_to_end'
                                                           else 0.0)
                               for kind in ('end_to_end', 'decode_only')}
                   for s in SPEEDUPS} for name, c in costs.items()}
  best = {name: [[a, *ceiling.best(c, a, length)] for a in ALPHAS] for name, c in costs.items()}
  return dict(mean_output_tokens=length, ar_step_s=t_ar, prefill_target_s=pre_t,
              prefill_draft_s=pre, cost_input_tokens=len(inputs[median]), loops=loops,
              call_costs_s=raw, alpha_needed=needed, best_gamma=best,
              step_costs_s={k: {'t_target': c.t_target, 't_step': c.t_step,
                                'prefill_target': c.prefill_target,
                                'prefill_draft': c.prefill_draft}
                            for k, c in costs.items()})
