"""The most tokens per target call static draft trees could give a draft, greedy.

  python scripts/tree_bound.py [--drafts=demo_draft_m,demo_draft_s] [--tasks=ende,summarize]
      [--num_examples=64] [--max_len=48] [--max_nodes=8] [--search_nodes=5]

For each task: the demo target's greedy outputs for the first --num_examples test inputs,
each draft teacher-forced on them, the rank of every target token among the draft's
choices (specdec_t5x/research/tree_bound.py), and from those ranks, at n = 1..--max_nodes
draft nodes (n + 1 verified positions), the tokens per target call that greedy decoding
verifying each tree would get (replayed step by step: exact, no decoding) for the chain of
gamma = n, the best chain with leaf siblings (what draft_siblings verifies), the best tree
for steps starting anywhere, (n <= --search_nodes) the best tree in decode order among
those made of the 12 most frequent paths, with the trees' shapes, and an upper bound for
EAGLE-2's dynamic trees of n nodes. No timing. Writes
results/tree_bound.{json,md}.
"""

from __future__ import annotations

import json
import os
from typing import List

from tqdm import tqdm

from specdec_t5x.algorithm import batching, sampling
from specdec_t5x.research import evaluation, harness, tree_bound

MEASURED = harness.results_path(__file__, 'tree') + '.json'  # its greedy chains, replayed


def measure(args) -> dict:
  target = evaluation.load_model('demo_target')
  measured, cells = _measured(), []
  jobs = [(task, d) for task in args.tasks.split(',') for d in args.drafts.split(',')]
  bar = tqdm(total=len(jobs), desc='ranks', unit='pair')
  for task in args.tasks.split(','):
    examples = evaluation.load_examples(task, args.num_examples)
    enc = batching.pad_batch([e.inputs for e in examples], args.max_input_len)
    outputs = evaluation.target_outputs(target, enc, sampling.SamplingConfig(),
                                        args.max_len)
    for name in args.drafts.split(','):
      seen = tree_bound.views(evaluation.load_model(name, task), enc, outputs)
      rows = [v.ranks for v in seen]
      shares = tree_bound.path_shares(rows, args.max_nodes)
      by_nodes = []
      for n in range(1, args.max_nodes + 1):
        trees = {'chain': tree_bound.chain(n),
                 'chain_with_siblings': tree_bound.best_chain_with_siblings(shares, n),
                 'best_tree': tree_bound.best_tree(shares, n)}
        if n <= args.search_nodes:
          trees['searched'] = tree_bound.best_decoded_tree(rows, shares, n)
        by_nodes.append({'nodes': n, **{
            k: {'tokens_per_call': tree_bound.decode_value(rows, v),
                'tokens_per_call_any_start': 1.0 + tree_bound.tree_value(shares, v),
                'shape': [list(p) for p in v]} for k, v in trees.items() if v},
                         'dynamic_bound': {'tokens_per_call': tree_bound.dynamic_value(seen, n)}})
      replayed = (_replayed(measured, task, rows, args.max_len)
                  if name == 'demo_draft_m' else [])  # the draft results/tree.json ran
      cells.append({'task': task, 'draft': name, 'examples': len(outputs),
                    'measured_chains': replayed,
                    'tokens': int(sum(map(len, rows))),
                    'rank_shares': {str(r): float(shares.get((r,), 0.0)) for r in range(4)},
                    'by_nodes': by_nodes})
      bar.update(1)
  bar.close()
  return {'cells': cells}


def _measured() -> dict:
  """The greedy chains that results/tree.json measured with demo_draft_m, and its rows and
  max_len ({} when it is missing)."""
  if not os.path.exists(MEASURED):
    return {}
  data = json.load(open(MEASURED))
  chains = [{'task': r['task'], 'gamma': r['verified_positions'] - 1,
             'tokens_per_call': r['mean_tokens_per_target_call']} for r in data['results']
            if r['temperature'] == 0 and r['decode'].startswith('g') and '+' not in r['decode']]
  return {'rows': data['settings']['rows'], 'max_len': data['settings']['max_len'],
          'chains': chains}


def _replayed(measured: dict, task: str, rows, max_len: int) -> List[dict]:
  """The measured chains of `task` beside their replay over the same first rows."""
  if not measured or measured['max_len'] != max_len or len(rows) < measured['rows']:
    return []
  return [dict(m, replayed=tree_bound.decode_value(rows[:measured['rows']],
                                                    tree_bound.chain(m['gamma'])))
          for m in measured['chains'] if m['task'] == task]


def _shape(paths) -> str:
  return ' '.join('.'.join(map(str, p)) for p in paths)


def render(report: harness.Report) -> List[str]:
  lines = report.header(
      'Static draft trees against the chain, greedy (teacher-forced ranks)',
      'rank: where the target\'s greedy token stands among the draft\'s choices on the '
      'target\'s prefix (0: the draft\'s pick). Tokens per call: greedy decoding that '
      'verifies the tree at every step, replayed step by step over the ranks (exact: '
      'replayed chains equal measured decodes, below). nodes: draft tokens verified (positions '
      '= nodes + 1). chain + siblings: the best chain with the draft\'s runner-ups as '
      'leaves (draft_siblings); top-share tree: the nodes most often on the target\'s '
      'path from a start anywhere (the best static tree for such starts); searched: the '
      'best in decode order of the trees made of the 12 most frequent paths; dynamic '
      '(bound): EAGLE-2\'s rule, each step\'s n nodes of largest draft path probability, '
      'counting as rivals only the siblings of the target\'s path (an upper bound for that '
      'rule). x: over the chain. Shapes: each node\'s ranks from the root.')
  for c in report['cells']:
    lines += [f"## {c['task']}, {c['draft']} ({c['examples']} inputs, {c['tokens']} "
              f"target tokens; rank 0 / 1 / 2 / 3: " + ' / '.join(
                  f'{v:.2f}' for v in c['rank_shares'].values()) + ')', '']
    rows = []
    for b in c['by_nodes']:
      chain = b['chain']['tokens_per_call']
      cell = lambda k: (f"{b[k]['tokens_per_call']:.2f} "
                        f"({b[k]['tokens_per_call'] / chain:.3f}x)" if k in b else '-')
      rows.append([b['nodes'], f'{chain:.2f}', cell('chain_with_siblings'), cell('best_tree'),
                   cell('searched'), _shape(b.get('searched', b['best_tree'])['shape']),
                   cell('dynamic_bound')])
    lines += harness.table(['nodes', 'chain', 'chain + siblings', 'top-share tree',
                            'searched', 'best static tree\'s nodes', 'dynamic (bound)'],
                           rows) + ['']
    if c['measured_chains']:
      lines += ['The chain replayed on the first inputs of results/tree.md against its '
                'measured decodes: ' + ', '.join(
                    f"g{m['gamma']} {m['replayed']:.2f} vs {m['tokens_per_call']:.2f}"
                    for m in c['measured_chains']) + '.', '']
  return lines


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'tree_bound'))
  ap.add_argument('--drafts', default='demo_draft_m,demo_draft_s')
  ap.add_argument('--tasks', default='ende,summarize')
  ap.add_argument('--num_examples', type=int, default=64)
  ap.add_argument('--max_len', type=int, default=48)
  ap.add_argument('--max_input_len', type=int, default=128)
  ap.add_argument('--max_nodes', type=int, default=8)
  ap.add_argument('--search_nodes', type=int, default=5)
  args = ap.parse_args(argv)
  report = harness.Report(__file__, args, argv)
  report.data.update(measure(args))
  print(report.write(render(report)))
  return report.data


if __name__ == '__main__':
  main()
