r"""What acceptance the demo command would need for a given speedup on this machine.

  flock /tmp/specdec_bench.lock python scripts/speedup_ceiling.py \
      [--num_examples 100] [--gammas 1,2,3,4] [--max_gamma 7] [--repeats 3]

Run from the repository root on an idle machine. One process, three parts
(research/measure/ceiling_loops.py): the real loops of the first --num_examples EN->DE
test inputs (the inputs of configs/demo.gin), one at a time, autoregressively and with each
draft at each --gammas, timed interleaved on the timing grid; single calls at the
median-length input (verify calls up to --max_gamma + 1 positions, each draft's calls);
and research/predict/ceiling.py from those step costs: the acceptance that 1.0x, 1.3x and
1.5x need, end to end (prefill included, at the inputs' mean output length) and decode
only, with each draft's real loop, with its calls alone (no loop work, each call timed in
a loop of its own) and with a draft that costs nothing (verify calls alone: the bound for
any draft of this target); and the best gamma's speedup at each acceptance.

Writes results/speedup_ceiling.{json,md}.
"""

from __future__ import annotations

from specdec_t5x.research.measure import ceiling_loops, evaluation
from specdec_t5x.research.measure.ceiling_loops import ALPHAS, DRAFT, HEAD, TARGET
from specdec_t5x.research.results import harness


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'speedup_ceiling'), repeats=3)
  ap.add_argument('--num_examples', type=int, default=100)
  ap.add_argument('--gammas', type=harness.ints, default=[1, 2, 3, 4])
  ap.add_argument('--max_gamma', type=int, default=7, help='single calls up to this gamma')
  ap.add_argument('--max_len', type=int, default=64)
  args = ap.parse_args(argv)
  drafts = {HEAD: evaluation.load_model(HEAD), DRAFT: evaluation.load_model(DRAFT)}
  examples = evaluation.load_examples('ende', args.num_examples)
  measured = ceiling_loops.measure(evaluation.load_model(TARGET), drafts,
                                   [e.inputs for e in examples], args.gammas, args.max_gamma,
                                   args.max_len, args.repeats)
  report = harness.Report(__file__, args, argv)
  report.data.update(measured)
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
