"""Adaptive draft length (gamma_policy) vs fixed gammas on demo rows, batch 1, greedy.

  flock /tmp/specdec_bench.lock python scripts/adaptive_gamma.py [--task=ende] [--rows=8] \
      [--max_len=48] [--repeats=1]

demo_target + demo_draft_m. Fixed gamma 1, 2, 3, 4, 6, 'confidence' (max gamma 6,
thresholds 0.3 / 0.5 / 0.7) and 'running_alpha' (max gamma 6, cost ratio c = 0.2 / 0.4),
timed interleaved with AR (median of --repeats). Each output is checked equal to AR.
Writes results/adaptive_gamma.{json,md}: seconds for all rows (one at a time), speedup vs
AR and vs the best fixed gamma, alpha, tokens per target call, mean drafts per step.
"""

from __future__ import annotations

import json

from specdec_t5x.algorithm.decoding import GammaPolicy
from specdec_t5x.research import demo_data, evaluation, harness


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'adaptive_gamma'), repeats=1)
  ap.add_argument('--task', default='ende')
  ap.add_argument('--rows', type=int, default=8)
  ap.add_argument('--max_len', type=int, default=48)
  args = ap.parse_args(argv)
  target, draft = evaluation.load_model('demo_target'), evaluation.load_model('demo_draft_m')
  enc, _, _ = demo_data.load_task(args.task, args.rows)
  configs = {f'fixed g={g}': (g, GammaPolicy()) for g in (1, 2, 3, 4, 6)}
  configs.update({f'confidence t={t}': (6, GammaPolicy('confidence', threshold=t))
                  for t in (0.3, 0.5, 0.7)})
  configs.update({f'running_alpha c={c}': (6, GammaPolicy('running_alpha', cost_ratio=c))
                  for c in (0.2, 0.4)})
  fns = {'AR': demo_data.row_decoder(target, enc, args.max_len)}
  fns.update({name: demo_data.row_decoder(target, enc, args.max_len, draft=draft, gamma=g,
                                          gamma_policy=policy)
              for name, (g, policy) in configs.items()})
  res = demo_data.row_results(harness.interleaved(fns, args.repeats))
  rows = [dict(name=name, gamma_max=configs[name][0] if name in configs else None, **r)
          for name, r in res.items()]
  best_fixed = min(r['seconds'] for r in rows if r['name'].startswith('fixed'))
  for r in rows:
    r['speedup_vs_best_fixed'] = best_fixed / r['seconds']
    print(json.dumps(r), flush=True)
  report = harness.Report(__file__, args, argv)
  report.data.update(task=args.task, rows=args.rows, max_len=args.max_len, results=rows)
  report.write(report.header(
      'Adaptive draft length vs fixed gamma (demo_target + demo_draft_m)',
      f'Greedy, batch 1, task {args.task}, {args.rows} rows decoded one at a time, '
      f'max_decode_length {args.max_len}, median of {args.repeats} interleaved repeats.') +
      harness.table(['policy', 'alpha', 'tokens/call', 'drafts/step', 'seconds', 'vs AR',
                     'vs best fixed', '== AR'],
                    [[r['name'], harness.fmt(r['alpha_empirical']), f"{r['mean_tokens_per_target_call']:.2f}",
                      harness.fmt(r['drafts_per_step']), f"{r['seconds']:.2f}",
                      f"{r['speedup_vs_ar']:.2f}", f"{r['speedup_vs_best_fixed']:.2f}",
                      r['equal_to_ar']] for r in rows], 'lrrrrrrl'))


if __name__ == '__main__':
  main()
