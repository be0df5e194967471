"""Copy (prompt-lookup) draft vs learned and n-gram drafts on the demo tasks, batch 1.

  flock /tmp/specdec_bench.lock python scripts/bench_copy_draft.py [--rows=12] [--gamma=4] \
      [--max_len=48] [--repeats=1] [--tasks=summarize,ende]

Takes the demo checkpoints, checkpoints/demo/bigram_{task}.npz and data/demo/*_test.tsv.
Decodes `rows` examples one at a time (greedy) with AR and with each draft, timed
interleaved (median of --repeats); every speculative output is checked equal to AR. Prints
one line per (task, draft) and writes results/copy_draft.{json,md}: alpha, tokens per
target call, wall seconds, speedup vs AR.
"""

from __future__ import annotations

import json
import os

from specdec_t5x.algorithm.drafts import CopyDraft
from specdec_t5x.integration.draft_files import load_ngram
from specdec_t5x.research import demo_data, evaluation, harness


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'copy_draft'), repeats=1)
  ap.add_argument('--rows', type=int, default=12)
  ap.add_argument('--gamma', type=int, default=4)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--tasks', default='summarize,ende')
  args = ap.parse_args(argv)
  target, draft_m = evaluation.load_model('demo_target'), evaluation.load_model('demo_draft_m')
  v = target[0].config.vocab_size
  results = []
  for task in args.tasks.split(','):
    enc, _, _ = demo_data.load_task(task, args.rows)
    bigram = load_ngram(os.path.join(evaluation.DEMO_DIR, f'bigram_{task}.npz'))
    drafts = {
        'demo_draft_m': dict(draft=draft_m),
        'bigram': dict(draft=bigram),
        'copy(uniform)': dict(draft=(CopyDraft(v), {})),
        'copy(uniform)+confidence': dict(draft=(CopyDraft(v), {}), gamma_policy='confidence'),
        'copy+bigram': dict(draft=(CopyDraft(v, fallback=bigram[0]), {'fallback': bigram[1]})),
        'copy+demo_draft_m': dict(draft=(CopyDraft(v, fallback=draft_m[0]),
                                         {'fallback': draft_m[1]})),
    }
    fns = {'AR': demo_data.row_decoder(target, enc, args.max_len)}
    fns.update({name: demo_data.row_decoder(target, enc, args.max_len, gamma=args.gamma, **kw)
                for name, kw in drafts.items()})
    for name, r in demo_data.row_results(harness.interleaved(fns, args.repeats)).items():
      results.append(dict(task=task, draft=name, speedup=r.pop('speedup_vs_ar'), **r))
      print(json.dumps(results[-1]), flush=True)
  report = harness.Report(__file__, args, argv)
  report.data.update(rows=args.rows, gamma=args.gamma, max_len=args.max_len, results=results)
  report.write(report.header(
      'Copy (prompt-lookup) draft on the demo tasks',
      f'Greedy, batch 1, {args.rows} test rows per task, gamma {args.gamma}, '
      f'max_decode_length {args.max_len}, median of {args.repeats} interleaved repeats.') +
      harness.table(['task', 'draft', 'alpha', 'tokens/call', 'seconds', 'speedup vs AR',
                     'output == AR'],
                    [[r['task'], r['draft'], harness.fmt(r['alpha_empirical']),
                      f"{r['mean_tokens_per_target_call']:.2f}", f"{r['seconds']:.2f}",
                      f"{r['speedup']:.2f}", r['equal_to_ar']] for r in results], 'llrrrrl'))


if __name__ == '__main__':
  main()
