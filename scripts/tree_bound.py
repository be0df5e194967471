"""The most tokens per target call any static draft tree could give a draft, greedy.

  python scripts/tree_bound.py [--drafts=demo_draft_m,demo_draft_s] [--tasks=ende,summarize]
      [--num_examples=64] [--max_len=48] [--max_nodes=8]

For each task: the demo target's greedy outputs for the first --num_examples test inputs,
each draft teacher-forced on them, the rank of every target token among the draft's
choices (specdec_t5x/research/tree_bound.py), and from those ranks, at n = 1..--max_nodes
draft nodes (n + 1 verified positions): the expected tokens per target call of the chain of
gamma = n, of the best chain with leaf siblings (what draft_siblings verifies) and of the
best static tree of n nodes, with the trees' shapes. No timing. Writes
results/tree_bound.{json,md}.
"""

from __future__ import annotations

import json
import os
from typing import List

from tqdm import tqdm

from specdec_t5x.algorithm import batching, sampling
from specdec_t5x.research import evaluation, harness, tree_bound

MEASURED = os.path.join(os.path.dirname(harness.results_path(__file__, 'x')), 'tree.json')


def measure(args) -> dict:
  target = evaluation.load_model('demo_target')
  cells = []
  jobs = [(task, d) for task in args.tasks.split(',') for d in args.drafts.split(',')]
  bar = tqdm(total=len(jobs), desc='ranks', unit='pair')
  for task in args.tasks.split(','):
    examples = evaluation.load_examples(task, args.num_examples)
    enc = batching.pad_batch([e.inputs for e in examples], args.max_input_len)
    outputs = evaluation.target_outputs(target, enc, sampling.SamplingConfig(),
                                        args.max_len)
    for name in args.drafts.split(','):
      rows = tree_bound.ranks(target, evaluation.load_model(name, task), enc, outputs)
      shares = tree_bound.path_shares(rows, args.max_nodes)
      by_nodes = []
      for n in range(1, args.max_nodes + 1):
        trees = {'chain': tree_bound.chain(n),
                 'chain_with_siblings': tree_bound.best_chain_with_siblings(shares, n),
                 'best_tree': tree_bound.best_tree(shares, n)}
        by_nodes.append({'nodes': n, **{
            k: {'tokens_per_call': 1.0 + tree_bound.tree_value(shares, v),
                'shape': [list(p) for p in v]} for k, v in trees.items()}})
      cells.append({'task': task, 'draft': name, 'examples': len(outputs),
                    'tokens': int(sum(map(len, rows))),
                    'rank_shares': {str(r): float(shares.get((r,), 0.0)) for r in range(4)},
                    'by_nodes': by_nodes})
      bar.update(1)
  bar.close()
  return {'cells': cells, 'measured_chains': _measured()}


def _measured() -> List[dict]:
  """The greedy chains' measured tokens per call (results/tree.json), when present."""
  if not os.path.exists(MEASURED):
    return []
  rows = json.load(open(MEASURED))['results']
  return [{'task': r['task'], 'gamma': r['verified_positions'] - 1,
           'tokens_per_call': r['mean_tokens_per_target_call']} for r in rows
          if r['temperature'] == 0 and r['decode'].startswith('g') and '+' not in r['decode']]


def _shape(paths) -> str:
  return ' '.join('.'.join(map(str, p)) for p in paths)


def render(report: harness.Report) -> List[str]:
  lines = report.header(
      'The best a static draft tree could do, greedy (teacher-forced ranks)',
      'rank: where the target\'s greedy token stands among the draft\'s choices on the '
      'target\'s prefix (0: the draft\'s pick). A greedy step starting at a position '
      'accepts the longest tree path whose ranks follow; tokens per call = 1 + the '
      'expected accepted tokens, over steps starting at every position. nodes: draft '
      'tokens verified (positions = nodes + 1). chain + siblings: the best chain with the '
      'draft\'s runner-ups as leaves (draft_siblings); best tree: the nodes of largest '
      'share, the bound for every static tree. Shapes: each node\'s ranks from the root.')
  for c in report['cells']:
    lines += [f"## {c['task']}, {c['draft']} ({c['examples']} inputs, {c['tokens']} "
              f"target tokens; rank 0 / 1 / 2 / 3: " + ' / '.join(
                  f'{v:.2f}' for v in c['rank_shares'].values()) + ')', '']
    rows = []
    for b in c['by_nodes']:
      chain = b['chain']['tokens_per_call']
      rows.append([b['nodes'], f'{chain:.2f}',
                   f"{b['chain_with_siblings']['tokens_per_call']:.2f}",
                   f"{b['chain_with_siblings']['tokens_per_call'] / chain:.3f}",
                   f"{b['best_tree']['tokens_per_call']:.2f}",
                   f"{b['best_tree']['tokens_per_call'] / chain:.3f}",
                   _shape(b['best_tree']['shape'])])
    lines += harness.table(['nodes', 'chain', 'chain + siblings', 'vs chain', 'best tree',
                            'vs chain', 'best tree\'s nodes'], rows) + ['']
  measured = report['measured_chains']
  if measured:
    lines += ['Measured greedy chains (results/tree.json, steps as a decode takes them): ' +
              ', '.join(f"{m['task']} g{m['gamma']} {m['tokens_per_call']:.2f}"
                        for m in measured) + '.', '']
  return lines


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'tree_bound'))
  ap.add_argument('--drafts', default='demo_draft_m,demo_draft_s')
  ap.add_argument('--tasks', default='ende,summarize')
  ap.add_argument('--num_examples', type=int, default=64)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--max_input_len', type=int, default=128)
  ap.add_argument('--max_nodes', type=int, default=8)
  args = ap.parse_args(argv)
  report = harness.Report(__file__, args, argv)
  report.data.update(measure(args))
  print(report.write(render(report)))
  return report.data


if __name__ == '__main__':
  main()
