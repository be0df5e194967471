"""Draft trees vs chains on the demo tasks: tokens per target call and CPU time, batch 1.

  flock /tmp/specdec_bench.lock python scripts/tree_table.py [--rows=8] [--max_len=48] \
      [--decodes=g2,g3,g5,g2+c3,g2+s1,g3+s2,g4+s1,g2+s2.1] [--temperatures=0,1] [--repeats=1] \
      [--tasks=summarize,ende]

Takes the demo checkpoints and data/demo/*_test.tsv. Decodes `rows` examples one at a time
with AR and with each of --decodes (demo_draft_m as the draft), timed interleaved (median
of --repeats), at each temperature (0: greedy, every output checked equal to AR's; t > 0:
one sample per row, rng fixed). A decode is named g<gamma> (the chain), plus +c<copy>
(DecodeConfig.copy_branch) and +s<k1>.<k2>... (DecodeConfig.draft_siblings: the draft's
k_t runner-up tokens at depth t). Verified positions per call: 1 + gamma + copy + the
siblings; draft calls per step: gamma. Writes results/tree.{json,md}: tokens per target
call, accepted tokens by source, wall seconds, speedup vs AR.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict

import numpy as np

from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research import demo_data, evaluation, harness

SPEC = re.compile(r'g(\d+)(?:\+c(\d+))?(?:\+s([\d.]+))?$')


def parse_decode(spec: str) -> Dict[str, Any]:
  """'g2+c3+s2.1' -> dict(gamma=2, copy_branch=3, draft_siblings=(2, 1))."""
  m = SPEC.match(spec)
  if not m:
    raise ValueError(f'a decode is g<gamma>[+c<copy>][+s<k1>.<k2>...], got {spec!r}')
  out: Dict[str, Any] = dict(gamma=int(m.group(1)))
  if m.group(2):
    out['copy_branch'] = int(m.group(2))
  if m.group(3):
    out['draft_siblings'] = tuple(int(k) for k in m.group(3).split('.'))
  DecodeConfig(**out)  # validated before anything loads
  return out


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'tree'), repeats=1)
  ap.add_argument('--rows', type=int, default=8)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--decodes', default='g2,g3,g5,g2+c3,g2+s1,g3+s2,g4+s1,g2+s2.1')
  ap.add_argument('--temperatures', type=harness.floats, default=[0.0, 1.0])
  ap.add_argument('--tasks', default='summarize,ende')
  args = ap.parse_args(argv)
  decodes = {spec: parse_decode(spec) for spec in args.decodes.split(',')}
  target, draft_m = evaluation.load_model('demo_target'), evaluation.load_model('demo_draft_m')
  results = []
  for task in args.tasks.split(','):
    enc, _, _ = demo_data.load_task(task, args.rows)
    for t in args.temperatures:
      fns = {'AR': demo_data.row_decoder(target, enc, args.max_len, temperature=t)}
      fns.update({spec: demo_data.row_decoder(target, enc, args.max_len, draft=draft_m,
                                              temperature=t, **kw)
                  for spec, kw in decodes.items()})
      timings = harness.interleaved(fns, args.repeats)
      for name, r in demo_data.row_results(timings).items():
        r['accepted_by_source'] = np.sum([np.asarray(o.stats['accepted_by_source'])
                                          for o in timings.outputs[name]], axis=0).tolist()
        config = DecodeConfig(**decodes.get(name, dict(gamma=1)))
        results.append(dict(
            task=task, temperature=t, decode=name, draft_calls=config.gamma if name != 'AR' else 0,
            verified_positions=1 + config.tree_nodes if name != 'AR' else 1,
            speedup=r.pop('speedup_vs_ar'), **r))
        print(json.dumps(results[-1]), flush=True)
  report = harness.Report(__file__, args, argv)
  report.data.update(rows=args.rows, max_len=args.max_len, results=results)
  report.write(report.header(
      'Draft trees vs chains on the demo tasks',
      f'demo_target with demo_draft_m; batch 1, {args.rows} test rows per task, '
      f'max_decode_length {args.max_len}, median of {args.repeats} interleaved repeats. '
      'g<gamma>: the chain; +c<n>: a copy branch of n tokens; +s<k1>.<k2>: the draft\'s '
      'k_t runner-up tokens at depth t. Positions: tokens one target call verifies; '
      'calls: draft calls per step; accepted from: the accepted tokens by what proposed '
      'them (chain / copy / siblings). Greedy outputs are checked equal to AR\'s.') +
      harness.table(['task', 't', 'decode', 'positions', 'draft calls', 'tokens/call',
                     'accepted from', 'seconds', 'speedup vs AR', 'output == AR'],
                    [[r['task'], f"{r['temperature']:g}", r['decode'], r['verified_positions'],
                      r['draft_calls'], f"{r['mean_tokens_per_target_call']:.2f}",
                      ' / '.join(str(n) for n in r['accepted_by_source']),
                      f"{r['seconds']:.2f}", f"{r['speedup']:.2f}",
                      r['equal_to_ar'] if r['temperature'] == 0 else '-']
                     for r in results], 'lllrrrrrrl'))


if __name__ == '__main__':
  main()
