r"""What acceptance the demo command would need for a given speedup on this machine.

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=speedup_ceiling \
      [--num_examples 100] [--gammas 1,2,3,4] [--max_gamma 7] [--repeats 3]

Run from the repository root on an idle machine. One process, three parts:
1. The real loops of the first --num_examples EN->DE test inputs (the inputs of
   configs/demo.gin), one at a time, greedy, autoregressively and with each draft at each
   --gammas, timed interleaved on the timing grid (grid.time_grid): per draft and gamma the
   measured speedup, tokens per target call, the i.i.d. acceptance that gives them, and the
   seconds of one loop iteration (decode time less the prefills, per target call).
2. Single calls at the median-length input's bucket (grid.costs): verify calls of
   k = 2..--max_gamma + 1 positions, each draft's one-token call and the first call of its
   steps (the head: gamma + 1 positions of the target's features; the small T5: the
   2-token catch-up).
3. research/predict/ceiling.py from those step costs: the acceptance that 1.0x, 1.3x and
   1.5x need, end to end (prefill included, at the inputs' mean output length) and decode
   only, with each draft's real loop, with its calls alone (no loop work, each call timed
   in a loop of its own) and with a draft that costs nothing (verify calls alone: the bound
   for any draft of this target); and the best gamma's speedup at each acceptance.

Writes results/speedup_ceiling.{json,md}.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from specdec_t5x.algorithm import batching, theory
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.research.measure import evaluation, grid, loop_ladder, measurement
from specdec_t5x.research.predict import ceiling
from specdec_t5x.research.results import harness

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
                    **stats_lib.rates(dec.stats),
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


def run(args, script: str) -> Dict[str, Any]:
  """`measure` on the demo target, HEAD and DRAFT, and the first --num_examples EN->DE
  test inputs."""
  drafts = {HEAD: evaluation.load_model(HEAD), DRAFT: evaluation.load_model(DRAFT)}
  examples = evaluation.load_examples('ende', args.num_examples)
  return measure(evaluation.load_model(TARGET), drafts, [e.inputs for e in examples],
                 args.gammas, args.max_gamma, args.max_len, args.repeats)


def _alpha(value):
  return 'out of reach' if value is None else f'{value:.2f}'


def render(report: harness.Report) -> List[str]:
  d = report.data
  t_ar = d['ar_step_s']
  md = report.header(
      'Speedup ceiling: the acceptance a speedup needs at this machine\'s step costs',
      f'Target {TARGET}; the first {d["args"]["num_examples"]} EN->DE test inputs (those of '
      f'configs/demo.gin), one at a time, greedy; their autoregressive outputs average '
      f'{d["mean_output_tokens"]:.1f} tokens. An autoregressive loop step costs '
      f'{t_ar * 1e3:.3f} ms, a sequence\'s prefill {d["prefill_target_s"] * 1e3:.2f} ms '
      f'({d["prefill_target_s"] / t_ar:.1f} steps) for the target, '
      + ', '.join(f'{v * 1e3:.2f} ms for {k}' for k, v in d['prefill_draft_s'].items())
      + '. research/predict/ceiling.py: speedup at i.i.d. acceptance alpha from the step costs, '
      'end to end (prefill included, at that mean length) or decode only; the paper\'s analysis '
      'takes a verify call as one step and leaves out the prefill.')
  raw = d['call_costs_s']
  md += ['## The real loops', '',
         'iteration: one loop iteration (the decode less its prefills, per target call); '
         'calls alone: the same step\'s calls, each timed in a loop of identical calls at the '
         'median-length input (%d tokens), against a single target step timed alike.'
         % d['cost_input_tokens'], '']
  md += harness.table(
      ['draft', 'gamma', 'alpha', 'acceptance rate', 'i.i.d. alpha', 'tokens / call',
       'iteration / AR step', 'calls alone / step', 'measured'],
      [[r['draft'], r['gamma'], f'{r["alpha"]:.3f}', f'{r["acceptance_rate"]:.3f}',
        f'{r["alpha_iid"]:.3f}',
        f'{r["tokens_per_target_call"]:.2f}', f'{r["iteration_s"] / t_ar:.2f}',
        f'{r["calls_alone_s"] / raw["t_target_step"]:.2f}', f'{r["speedup_measured"]:.2f}x']
       for r in d['loops']], 'lrrrrrrrr')
  ks = sorted(int(k.rsplit('_', 1)[1]) for k in raw if k.startswith('t_verify_'))
  md += ['', 'Single calls (ms): target step %.3f; verify ' % (raw['t_target_step'] * 1e3)
         + ', '.join(f'{k}: {raw[f"t_verify_{k}"] * 1e3:.3f} '
                     f'({raw[f"t_verify_{k}"] / raw["t_target_step"]:.2f} steps)' for k in ks)
         + '.', '']
  md += ['## Acceptance needed', '',
         'The lowest i.i.d. acceptance at which some gamma reaches the speedup (real loops: '
         'the gammas timed; single calls: up to the largest verify call timed).', '']
  md += harness.table(
      ['step costs', 'speedup', 'alpha needed, end to end', 'alpha needed, decode only'],
      [[name, s, _alpha(v['end_to_end']), _alpha(v['decode_only'])]
       for name, by_s in d['alpha_needed'].items() for s, v in by_s.items()], 'llrr')
  md += ['', '## Best gamma\'s end-to-end speedup at each acceptance', '']
  names = list(d['best_gamma'])
  md += harness.table(
      ['alpha'] + names,
      [[f'{d["best_gamma"][names[0]][i][0]:.2f}']
       + [f'{d["best_gamma"][nm][i][2]:.2f}x (g{d["best_gamma"][nm][i][1]})' for nm in names]
       for i in range(len(ALPHAS))], 'l' + 'r' * len(names))
  return md


main = measurement.Measurement('speedup_ceiling', __doc__, run, render, repeats=3, flags=dict(
    num_examples=100, gammas=dict(type=harness.ints, default=[1, 2, 3, 4]),
    max_gamma=dict(type=int, default=7, help='single calls up to this gamma'),
    max_len=64)).main
