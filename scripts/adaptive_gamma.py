"""Adaptive draft length (gamma_policy) vs fixed gammas on demo rows, batch 1, greedy.

  flock /tmp/specdec_bench.lock python scripts/adaptive_gamma.py [--task=ende] [--rows=8] \
      [--max_len=48]

demo_target + demo_draft_m. Fixed gamma 1..6, 'confidence' (max gamma 6, thresholds 0.3 /
0.5 / 0.7) and 'running_alpha' (max gamma 6, cost ratio c = 0.2 / 0.4). Each output is
checked equal to AR. Writes results/adaptive_gamma.{json,md}: seconds for all rows (one
at a time), speedup vs AR and vs the best fixed gamma, alpha, tokens per target call,
mean drafts per step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_batch import REPO, load_demo, load_task  # noqa: E402
from bench_copy_draft import run_rows  # noqa: E402

from specdec_t5x.research import benchmarking  # noqa: E402
from specdec_t5x.algorithm.decoding import GammaPolicy  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--task', default='ende')
  ap.add_argument('--rows', type=int, default=8)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--repeats', type=int, default=1)
  ap.add_argument('--out', default=os.path.join(REPO, 'results', 'adaptive_gamma'))
  args = ap.parse_args(argv)
  target, draft = load_demo('demo_target'), load_demo('demo_draft_m')
  enc, _, _ = load_task(args.task, args.rows)
  configs = [(f'fixed g={g}', g, GammaPolicy()) for g in (1, 2, 3, 4, 6)]
  configs += [(f'confidence t={t}', 6, GammaPolicy('confidence', threshold=t)) for t in (0.3, 0.5, 0.7)]
  configs += [(f'running_alpha c={c}', 6, GammaPolicy('running_alpha', cost_ratio=c)) for c in (0.2, 0.4)]
  ar_sec, ar_toks, _ = run_rows(target, enc, args.max_len, args.repeats)
  rows = [dict(name='AR', seconds=ar_sec, speedup_vs_ar=1.0)]
  print(json.dumps(rows[-1]), flush=True)
  for name, g, policy in configs:
    sec, toks, st = run_rows(target, enc, args.max_len, args.repeats, draft=draft, gamma=g,
                             gamma_policy=policy)
    rows.append(dict(name=name, gamma_max=g, seconds=sec, speedup_vs_ar=ar_sec / sec,
                     alpha=st['accepted_tokens'] / max(st['drafted_tokens'], 1),
                     tokens_per_call=st['generated_tokens'] / st['target_calls'],
                     drafts_per_step=st['drafted_tokens'] / st['target_calls'],
                     equal_to_ar=bool(np.array_equal(toks, ar_toks)), **st))
    print(json.dumps(rows[-1]), flush=True)
  best_fixed = min(r['seconds'] for r in rows if r['name'].startswith('fixed'))
  for r in rows:
    r['speedup_vs_best_fixed'] = best_fixed / r['seconds']
  data = {'command': 'python scripts/adaptive_gamma.py ' + ' '.join(argv or sys.argv[1:]),
          'task': args.task, 'rows': args.rows, 'max_len': args.max_len,
          'environment': benchmarking.environment(), 'results': rows}
  benchmarking.write_json(args.out + '.json', data)
  lines = ['# Adaptive draft length vs fixed gamma (demo_target + demo_draft_m)', '',
           f'`flock /tmp/specdec_bench.lock {data["command"]}` — greedy, batch 1, task '
           f'{args.task}, {args.rows} rows decoded one at a time, max_decode_length '
           f'{args.max_len}, CPU (2 shared cores: walltimes are noisy).', '',
           '| policy | alpha | tokens/call | drafts/step | seconds | vs AR | vs best fixed | == AR |',
           '|---|---:|---:|---:|---:|---:|---:|---|']
  for r in rows:
    if r['name'] == 'AR':
      lines.append(f"| AR | - | 1.00 | - | {r['seconds']:.2f} | 1.00 | "
                   f"{r['speedup_vs_best_fixed']:.2f} | True |")
      continue
    lines.append(f"| {r['name']} | {r['alpha']:.2f} | {r['tokens_per_call']:.2f} | "
                 f"{r['drafts_per_step']:.2f} | {r['seconds']:.2f} | {r['speedup_vs_ar']:.2f} | "
                 f"{r['speedup_vs_best_fixed']:.2f} | {r['equal_to_ar']} |")
  benchmarking.write_text(args.out + '.md', '\n'.join(lines) + '\n')


if __name__ == '__main__':
  main()
