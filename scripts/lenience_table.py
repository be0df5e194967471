"""Lenience (the paper's LOSSY relaxation): speed, alpha and quality as l goes 1 -> 0.1.

  flock /tmp/specdec_bench.lock python scripts/lenience_table.py [--rows=32] [--max_len=48]

demo_target + demo_draft_m, gamma 4, temperature 1, token verifier; all `rows` test rows
of each demo task in one batch (same rng for every l). Quality: BLEU (ende) or ROUGE
(summarize) against the references. Rows with l < 1 are marked lossy: their outputs no
longer follow the target's distribution. Writes results/lenience.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_batch import REPO, decode_text, load_demo, load_task, summarize_stats, timed  # noqa: E402

from specdec_t5x import generate  # noqa: E402
from specdec_t5x.algorithm import batching  # noqa: E402
from specdec_t5x.integration import metrics  # noqa: E402
from specdec_t5x.research import benchmarking  # noqa: E402


def quality(task, refs, preds):
  if task == 'ende':
    return metrics.bleu(refs, preds)
  return {k: v for k, v in metrics.rouge(refs, preds).items()}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--rows', type=int, default=32)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--gamma', type=int, default=4)
  ap.add_argument('--repeats', type=int, default=2)
  ap.add_argument('--tasks', default='ende,summarize')
  ap.add_argument('--out', default=os.path.join(REPO, 'results', 'lenience'))
  args = ap.parse_args(argv)
  target, draft = load_demo('demo_target'), load_demo('demo_draft_m')
  rng = jax.random.PRNGKey(0)
  rows = []
  for task in args.tasks.split(','):
    enc, refs, sp = load_task(task, args.rows)
    enc = batching.trim_batch(enc)  # the batch at its length bucket
    common = dict(temperature=1.0, max_decode_length=args.max_len, rng=rng)
    settings = [('AR', None)] + [(f'l={l}', l) for l in (1.0, 0.5, 0.3, 0.1)]
    for name, l in settings:
      kw = {} if l is None else dict(draft=draft, gamma=args.gamma, lenience=l)
      sec, out = timed(lambda: generate(target, enc, **common, **kw), args.repeats)
      st = summarize_stats(out)
      row = dict(task=task, setting=name, lenience=l, lossy=l is not None and l < 1.0,
                 seconds=sec, tokens_per_s=st['generated_tokens'] / sec,
                 **st, **quality(task, refs, decode_text(sp, out.tokens)))
      rows.append(row)
      print(json.dumps(row), flush=True)
  for r in rows:
    ar = next(x for x in rows if x['task'] == r['task'] and x['setting'] == 'AR')
    r['speedup_vs_ar'] = ar['seconds'] / r['seconds']
  data = {'command': 'python scripts/lenience_table.py ' + ' '.join(argv or sys.argv[1:]),
          'rows_per_task': args.rows, 'gamma': args.gamma, 'max_len': args.max_len,
          'temperature': 1.0, 'environment': benchmarking.environment(), 'results': rows}
  benchmarking.write_json(args.out + '.json', data)
  lines = ['# Lenience: speed vs quality (l < 1 is LOSSY)', '',
           f'`flock /tmp/specdec_bench.lock {data["command"]}` — demo_target + demo_draft_m, '
           f'gamma {args.gamma}, temperature 1, {args.rows} test rows per task in one batch, '
           f'max_decode_length {args.max_len}, CPU (2 shared cores: walltimes are noisy).', '',
           '| task | setting | exact? | alpha | tokens/call | seconds | speedup vs AR | quality |',
           '|---|---|---|---:|---:|---:|---:|---|']
  for r in rows:
    q = (f"BLEU {r['bleu']:.2f}" if 'bleu' in r else
         ', '.join(f'{k} {r[k]:.2f}' for k in ('rouge1', 'rouge2', 'rougeLsum') if k in r))
    alpha = '-' if r['alpha_empirical'] is None else f"{r['alpha_empirical']:.2f}"
    lines.append(f"| {r['task']} | {r['setting']} | {'**lossy**' if r['lossy'] else 'exact'} | "
                 f"{alpha} | {r['mean_tokens_per_target_call']:.2f} | {r['seconds']:.2f} | "
                 f"{r['speedup_vs_ar']:.2f} | {q} |")
  benchmarking.write_text(args.out + '.md', '\n'.join(lines) + '\n')


if __name__ == '__main__':
  main()
