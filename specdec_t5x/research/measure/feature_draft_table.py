r"""The feature-reading draft head against the small draft model, on the demo family.

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=feature_draft \
      [--num_examples 32] [--timed_examples 24] [--gammas 1,2,3,4,5,6,7]

Run from the repository root on an idle machine. Three parts, one process:

1. Acceptance (deterministic counts, no timing): for each task (ende, summarize),
   temperature (0, 1), draft (--head, demo_draft_m) and gamma, speculative
   decoding of the task's first --num_examples test inputs (batches of 16): alpha =
   accepted / drafted, alpha_1 (the first draft's acceptance), per-position acceptance,
   tokens per target call.
2. Call costs (timing.call_costs, interleaved): a target step, each draft's one-token step
   (c = t_draft / t_target) and the head's gamma + 1 position call (its first call of a step).
3. Walltime speedup by output length (EN->DE, greedy): the --timed_examples inputs split
   into three groups by the autoregressive output's length, each timed by speed.sweep
   (AR and both drafts at --timed_gammas, interleaved, batch 1): measured, ideal and
   efficiency per group, the ideal from call costs timed on the group's own median-length
   input (longer outputs come from longer inputs, and a verify call's cross-attention
   grows with the input); and how many of those outputs' tokens the head's (reduced)
   draft vocabulary covers.

Writes results/feature_draft.{json,md}.
"""

from __future__ import annotations

import jax
import numpy as np
from typing import List
from tqdm import tqdm

from specdec_t5x.algorithm import api, batching, sampling, timing
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.research.measure import evaluation, grid, measurement, speed
from specdec_t5x.research.results import harness

# HEAD: --head's default, the draft of configs/demo.gin
HEAD, DRAFT, TARGET = 'demo_feature_head_kd', 'demo_draft_m', 'demo_target'


def acceptance(target, drafts, tasks, temperatures, gammas, n, max_len, bar):
  rows = []
  for task in tasks:
    enc = batching.pad_batch([e.inputs for e in evaluation.load_examples(task, n)])
    for temp in temperatures:
      cfg = sampling.SamplingConfig(temp)
      for name, draft in drafts[task].items():
        for g in gammas:
          s = speed.speculative_stats(target, draft, enc, cfg, g, max_len)
          per_pos = evaluation.alpha_per_position(s['accepted_length_histogram'])
          rows.append({'task': task, 'temperature': temp, 'draft': name, 'gamma': g,
                       **stats_lib.rates(s),
                       'alpha_1': per_pos[0], 'alpha_per_position': per_pos,
                       'tokens_per_target_call': float(s['generated_tokens'] / s['target_calls'])})
          bar.update(1)
        jax.clear_caches()  # ~60 programs: freeing them keeps the JIT's mappings in bounds
  return rows


def _ratio(cost, name):
  """A call's cost in target steps."""
  return cost[name] / cost['t_target_step']


