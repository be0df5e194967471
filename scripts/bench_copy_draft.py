"""Copy (prompt-lookup) draft vs learned and n-gram drafts on the demo tasks, batch 1.

  flock /tmp/specdec_bench.lock python scripts/bench_copy_draft.py [--rows=12] [--gamma=4] \
      [--max_len=48]

Takes the demo checkpoints, checkpoints/demo/bigram_{task}.npz and data/demo/*_test.tsv.
Decodes `rows` examples one at a time (greedy) with AR and with each draft; every
speculative output is checked equal to AR. Prints one line per (task, draft) and writes
results/copy_draft.{json,md}: alpha, tokens per target call, wall seconds, speedup vs AR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_batch import DEMO, REPO, load_demo, load_task  # noqa: E402

from specdec_t5x import generate  # noqa: E402
from specdec_t5x.algorithm import batching, timing  # noqa: E402
from specdec_t5x.research import benchmarking  # noqa: E402
from specdec_t5x.algorithm.drafts import CopyDraft  # noqa: E402
from specdec_t5x.integration.draft_files import load_ngram  # noqa: E402


def run_rows(target, enc, max_len, repeats, **kw):
  """Decodes each row alone, at its length bucket; -> (total seconds (min over repeats),
  tokens, summed stats)."""
  rows = [batching.trim_batch(enc[r:r + 1]) for r in range(len(enc))]
  for shape in sorted({row.shape for row in rows}):  # compile each bucket before timing
    timing.block(generate(target, next(r for r in rows if r.shape == shape),
                                max_decode_length=max_len, **kw))
  best, toks, stats = None, [], {}
  for _ in range(repeats):
    start, toks, stats = time.perf_counter(), [], {}
    for row in rows:
      out = timing.block(generate(target, row, max_decode_length=max_len, **kw))
      toks.append(np.asarray(out.tokens[0]))
      for k in ('generated_tokens', 'target_calls', 'drafted_tokens', 'accepted_tokens'):
        stats[k] = stats.get(k, 0) + int(np.asarray(out.stats[k]).sum())
    sec = time.perf_counter() - start
    best = sec if best is None else min(best, sec)
  return best, np.stack(toks), stats


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--rows', type=int, default=12)
  ap.add_argument('--gamma', type=int, default=4)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--repeats', type=int, default=1)
  ap.add_argument('--tasks', default='summarize,ende')
  ap.add_argument('--out', default=os.path.join(REPO, 'results', 'copy_draft'))
  args = ap.parse_args(argv)
  target, draft_m = load_demo('demo_target'), load_demo('demo_draft_m')
  v = target[0].config.vocab_size
  results = []
  for task in args.tasks.split(','):
    enc, _, _ = load_task(task, args.rows)
    bigram = load_ngram(os.path.join(DEMO, f'bigram_{task}.npz'))
    drafts = {
        'demo_draft_m': dict(draft=draft_m),
        'bigram': dict(draft=bigram),
        'copy(uniform)': dict(draft=(CopyDraft(v), {})),
        'copy(uniform)+confidence': dict(draft=(CopyDraft(v), {}), gamma_policy='confidence'),
        'copy+bigram': dict(draft=(CopyDraft(v, fallback=bigram[0]), {'fallback': bigram[1]})),
        'copy+demo_draft_m': dict(draft=(CopyDraft(v, fallback=draft_m[0]),
                                         {'fallback': draft_m[1]})),
    }
    ar_sec, ar_toks, ar_stats = run_rows(target, enc, args.max_len, args.repeats)
    results.append(dict(task=task, draft='AR', seconds=ar_sec, speedup=1.0, alpha=None,
                        tokens_per_call=1.0, equal_to_ar=True, **ar_stats))
    print(json.dumps(results[-1]), flush=True)
    for name, kw in drafts.items():
      sec, toks, st = run_rows(target, enc, args.max_len, args.repeats, gamma=args.gamma, **kw)
      results.append(dict(
          task=task, draft=name, seconds=sec, speedup=ar_sec / sec,
          alpha=st['accepted_tokens'] / max(st['drafted_tokens'], 1),
          tokens_per_call=st['generated_tokens'] / st['target_calls'],
          equal_to_ar=bool(np.array_equal(toks, ar_toks)), **st))
      print(json.dumps(results[-1]), flush=True)
  data = {'command': 'python scripts/bench_copy_draft.py ' + ' '.join(argv or sys.argv[1:]),
          'rows': args.rows, 'gamma': args.gamma, 'max_len': args.max_len,
          'environment': benchmarking.environment(), 'results': results}
  benchmarking.write_json(args.out + '.json', data)
  lines = ['# Copy (prompt-lookup) draft on the demo tasks', '',
           f'`flock /tmp/specdec_bench.lock {data["command"]}` — greedy, batch 1, '
           f'{args.rows} test rows per task, gamma {args.gamma}, max_decode_length '
           f'{args.max_len}, CPU (2 shared cores: walltimes are noisy).', '',
           '| task | draft | alpha | tokens/call | seconds | speedup vs AR | output == AR |',
           '|---|---|---:|---:|---:|---:|---|']
  for r in results:
    alpha = '-' if r['alpha'] is None else f"{r['alpha']:.2f}"
    lines.append(f"| {r['task']} | {r['draft']} | {alpha} | {r['tokens_per_call']:.2f} | "
                 f"{r['seconds']:.2f} | {r['speedup']:.2f} | {r['equal_to_ar']} |")
  benchmarking.write_text(args.out + '.md', '\n'.join(lines) + '\n')


if __name__ == '__main__':
  main()
