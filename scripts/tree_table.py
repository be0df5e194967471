"""Draft trees vs chains on the demo tasks: tokens per target call and CPU time, batch 1.

  flock /tmp/specdec_bench.lock python scripts/tree_table.py [--rows=8] [--gamma=2] \
      [--copy=3] [--max_len=48] [--repeats=1] [--tasks=summarize,ende]

Takes the demo checkpoints and data/demo/*_test.tsv. Decodes `rows` examples one at a time
(greedy) with AR, with demo_draft_m's chain of gamma tokens, with its chain of
gamma + copy tokens (as many verified positions as the tree), and with the tree (the chain
of gamma tokens plus a copy branch of `copy` tokens, DecodeConfig.copy_branch), timed
interleaved (median of --repeats); every output is checked equal to AR. Writes
results/tree.{json,md}: tokens per target call, verified positions per call, wall seconds,
speedup vs AR.
"""

from __future__ import annotations

import json

from specdec_t5x.research import demo_data, evaluation, harness


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'tree'), repeats=1)
  ap.add_argument('--rows', type=int, default=8)
  ap.add_argument('--gamma', type=int, default=2)
  ap.add_argument('--copy', type=int, default=3)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--tasks', default='summarize,ende')
  args = ap.parse_args(argv)
  target, draft_m = evaluation.load_model('demo_target'), evaluation.load_model('demo_draft_m')
  g, c = args.gamma, args.copy
  decodes = {
      f'chain, gamma {g}': dict(gamma=g),
      f'chain, gamma {g + c}': dict(gamma=g + c),
      f'tree, gamma {g} + copy {c}': dict(gamma=g, copy_branch=c),
  }
  results = []
  for task in args.tasks.split(','):
    enc, _, _ = demo_data.load_task(task, args.rows)
    fns = {'AR': demo_data.row_decoder(target, enc, args.max_len)}
    fns.update({name: demo_data.row_decoder(target, enc, args.max_len, draft=draft_m, **kw)
                for name, kw in decodes.items()})
    for name, r in demo_data.row_results(harness.interleaved(fns, args.repeats)).items():
      kw = decodes.get(name, {})
      positions = 1 + kw.get('gamma', 0) + kw.get('copy_branch', 0)
      results.append(dict(task=task, decode=name, verified_positions=positions,
                          speedup=r.pop('speedup_vs_ar'), **r))
      print(json.dumps(results[-1]), flush=True)
  report = harness.Report(__file__, args, argv)
  report.data.update(rows=args.rows, gamma=g, copy=c, max_len=args.max_len, results=results)
  report.write(report.header(
      'Draft trees vs chains on the demo tasks',
      f'demo_target with demo_draft_m; greedy, batch 1, {args.rows} test rows per task, '
      f'max_decode_length {args.max_len}, median of {args.repeats} interleaved repeats. '
      'Positions: tokens per target call verified (the tree: its root, chain and copy '
      'branch).') +
      harness.table(['task', 'decode', 'positions', 'tokens/call', 'seconds', 'speedup vs AR',
                     'output == AR'],
                    [[r['task'], r['decode'], r['verified_positions'],
                      f"{r['mean_tokens_per_target_call']:.2f}", f"{r['seconds']:.2f}",
                      f"{r['speedup']:.2f}", r['equal_to_ar']] for r in results], 'llrrrrl'))


if __name__ == '__main__':
  main()
