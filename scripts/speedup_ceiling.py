r"""What acceptance the demo command would need for a given speedup on this machine.

  flock /tmp/specdec_bench.lock python scripts/speedup_ceiling.py \
      [--num_examples 100] [--gammas 1,2,3,4] [--max_gamma 7] [--repeats 3]

Run from the repository root on an idle machine. One process, three parts:

1. The real loops: the first --num_examples EN->DE test inputs (the inputs of
   configs/demo.gin), decoded one at a time, autoregressively and with each draft at each
   --gammas, timed interleaved (speed.Decoder). Per draft and gamma: the measured speedup,
   tokens per target call, the i.i.d. acceptance that gives them, and the seconds of one
   loop iteration (decode time less the prefills, per target call), against one
   autoregressive step.
2. Single calls at the median-length input's length bucket (speed.costs): a verify call of
   k = 2..--max_gamma + 1 positions, each draft's one-token call and the first call of its
   steps (the head: gamma + 1 positions of the target's features; the small T5: the
   2-token catch-up).
3. research/predict/ceiling.py from those step costs: the acceptance that 1.0x, 1.3x and 1.5x
   need, end to end (prefill included, at the inputs' mean output length) and decode only,
   with each draft's real loop, with its calls alone (no loop work, each call timed in a
   loop of its own) and with a draft that costs nothing (verify calls alone: the bound for
   any draft of this target); and the best gamma's speedup at each acceptance.

Writes results/speedup_ceiling.{json,md}.
"""

from __future__ import annotations

import statistics

import numpy as np

from specdec_t5x.algorithm import batching, theory, timing
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.predict import ceiling
from specdec_t5x.research.measure import evaluation, loop_ladder, speed
from specdec_t5x.research.results import harness

HEAD, DRAFT, TARGET = 'demo_feature_head_kd', 'demo_draft_m', 'demo_target'
SPEEDUPS = (1.0, 1.3, 1.5)
ALPHAS = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)


def prefill_per_sequence(model, rows, cache_len):
  """Mean prefill seconds over `rows` (each at its length bucket; timed once per bucket)."""
  by_shape = {}
  for r in rows:
    if r.shape not in by_shape:
      by_shape[r.shape] = timing.prefill_cost(*model, r, cache_len)
  return float(np.mean([by_shape[r.shape] for r in rows]))


def real_loops(target, drafts, enc, gammas, max_len, repeats):
  """Times every loop interleaved; returns (AR decoder, medians, {(name, g): decoder})."""
  ar = speed.Decoder(target, None, enc, max_len)
  decs = {(name, g): speed.Decoder(target, d, enc, max_len, DecodeConfig(gamma=g))
          for name, d in drafts.items() for g in gammas}
  fns = {'ar': ar, **{f'{n}_g{g}': d for (n, g), d in decs.items()}}
  times = timing.median_times(fns, repeats)
  return ar, {k: statistics.median(v) for k, v in times.items()}, decs


