"""Draft trees at the paper's sizes, predicted: the demo's measured tokens per target call
(results/tree.json: chains and trees decoded side by side) with the call costs that the
compiled programs of T5 v1.1 give on an accelerator (research/compiled_costs.py).

For each decode of the tree results, on each chip and device count, with the paper's
T5-small draft and T5-XXL target:

  speedup over AR = tokens per target call x t_step / (t_verify + draft calls x t_draft)

where t_step and t_draft are the target's and the draft's one-token steps, and t_verify
the target's call over the decode's verified positions: `step_<k>` for a chain of k
positions, `tree_<k>` for a tree of k nodes (the same call with the tree's attention
layout), `step_1` for AR. It is the paper's cost model (Table 2's predictions) with the
acceptance measured rather than assumed i.i.d.; the drafts' and targets' acceptance is the
demo family's, not the paper's models', so the rows compare chains with trees, they do
not predict the paper's numbers.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from specdec_t5x.research import harness, paper

DRAFT = 'small'  # the paper's draft of the design card (configs/spec_t5_small_xxl.gin)
FIELDS = ('task', 'temperature', 'decode', 'verified_positions', 'draft_calls',
          'mean_tokens_per_target_call')


def load(path: str) -> Optional[Dict[str, Any]]:
  """{'source': path, 'revision', 'draft': DRAFT, 'rows': the decodes} of a tree results
  file (scripts/compare_decodes.py --experiment=tree), None where there is none."""
  file = pathlib.Path(path)
  if not file.exists():
    return None
  data = json.loads(file.read_text())
  return {'source': path, 'revision': data['environment']['git_revision'], 'draft': DRAFT,
          'rows': data['results']}


def is_tree(row: Mapping[str, Any]) -> bool:
  """A decode verifies a tree when it verifies more positions than its chain's draft
  calls and the root (copy branches and siblings cost no draft call)."""
  return row['verified_positions'] > row['draft_calls'] + 1


def call_sizes(rows: Sequence[Mapping[str, Any]]) -> Tuple[List[int], List[int]]:
  """The target calls the rows need compiled: (chain positions k > 1, tree sizes)."""
  chains = sorted({r['verified_positions'] for r in rows
                   if r['verified_positions'] > 1 and not is_tree(r)})
  trees = sorted({r['verified_positions'] for r in rows if is_tree(r)})
  return chains, trees


def verify_program(row: Mapping[str, Any]) -> str:
  k = row['verified_positions']
  return f'tree_{k}' if is_tree(row) else f'step_{k}'


def predict(call_seconds: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
            target: str = paper.TARGET, draft: str = DRAFT) -> List[Dict[str, Any]]:
  """Each row's fields (FIELDS) with {'<chip> x<n>': {verify_ratio, speedup_vs_ar,
  speedup_vs_best_chain}}; the best chain is the fastest predicted chain (AR included) of
  the same task and temperature on the same chip."""
  out = [dict({k: r[k] for k in FIELDS}, tree=is_tree(r), predicted={}) for r in rows]
  for n, chips in call_seconds.items():
    for chip, t in chips.items():
      key = f'{chip} x{n}'
      t_step, t_draft = t[target]['step_1'], t[draft]['step_1']
      for r in out:
        t_verify = t[target][verify_program(r)]
        cost = t_verify + r['draft_calls'] * t_draft
        r['predicted'][key] = {'verify_ratio': t_verify / t_step,
                               'speedup_vs_ar': r['mean_tokens_per_target_call'] * t_step / cost}
      for r in out:
        same = [o['predicted'][key]['speedup_vs_ar'] for o in out if not o['tree']
                and (o['task'], o['temperature']) == (r['task'], r['temperature'])]
        r['predicted'][key]['speedup_vs_best_chain'] = (
            r['predicted'][key]['speedup_vs_ar'] / max(same))
  return out


def lines(trees: Mapping[str, Any], keys: Sequence[str] = ('TPU v4 x1', 'H200 x1')) -> List[str]:
  """The report's section: one row per decode, the predicted speedups on `keys`."""
  if not trees:
    return []
  head = ['task', 't', 'decode', 'positions', 'tokens/call (demo)', 'draft calls']
  for key in keys:
    head += [f'{key}: verify/step', f'{key}: vs AR', f'{key}: vs best chain']
  rows = []
  for r in trees['rows']:
    cells = [r['task'], f"{r['temperature']:g}", r['decode'], r['verified_positions'],
             f"{r['mean_tokens_per_target_call']:.2f}", r['draft_calls']]
    for key in keys:
      p = r['predicted'][key]
      cells += [f"{p['verify_ratio']:.2f}", f"{p['speedup_vs_ar']:.2f}x",
                f"{p['speedup_vs_best_chain']:.2f}x"]
    rows.append(cells)
  return (['## Draft trees at the paper\'s sizes (predicted)', '',
           f"Tokens per target call and draft calls measured on the demo family in "
           f"`{trees['source']}` (revision {trees['revision'][:10]}); call costs of T5 v1.1 "
           f"{paper.TARGET.upper()} (target) and {trees['draft']} (draft) from the compiled "
           'programs above (a tree of k nodes: the target call with the tree\'s attention '
           'layout). Predictions, not measurements; the acceptance is the demo\'s, so the rows '
           'compare chains with trees at these call costs.', '']
          + harness.table(head, rows) + [''])
