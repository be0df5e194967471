"""Lenience (the paper's LOSSY relaxation): speed, alpha and quality as l goes 1 -> 0.1.

  flock /tmp/specdec_bench.lock python scripts/lenience_table.py [--rows=32] [--max_len=48] \
      [--gamma=4] [--repeats=2] [--tasks=ende,summarize]

demo_target + demo_draft_m, gamma 4, temperature 1, token verifier; all `rows` test rows
of each demo task in one batch (same rng for every l), AR and each l timed interleaved
(median of --repeats). Quality: BLEU (ende) or ROUGE (summarize) against the references.
Rows with l < 1 are marked lossy: their outputs no longer follow the target's
distribution. Writes results/lenience.{json,md}.
"""

from __future__ import annotations

import json

import jax

from specdec_t5x.algorithm import api, batching, stats
from specdec_t5x.research import demo_data, evaluation, harness


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'lenience'), repeats=2)
  ap.add_argument('--rows', type=int, default=32)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--gamma', type=int, default=4)
  ap.add_argument('--tasks', default='ende,summarize')
  args = ap.parse_args(argv)
  target, draft = evaluation.load_model('demo_target'), evaluation.load_model('demo_draft_m')
  common = dict(temperature=1.0, max_decode_length=args.max_len, rng=jax.random.PRNGKey(0))
  settings = {'AR': None, **{f'l={l}': l for l in (1.0, 0.5, 0.3, 0.1)}}
  rows = []
  for task in args.tasks.split(','):
    enc, refs, sp = demo_data.load_task(task, args.rows)
    enc = batching.trim_batch(enc)  # the batch at its length bucket

    def decode(l, enc=enc):
      kw = {} if l is None else dict(draft=draft, gamma=args.gamma, lenience=l)
      return lambda: api.generate(target, enc, **common, **kw)
    timings = harness.interleaved({name: decode(l) for name, l in settings.items()},
                                  args.repeats)
    for name, l in settings.items():
      sec, out = timings.median[name], timings.outputs[name]
      st = stats.summarize(out.stats)
      rows.append(dict(task=task, setting=name, lenience=l, lossy=l is not None and l < 1.0,
                       seconds=sec, tokens_per_s=st['generated_tokens'] / sec,
                       speedup_vs_ar=timings.median['AR'] / sec, **st,
                       **demo_data.quality(task, refs, demo_data.texts(sp, out.tokens))))
      print(json.dumps(rows[-1]), flush=True)
  report = harness.Report(__file__, args, argv)
  report.data.update(rows_per_task=args.rows, gamma=args.gamma, max_len=args.max_len,
                     temperature=1.0, results=rows)
  quality = lambda r: (f"BLEU {r['bleu']:.2f}" if 'bleu' in r else ', '.join(
      f'{k} {r[k]:.2f}' for k in ('rouge1', 'rouge2', 'rougeLsum') if k in r))
  report.write(report.header(
      'Lenience: speed vs quality (l < 1 is LOSSY)',
      f'demo_target + demo_draft_m, gamma {args.gamma}, temperature 1, {args.rows} test rows '
      f'per task in one batch, max_decode_length {args.max_len}, median of {args.repeats} '
      'interleaved repeats.') +
      harness.table(['task', 'setting', 'exact?', 'alpha', 'tokens/call', 'seconds',
                     'speedup vs AR', 'quality'],
                    [[r['task'], r['setting'], '**lossy**' if r['lossy'] else 'exact',
                      harness.fmt(r['alpha_empirical']), f"{r['mean_tokens_per_target_call']:.2f}",
                      f"{r['seconds']:.2f}", f"{r['speedup_vs_ar']:.2f}", quality(r)]
                     for r in rows], 'lllrrrrl'))


if __name__ == '__main__':
  main()
