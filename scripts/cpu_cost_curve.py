r"""Where speculative decoding pays on this CPU: what a verify call costs, by model size.

  flock /tmp/specdec_bench.lock python scripts/cpu_cost_curve.py \
      [--sizes=demo,small,base,large,xl] [--forms=float32:packed,bfloat16:packed_bf16,float32:xla] \
      [--ks=1,2,3,4,5,6,7,8] [--repeats=5]

Run from the repository root on an idle machine. For each T5 v1.1-shaped target (demo: the
demo target's shapes and weights; the others T5 v1.1 small .. xl with random weights and one
encoder layer: only decoder calls are timed, and the encoder's depth does not change them)
and each form (parameter dtype : DecodeConfig.cpu_kernels mode), the seconds of one cached
decoder call of k = 1..8 positions at batch 1 (timing.call_costs: chained calls, interleaved
rounds, the median; research/measure/cost_curve.py), with the decoder's weight bytes against
this machine's caches. Then research/predict/ceiling.py on those costs (decode only, i.i.d.
acceptance): the acceptance that 1.0x, 1.5x and 2x need with a draft that costs nothing and
with T5 v1.1 small as the draft (its one-token call in the same form), and the speedup the
paper's T5-small draft would give at the paper's EN->DE greedy acceptance (Table 2: 0.75) --
predictions from measured call costs, not measured decodes.

Each (size, form) cell is saved to {out}.partial.json as it completes, and a rerun with
the same flags resumes from it. Writes results/cpu_cost_curve.{json,md,png}.
"""

from __future__ import annotations

import os

from specdec_t5x.research.measure import cost_curve
from specdec_t5x.research.measure.cost_curve import CACHE_LEN, ENC_LEN, PAPER_SMALL_ALPHA, SPEEDUPS
from specdec_t5x.research.results import harness


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'cpu_cost_curve'), repeats=5)
  ap.add_argument('--sizes', default='demo,small,base,large,xl')
  ap.add_argument('--forms', default='float32:packed,bfloat16:packed_bf16,float32:xla')
  ap.add_argument('--ks', type=harness.ints, default=list(range(1, 9)))
  ap.add_argument('--float32_sizes', default='demo,small,base,large',
                  help='sizes also timed in float32 forms (xl: its float32 weights and their '
                       'packed copy do not fit 24 GiB)')
  args = ap.parse_args(argv)
  if 1 not in args.ks or len(args.ks) < 2:
    raise ValueError('--ks needs 1 (the one-token step) and at least one verify size.')
  forms = [tuple(f.split(':')) for f in args.forms.split(',')]
  partial = args.out + '.partial.json'
  cells = cost_curve.cells(args.sizes.split(','), forms, args.ks, args.repeats,
                           args.float32_sizes.split(','), partial)
  report = harness.Report(__file__, args, argv)
  report.data.update(ks=args.ks, cache_len=CACHE_LEN, encoder_length=ENC_LEN,
                     paper_small_alpha=PAPER_SMALL_ALPHA, cells=cells)
  lines = report.header(
      'Where speculative decoding pays on this CPU: verify-call costs by model size',
      f'Batch 1, a cache of {CACHE_LEN} slots, an encoder input of {ENC_LEN} tokens; float32 '
      f'forms for {args.float32_sizes} only; demo: '
      'the demo target; small .. xl: T5 v1.1 shapes with random weights. step: one '
      'one-token decoder call; k: a call of k positions as a multiple of the step. '
      'alpha for Nx: the i.i.d. acceptance at which the best gamma reaches N times the '
      'autoregressive speed (decode only; "-": not even at alpha 1), with a draft that costs '
      'nothing and with T5 v1.1 small as the draft (c: its step over the target\'s); at '
      f'alpha {PAPER_SMALL_ALPHA}: the paper\'s EN->DE greedy acceptance with its T5-small '
      'draft, the best gamma and the speedup it predicts here. Predictions from call costs, '
      'not measured decodes.')
  lines += harness.table(
      ['size', 'form', 'decoder MB', 'step ms'] + [f'k={k}' for k in args.ks if k > 1],
      [[c['size'], f"{c['dtype']}/{c['mode']}", f"{c['decoder_bytes'] / 2**20:.0f}",
        f"{c['seconds'][1] * 1e3:.2f}"] + [f"{c['verify_over_step'][k]:.2f}"
                                           for k in args.ks if k > 1] for c in cells],
      'll' + 'r' * (len(args.ks) + 1))
  fmt = lambda a: '-' if a is None else f'{a:.2f}'
  rows = []
  for c in cells:
    for name in ('free draft', 'T5 v1.1 small'):
      if name in c:
        best = c[name]['at_paper_alpha']
        rows.append([c['size'], f"{c['dtype']}/{c['mode']}", name,
                     fmt(c.get('c_small')) if name != 'free draft' else '0']
                    + [fmt(c[name]['alpha_needed'][f'{s:g}x']) for s in SPEEDUPS]
                    + [f"{best['speedup']:.2f}x (gamma {best['gamma']})"])
  lines += ['', '## The acceptance each speedup needs', '']
  lines += harness.table(['size', 'form', 'draft', 'c'] + [f'alpha for {s:g}x' for s in SPEEDUPS]
                         + [f'at alpha {PAPER_SMALL_ALPHA}'], rows, 'llll' + 'r' * 4)
  pays = [c for c in cells if 'T5 v1.1 small' in c
          and c['T5 v1.1 small']['at_paper_alpha']['speedup'] >= 1.5]
  lines += ['', 'The smallest target at which the paper\'s T5-small draft at alpha '
            f'{PAPER_SMALL_ALPHA} would give >= 1.5x here: ' + (
                ', '.join(f"{c['size']} ({c['dtype']}/{c['mode']})" for c in pays[:1])
                if pays else 'none of those measured') + '.']
  report.write(lines)
  _plot(report, cells, args.ks)
  if os.path.exists(partial):
    os.remove(partial)


def _plot(report, cells, ks):
  plt = harness.pyplot()
  if plt is None:
    return
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for c in cells:
    ax.plot(ks, [1.0] + [c['verify_over_step'][k] for k in ks if k > 1], marker='o',
            label=f"{c['size']} {c['dtype']}/{c['mode']}")
  ax.plot(ks, [1.0] * len(ks), 'k--', lw=1, label='an accelerator (ideal)')
  ax.set_xlabel('positions in one call (gamma + 1)')
  ax.set_ylabel('call cost / one-token step')
  ax.legend(fontsize=7, ncol=2)
  report.save_figure(fig)


if __name__ == '__main__':
  main()
