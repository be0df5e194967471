"""The most tokens per target call static draft trees could give a draft, greedy.

  python scripts/compare_decodes.py --experiment=tree_bound \
      [--drafts=demo_draft_m,demo_draft_s] [--tasks=ende,summarize] [--ngram=bigram] \
      [--num_examples=64] [--max_len=48] [--max_nodes=8] [--search_nodes=5]

For each task: the demo target's greedy outputs for the first --num_examples test inputs,
each draft teacher-forced on them, the rank of every target token among the draft's
choices (specdec_t5x/research/measure/tree_bound.py), and from those ranks, at n = 1..--max_nodes
draft nodes (n + 1 verified positions), the tokens per target call that greedy decoding
verifying each tree would get (replayed step by step: exact, no decoding) for the chain of
gamma = n, the best chain with leaf siblings (what draft_siblings verifies), the best tree
for steps starting anywhere, (n <= --search_nodes) the best tree in decode order among
those made of the 12 most frequent paths, with the trees' shapes, an upper bound for
EAGLE-2's dynamic trees of n nodes, the best chain with a copy branch (copy_branch), and
the best mixed tree of the three kinds of draft: the chain, a copy branch and the --ngram
table's greedy continuation (fixed guesses beside them, as a copy branch is verified), with
that continuation alone (the n-gram's chain). No timing. Writes
results/tree_bound.{json,md}.
"""

from __future__ import annotations

import json
import os
from typing import List

import numpy as np
from tqdm import tqdm

from specdec_t5x.algorithm import batching, sampling
from specdec_t5x.research.measure import compare, evaluation, measurement, tree_bound
from specdec_t5x.research.results import harness


def measure(args, script: str) -> dict:
  """The cells of every (task, draft), with results/tree.json's (beside the entry point
  `script`) greedy decodes replayed beside them."""
  target = evaluation.load_model('demo_target')
  measured, cells = _measured(harness.results_path(script, 'tree') + '.json'), []
  jobs = [(task, d) for task in args.tasks.split(',') for d in args.drafts.split(',')]
  bar = tqdm(total=len(jobs), desc='ranks', unit='pair')
  for task in args.tasks.split(','):
    examples = evaluation.load_examples(task, args.num_examples)
    enc = batching.pad_batch([e.inputs for e in examples], args.max_input_len)
    outputs = evaluation.target_outputs(target, enc, sampling.SamplingConfig(),
                                        args.max_len)
    copied = [tree_bound.copy_runs(e, o, args.max_nodes, args.max_len)  # any draft's
              for e, o in zip(enc, outputs)]
    picked = tree_bound.ranks(evaluation.load_model(args.ngram, task), enc, outputs)
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
                         'dynamic_bound': {'tokens_per_call': tree_bound.dynamic_value(seen, n)},
                         'chain_with_copy': _with_copy(rows, copied, n),
                         'mixed': _mixed(rows, copied, picked, n)})
      replayed = (_replayed(measured, task, rows, copied, args.max_len)
                  if name == 'demo_draft_m' else [])  # the draft results/tree.json ran
      cells.append({'task': task, 'draft': name, 'examples': len(outputs),
                    'measured_decodes': replayed,
                    'tokens': int(sum(map(len, rows))),
                    'rank_shares': {str(r): float(shares.get((r,), 0.0)) for r in range(4)},
                    'by_nodes': by_nodes})
      bar.update(1)
  bar.close()
  return {'cells': cells}


def _with_copy(rows, copied, n: int) -> dict:
  """The best split of n nodes between the draft's chain (gamma >= 1) and a copy branch
  (>= 1 token), and the copy branch alone, replayed."""
  runs = lambda c: [np.minimum(r, c) for r in copied]
  splits = {g: tree_bound.decode_value(rows, tree_bound.chain(g), runs(n - g))
            for g in range(1, n)}
  gamma = max(splits, key=splits.get) if splits else None
  return {'tokens_per_call': splits[gamma] if splits else None, 'gamma': gamma,
          'copy_branch': n - gamma if splits else None,
          'copy_alone': tree_bound.decode_value(rows, [], runs(n))}


def _mixed(rows, copied, picked, n: int) -> dict:
  """The best split of n nodes between the draft's chain (gamma >= 1), a copy branch
  (>= 0 tokens) and the n-gram's greedy continuation (>= 1 token), all from the root, and
  that continuation of n tokens alone, replayed."""
  runs = lambda c, b: [np.maximum(np.minimum(r, c), tree_bound.pick_runs(p, b))
                       for r, p in zip(copied, picked)]
  splits = {(g, n - g - b, b): tree_bound.decode_value(rows, tree_bound.chain(g),
                                                       runs(n - g - b, b))
            for g in range(1, n) for b in range(1, n - g + 1)}
  best = max(splits, key=splits.get) if splits else None
  return {'tokens_per_call': splits[best] if best else None,
          'split': dict(zip(('gamma', 'copy_branch', 'ngram_branch'), best)) if best else None,
          'ngram_alone': tree_bound.decode_value(picked, tree_bound.chain(n))}


def _measured(path: str) -> dict:
  """The greedy decodes that results/tree.json (`path`) measured with its default draft, and
  its rows and max_len ({} when it is missing)."""
  if not os.path.exists(path):
    return {}
  data = json.load(open(path))
  decodes = [{'task': r['task'], 'decode': r['decode'],
              'tokens_per_call': r['mean_tokens_per_target_call']} for r in data['results']
             if r['temperature'] == 0 and r['decode'] != 'AR' and '@' not in r['decode']]
  return {'rows': data['settings']['rows'], 'max_len': data['settings']['max_len'],
          'decodes': decodes}