def by_length(target, drafts, head, n, max_len, gammas, repeats):
  """speed.sweep over three groups of EN->DE inputs split by AR output length, each with
  the call costs of its median-length input (grid.costs at that input's length bucket)."""
  examples = evaluation.load_examples('ende', n)
  enc_all = batching.pad_batch([e.inputs for e in examples])
  ar = api.generate(target, enc_all, max_decode_length=max_len)
  lengths = np.asarray(ar.stats['generated_tokens'])
  ids = drafts[head][0].config.draft_vocab
  tokens = np.asarray(ar.tokens)[np.arange(ar.tokens.shape[1])[None] < lengths[:, None]]
  covered = float(np.isin(tokens, ids).mean()) if ids else 1.0
  order = np.argsort(lengths, kind='stable')
  groups = []
  for part in np.array_split(order, 3):
    enc = batching.pad_batch([examples[i].inputs for i in sorted(part)])
    median = sorted(part, key=lambda i: len(examples[i].inputs))[len(part) // 2]
    row = batching.pad_batch([examples[median].inputs])
    cost = grid.costs(target, drafts, row, gammas, max_len=max_len)
    res = speed.sweep(target, drafts, enc, max_len, gammas, sampling.SamplingConfig(0.0), cost,
                      repeats)
    groups.append({'output_tokens': [int(lengths[part].min()), int(lengths[part].max())],
                   'mean_output_tokens': float(lengths[part].mean()), 'examples': len(part),
                   'cost_input_tokens': len(examples[median].inputs),
                   'cost_bucket': int(batching.trim_batch(row).shape[1]), 'costs_s': cost,
                   'drafts': {k: v['rows'] for k, v in res['drafts'].items()}})
  return groups, covered


def measure(args, script: str) -> dict:
  """The acceptance rows, the call costs and the timed groups by output length."""
  head = args.head
  target = evaluation.load_model(TARGET)
  tasks = ['ende', 'summarize']
  drafts = {t: {head: evaluation.load_model(head, t), DRAFT: evaluation.load_model(DRAFT, t)}
            for t in tasks}
  total = len(tasks) * len(args.temperatures) * 2 * len(args.gammas)
  with tqdm(total=total, desc='acceptance') as bar:
    rows = acceptance(target, drafts, tasks, args.temperatures, args.gammas,
                      args.num_examples, args.max_len, bar)
  enc = batching.pad_batch([e.inputs for e in evaluation.load_examples('ende', 8)])
  cost = grid.costs(target, drafts['ende'], enc, args.timed_gammas, max_len=args.max_len)
  first = {f't_head_first_call_{g + 1}': (*drafts['ende'][head], g + 1) for g in args.timed_gammas}
  cost.update(timing.call_costs(first, batching.trim_batch(enc[:1]), repeats=7,
                                      cache_len=args.max_len + max(args.timed_gammas) + 1))
  groups, covered = by_length(target, drafts['ende'], head, args.timed_examples, args.max_len,
                              args.timed_gammas, args.repeats)
  c = {name: cost[f't_draft_step_{name}'] / cost['t_target_step'] for name in (head, DRAFT)}
  vocab = drafts['ende'][head][0].config.output_vocab_size
  return dict(acceptance=rows, costs_s=cost, c=c, by_length=groups,
              head_output_vocab=vocab, head_vocab_covers_ar_tokens=covered)


def render(report: harness.Report) -> List[str]:
  args, cost, c, groups = report['args'], report['costs_s'], report['c'], report['by_length']
  head, vocab, covered = args['head'], report['head_output_vocab'], report[
      'head_vocab_covers_ar_tokens']
  md = report.header(
      'A draft head that reads the target vs a small draft model (demo family)',
      f'Target {TARGET}; drafts {head} (one layer over the target\'s features, no encoder) '
      f'and {DRAFT} (a 2+2-layer T5). c = one-token draft call / target step: '
      + ', '.join(f'{k} {v:.3f}' for k, v in c.items()) + '; the head\'s first call of a '
      'step (gamma + 1 positions, one kept): ' + ', '.join(
          f"{cost[f't_head_first_call_{g + 1}'] / cost['t_target_step']:.3f} (gamma {g})"
          for g in args['timed_gammas']) + f' target steps. The head\'s logits cover {vocab} '
      f'token ids, {covered:.1%} of the timed inputs\' autoregressive output tokens.')
  md += ['## Acceptance (first %d test inputs per task)' % args['num_examples'], '']
  md += harness.table(
      ['task', 't', 'draft', 'gamma', 'alpha', 'acceptance rate', 'alpha_1',
       'tokens / target call'],
      [[r['task'], r['temperature'], r['draft'], r['gamma'], f"{r['alpha']:.3f}",
        f"{r['acceptance_rate']:.3f}", harness.fmt(r['alpha_1'], '.3f'),
        f"{r['tokens_per_target_call']:.2f}"] for r in report['acceptance']], 'lrlrrrrr')
  md += ['', '## Walltime speedup by output length (EN->DE, greedy, batch 1)', '']
  md += harness.table(
      ['AR output tokens', 'costs at input (bucket)', 'draft', 'gamma', 'tokens / call', 'c',
       'verify / step', 'measured', 'ideal', 'efficiency'],
      [[f"{g['output_tokens'][0]}-{g['output_tokens'][1]} (mean {g['mean_output_tokens']:.1f})",
        f"{g['cost_input_tokens']} ({g['cost_bucket']})", name, r['gamma'],
        f"{r['tokens_per_target_call']:.2f}",
        f"{_ratio(g['costs_s'], 't_draft_step_' + name):.3f}",
        f"{_ratio(g['costs_s'], 't_verify_%d' % (r['gamma'] + 1)):.2f}",
        f"{r['speedup_measured']:.2f}x", f"{r['speedup_ideal']:.2f}x", f"{r['efficiency']:.2f}"]
       for g in groups for name, rs in g['drafts'].items() for r in rs], 'llllrrrrrr')
  md += ['', 'ideal = tokens per call x t_target / (gamma t_draft + t_verify(gamma + 1)) '
         'from the call costs of the group\'s median-length input (its length bucket: the '
         'encoder output every call cross-attends to), speed.sweep; efficiency = measured / '
         'ideal.']
  return md


main = measurement.Measurement(
    'feature_draft', __doc__, measure, render, repeats=3, flags=dict(
        num_examples=32, timed_examples=dict(type=int, default=24),
        gammas=dict(type=harness.ints, default=[1, 2, 3, 4, 5, 6, 7]),
        timed_gammas=dict(type=harness.ints, default=[1, 2],
                          help='gammas of the timed part (1: configs/demo.gin\'s)'),
        temperatures=[0.0, 1.0], max_len=64,
        head=dict(default=HEAD, help='the feature head (a checkpoints/demo model)'))).main