def call_costs(target, drafts, row, max_gamma, max_len):
  """Costs.from_calls per draft, and for a free draft, from single calls at `row`."""
  gammas = list(range(1, max_gamma + 1))
  raw = speed.costs(target, drafts, row, gammas, max_len=max_len)
  firsts = {f'first_{HEAD}_{g}': (*drafts[HEAD], g + 1) for g in gammas}
  firsts[f'first_{DRAFT}'] = (*drafts[DRAFT], 2)
  raw.update(timing.call_costs(firsts, batching.trim_batch(row), repeats=7,
                               cache_len=max_len + max_gamma + 1))
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


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'speedup_ceiling'), repeats=3)
  ap.add_argument('--num_examples', type=int, default=100)
  ap.add_argument('--gammas', type=harness.ints, default=[1, 2, 3, 4])
  ap.add_argument('--max_gamma', type=int, default=7, help='single calls up to this gamma')
  ap.add_argument('--max_len', type=int, default=64)
  args = ap.parse_args(argv)
  target = evaluation.load_model(TARGET)
  drafts = {HEAD: evaluation.load_model(HEAD), DRAFT: evaluation.load_model(DRAFT)}
  examples = evaluation.load_examples('ende', args.num_examples)
  enc = batching.pad_batch([e.inputs for e in examples])
  ar, med, decs = real_loops(target, drafts, enc, args.gammas, args.max_len, args.repeats)
  n = len(examples)
  length = float(ar.stats['generated_tokens'].sum()) / n
  rows = [batching.trim_batch(enc[i:i + 1]) for i in range(n)]
  cache_len = args.max_len + max(args.gammas) + 1
  pre_t = prefill_per_sequence(target, rows, cache_len)
  pre = {name: prefill_per_sequence(d, rows, cache_len) for name, d in drafts.items()}
  t_ar = loop_ladder.loop_seconds(med['ar'], n * pre_t, ar.iterations)
  loops, costs = [], {}
  for name in drafts:
    steps = {}
    for g in args.gammas:
      dec = decs[(name, g)]
      steps[g] = loop_ladder.loop_seconds(med[f'{name}_g{g}'], n * (pre_t + pre[name]),
                                          dec.iterations)
      tokens = float(dec.stats['generated_tokens'].sum() / dec.stats['target_calls'].sum())
      alpha = float(theory.alpha_from_tokens_per_call(tokens, g))
      loops.append({'draft': name, 'gamma': g, 'tokens_per_target_call': tokens,
                    'alpha': float(dec.stats['accepted_tokens'].sum()
                                   / max(1, dec.stats['drafted_tokens'].sum())),
                    'alpha_iid': alpha, 'speedup_measured': med['ar'] / med[f'{name}_g{g}'],
                    'iteration_s': steps[g]})
    costs[f'{name} (real loop)'] = ceiling.Costs(t_ar, steps, pre_t, pre[name])
  median = sorted(range(n), key=lambda i: len(examples[i].inputs))[n // 2]
  raw, alone = call_costs(target, drafts, batching.pad_batch([examples[median].inputs]),
                          args.max_gamma, args.max_len)
  costs.update(alone)
  for r in loops:
    r['calls_alone_s'] = alone[f'{r["draft"]} (calls alone)'].t_step[r['gamma']]
  needed = {name: {f'{s:g}x': {kind: ceiling.alpha_needed(c, s, length if kind == 'end_to_end'
                                                           else 0.0)
                               for kind in ('end_to_end', 'decode_only')}
                   for s in SPEEDUPS} for name, c in costs.items()}
  best = {name: [[a, *ceiling.best(c, a, length)] for a in ALPHAS] for name, c in costs.items()}
  report = harness.Report(__file__, args, argv)
  report.data.update(mean_output_tokens=length, ar_step_s=t_ar, prefill_target_s=pre_t,
                     prefill_draft_s=pre, cost_input_tokens=len(examples[median].inputs),
                     loops=loops, call_costs_s=raw, alpha_needed=needed, best_gamma=best,
                     step_costs_s={k: {'t_target': c.t_target, 't_step': c.t_step,
                                       'prefill_target': c.prefill_target,
                                       'prefill_draft': c.prefill_draft}
                                   for k, c in costs.items()})
  print(report.write(render(report)))


def _alpha(value):
  return 'out of reach' if value is None else f'{value:.2f}'


def render(report):
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
      ['draft', 'gamma', 'alpha', 'i.i.d. alpha', 'tokens / call', 'iteration / AR step',
       'calls alone / step', 'measured'],
      [[r['draft'], r['gamma'], f'{r["alpha"]:.3f}', f'{r["alpha_iid"]:.3f}',
        f'{r["tokens_per_target_call"]:.2f}', f'{r["iteration_s"] / t_ar:.2f}',
        f'{r["calls_alone_s"] / raw["t_target_step"]:.2f}', f'{r["speedup_measured"]:.2f}x']
       for r in d['loops']], 'lrrrrrrr')
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


if __name__ == '__main__':
  main()