def _replayed(measured: dict, task: str, rows, copied, max_len: int) -> List[dict]:
  """The measured decodes of `task` beside their replay over the same first rows."""
  if not measured or measured['max_len'] != max_len or len(rows) < measured['rows']:
    return []
  out = []
  for m in measured['decodes']:
    if m['task'] != task:
      continue
    settings, _ = compare.parse_decode(m['decode'])
    nodes = tree_bound.siblings(settings['gamma'], settings.get('draft_siblings', ()))
    c = settings.get('copy_branch', 0)
    first = slice(0, measured['rows'])
    runs = [np.minimum(r, c) for r in copied[first]] if c else None
    out.append(dict(m, replayed=tree_bound.decode_value(rows[first], nodes, runs)))
  return out


def _shape(paths) -> str:
  return ' '.join('.'.join(map(str, p)) for p in paths)


def render(report: harness.Report) -> List[str]:
  lines = report.header(
      'Draft trees against the chain, greedy, replayed from teacher-forced ranks',
      'rank: where the target\'s greedy token stands among the draft\'s choices on the '
      'target\'s prefix (0: the draft\'s pick). Tokens per call: greedy decoding that '
      'verifies the tree at every step, replayed step by step over the ranks (exact: the '
      'replayed decodes equal the measured ones, below). nodes: draft tokens verified '
      '(positions = nodes + 1). chain + siblings: the best chain with the draft\'s runner-ups as '
      'leaves (draft_siblings); top-share tree: the nodes most often on the target\'s '
      'path from a start anywhere (the best static tree for such starts); searched: the '
      'best in decode order of the trees made of the 12 most frequent paths; dynamic '
      '(bound): EAGLE-2\'s rule, each step\'s n nodes of largest draft path probability, '
      'counting as rivals only the siblings of the target\'s path (an upper bound for that '
      'rule); chain + copy: the best split of the nodes between the draft\'s chain and a '
      'copy branch (prompt lookup, copy_branch), replayed alike; copy alone: the copy '
      'branch of all n nodes; chain + copy + n-gram: the best split of the nodes between '
      'the draft\'s chain, a copy branch and the n-gram table\'s greedy continuation '
      f"({report['args']['ngram']}; fixed guesses beside the chain, as a copy branch), "
      'replayed alike (g: chain, c: copy, b: n-gram tokens); n-gram alone: its continuation '
      'of n tokens, the n-gram\'s chain. x: over the chain. Shapes: each node\'s ranks from '
      'the root.')
  for c in report['cells']:
    lines += [f"## {c['task']}, {c['draft']} ({c['examples']} inputs, {c['tokens']} "
              f"target tokens; rank 0 / 1 / 2 / 3: " + ' / '.join(
                  f'{v:.2f}' for v in c['rank_shares'].values()) + ')', '']
    rows = []
    for b in c['by_nodes']:
      chain = b['chain']['tokens_per_call']
      cell = lambda k: (f"{b[k]['tokens_per_call']:.2f} "
                        f"({b[k]['tokens_per_call'] / chain:.3f}x)" if k in b else '-')
      mixed = b['chain_with_copy']
      rows.append([b['nodes'], f'{chain:.2f}', cell('chain_with_siblings'), cell('best_tree'),
                   cell('searched'), _shape(b.get('searched', b['best_tree'])['shape']),
                   cell('dynamic_bound'),
                   f"{mixed['tokens_per_call']:.2f} (g{mixed['gamma']}+c{mixed['copy_branch']}, "
                   f"{mixed['tokens_per_call'] / chain:.3f}x)" if mixed['gamma'] else '-',
                   f"{mixed['copy_alone']:.2f}", _mixed_cell(b.get('mixed'), chain),
                   f"{b['mixed']['ngram_alone']:.2f}" if 'mixed' in b else '-'])
    lines += harness.table(['nodes', 'chain', 'chain + siblings', 'top-share tree',
                            'searched', 'its nodes (else top-share\'s)', 'dynamic (bound)',
                            'chain + copy', 'copy alone', 'chain + copy + n-gram',
                            'n-gram alone'], rows) + ['']
    if c['measured_decodes']:
      lines += ['Replayed on the first inputs of results/tree.md against its measured '
                'decodes (tokens per call): ' + ', '.join(
                    f"{m['decode']} {m['replayed']:.2f} vs {m['tokens_per_call']:.2f}"
                    for m in c['measured_decodes']) + '.', '']
  return lines


def _mixed_cell(mixed, chain: float) -> str:
  if not mixed or not mixed['split']:
    return '-'
  s = mixed['split']
  return (f"{mixed['tokens_per_call']:.2f} (g{s['gamma']}+c{s['copy_branch']}+"
          f"b{s['ngram_branch']}, {mixed['tokens_per_call'] / chain:.3f}x)")


main = measurement.Measurement('tree_bound', __doc__, measure, render, flags=dict(
    drafts='demo_draft_m,demo_draft_s', tasks='ende,summarize',
    ngram=dict(default='bigram', choices=evaluation.NGRAMS,
               help="the n-gram table (checkpoints/demo/<ngram>_<task>.npz) whose greedy "
               "continuation is the mixed trees' third branch"),
    num_examples=64, max_len=48, max_input_len=128, max_nodes=dict(type=int, default=8),
    search_nodes=dict(type=int, default=5))).main
