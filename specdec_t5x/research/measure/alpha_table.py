"""alpha of each draft for the demo target, the paper's way (Table 3), plus empirical rates.

  python scripts/compare_decodes.py --experiment=alpha_demo    # 10K tokens per cell
  python scripts/compare_decodes.py --experiment=alpha_demo --num_tokens 2000 \
      --spec_examples 32                                      # results/alpha_demo.*

For each task (ende, summarize) and sampling (t=0, t=1): decodes test inputs with the
demo target alone until --num_tokens target tokens exist, teacher-forces the target and
each draft (demo_draft_m, demo_draft_s, unigram, bigram) on those tokens, and reports
alpha = mean_t sum_x min(p_t, q_t) of the distributions standardised alike
(sampling.standardize), with a histogram of the per-token beta_t. From a real speculative
run (gamma --gamma, --spec_examples inputs) it also reports the empirical acceptance
rate accepted/drafted and alpha per draft position i = P(draft i accepted | 1..i-1 were).
Writes results/alpha_demo.json and results/alpha_demo.md.
"""

from __future__ import annotations

from typing import List

import numpy as np
from tqdm import tqdm

from specdec_t5x.algorithm import batching, sampling
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.research.measure import evaluation, measurement, speed
from specdec_t5x.research.results import harness


def measure(args, script: str) -> dict:
  """The alpha cells of every (task, temperature, draft)."""
  target = evaluation.load_model(args.target)
  cells = []
  jobs = [(t, temp) for t in args.tasks.split(',') for temp in args.temperatures]
  bar = tqdm(total=len(jobs) * len(args.drafts.split(',')), desc='alpha', unit='pair')
  for task, temp in jobs:
    cfg = sampling.SamplingConfig(temp, args.topk, args.topp)
    examples = evaluation.load_examples(task, max_input_len=args.max_input_len)
    enc = batching.pad_batch([e.inputs for e in examples], args.max_input_len)
    # Target outputs until num_tokens: inputs in order, another pass (new seed) if short.
    outputs, rows, passes = [], [], 0
    while sum(map(len, outputs)) < args.num_tokens and passes < args.max_passes:
      for start in range(0, len(enc), args.batch):
        chunk = enc[start:start + args.batch]
        outputs += evaluation.target_outputs(target, chunk, cfg, args.max_len,
                                             seed=args.seed + 1000 * passes + start,
                                             batch=args.batch)
        rows += list(chunk)
        if sum(map(len, outputs)) >= args.num_tokens:
          break
      passes += 1
      if cfg.greedy:
        break  # greedy outputs repeat on a second pass
    rows = np.stack(rows)
    spec_enc = enc[:args.spec_examples]
    for name in args.drafts.split(','):
      draft = evaluation.load_model(name, task)
      beta = evaluation.betas(target, draft, rows, outputs, cfg, args.batch)[:args.num_tokens]
      stats = speed.speculative_stats(target, draft, spec_enc, cfg, args.gamma,
                                           args.max_len, seed=args.seed)
      hist, edges = np.histogram(beta, bins=args.bins, range=(0.0, 1.0))
      cells.append({
          'task': task, 'target': args.target, 'draft': name, 'temperature': temp,
          'alpha': float(beta.mean()), 'alpha_stderr': float(beta.std() / np.sqrt(beta.size)),
          'num_tokens': int(beta.size), 'num_sequences': len(outputs),
          'beta_histogram': {'counts': hist.tolist(), 'edges': edges.tolist()},
          'speculative': {
              'gamma': args.gamma, 'examples': len(spec_enc),
              **stats_lib.rates(stats),
              'alpha_per_position': evaluation.alpha_per_position(
                  stats['accepted_length_histogram']),
              'accepted_length_histogram': stats['accepted_length_histogram'].tolist(),
              'tokens_per_target_call': float(stats['generated_tokens'] /
                                              stats['target_calls']),
              **{k: int(stats[k]) for k in ('target_calls', 'drafted_tokens',
                                            'accepted_tokens', 'generated_tokens')}}})
      bar.update(1)
  bar.close()
  return {'cells': cells}


def render(report: harness.Report) -> List[str]:
  cells = report['cells']
  lines = report.header(
      'alpha of the demo family (paper Table 3 method)',
      'alpha = mean over target-generated tokens of sum_x min(p, q), p and q standardised '
      'alike (t=0: one-hot argmax, so beta = 1 iff the argmaxes agree). In the loop: the '
      'same beta measured by real speculative runs at the drafts they verified; acceptance '
      f"rate: accepted/drafted tokens of those runs (gamma {report['args']['gamma']}); "
      'alpha_i: P(draft i accepted | drafts 1..i-1 accepted).',
      'These alphas describe the small demo family (quality: results/demo_models.md), '
      'not T5-XXL. The drafts were distilled from the target (checkpoints/demo/README.md).')
  lines += harness.table(
      ['Target', 'Draft', 'Task', 'Sampling', 'alpha', 'tokens', 'alpha in the loop',
       'acceptance rate', 'alpha_1..alpha_g'],
      [[c['target'], c['draft'], c['task'], f"t={c['temperature']:g}", f"{c['alpha']:.2f}",
        c['num_tokens'], f"{c['speculative']['alpha']:.2f}",
        f"{c['speculative']['acceptance_rate']:.2f}",
        ' '.join(harness.fmt(a) for a in c['speculative']['alpha_per_position'])]
       for c in cells])
  lines += ['', f"## beta histograms ({report['args']['bins']} bins over [0, 1])", '']
  return lines + harness.table(
      ['Draft', 'Task', 'Sampling', 'counts'],
      [[c['draft'], c['task'], f"t={c['temperature']:g}",
        ' '.join(map(str, c['beta_histogram']['counts']))] for c in cells])


main = measurement.Measurement(
    'alpha_demo', __doc__, measure, render, flags=dict(
        target='demo_target', drafts='demo_draft_m,demo_draft_s,unigram,bigram',
        tasks='ende,summarize', temperatures='0,1', max_len=64, max_input_len=128, gamma=4,
        batch=16, seed=0, topk=dict(type=int, default=0), topp=dict(type=float, default=0.0),
        num_tokens=dict(type=int, default=10000),
        max_passes=dict(type=int, default=8, help='sampling passes over the inputs'),
        spec_examples=dict(type=int, default=32), bins=dict(type=int, default=10))).main
