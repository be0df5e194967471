"""Draft trees at the paper's sizes, predicted: the demo's measured tokens per target call
(the tree experiments' results files: chains and trees decoded side by side) with the call
costs that the compiled programs of T5 v1.1 give on an accelerator
(research/predict/compiled_costs.py).

For each decode of a tree results file, on each chip and device count, with the paper's
T5-small draft and T5-XXL target:

  speedup over AR = tokens per target call x t_step / (t_verify + t_drafts)

(tokens per target call: the experiment's precise count where it made one) where t_step
is the target's one-token step and t_verify the target's call over the decode's verified
positions: `step_<k>` for a chain of k positions, `tree_<k>` for a tree of k nodes (the
same call with the tree's attention layout), `step_1` for AR. t_drafts is
the draft's calls per step: draft calls x its one-token step for a chain and a static
tree; for the draft's dynamic tree of gamma levels of W (draft_tree_width) its own calls,
the re-feed of the last D + 1 tokens (`step_<D + 1>`, D = max(gamma, copy_branch)) and
one tree call over the 1 + W d nodes grown so far for each level d = 1 .. gamma - 1
(`tree_<1 + W d>`). It is the paper's cost model (Table 2's predictions) with the
acceptance measured rather than assumed i.i.d.; the drafts' and targets' acceptance is the
demo family's, not the paper's models', so the rows compare chains with trees, they do not
predict the paper's numbers.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import decode_specs
from specdec_t5x.research.results import harness
from specdec_t5x.research.predict import paper

DRAFT = 'small'  # the paper's draft of the design card (configs/spec_t5_small_xxl.gin)
FIELDS = ('task', 'temperature', 'decode', 'verified_positions', 'draft_calls',
          'mean_tokens_per_target_call')
SOURCES = ('results/tree.json,results/dynamic_tree.json,results/sampled_tree.json,'
           'results/tree_budget.json')


def load(paths: str) -> Optional[List[Dict[str, Any]]]:
  """[{'source': path, 'revision', 'draft': DRAFT, 'rows': the decodes}] of each tree
  results file (scripts/compare_decodes.py's tree experiments) named in `paths`
  (comma-separated) that exists; None where there is none."""
  out = []
  for path in filter(None, paths.split(',')):
    file = pathlib.Path(path)
    if file.exists():
      data = json.loads(file.read_text())
      out.append({'source': path, 'revision': data['environment']['git_revision'],
                  'draft': DRAFT, 'rows': data['results']})
  return out or None


def _config(row: Mapping[str, Any]) -> Optional[DecodeConfig]:
  """The DecodeConfig a decode's spec names; None for AR."""
  return None if row['decode'] == 'AR' else DecodeConfig(
      **decode_specs.parse_decode(row['decode'])[0])


def is_tree(row: Mapping[str, Any]) -> bool:
  """Whether a decode verifies a tree (a copy branch, siblings or the draft's own tree)."""
  config = _config(row)
  return bool(config and config.tree)


def draft_programs(row: Mapping[str, Any]) -> Optional[List[str]]:
  """The draft's calls per step of a dynamic-tree decode (module docstring); None for a
  chain or a static tree (draft calls x the draft's one-token step)."""
  config = _config(row)
  if not (config and config.draft_tree_width):
    return None
  gamma, width = config.gamma, config.draft_tree_width
  refeed = max(gamma, config.copy_branch) + 1  # a grafted copy branch's path may be longer
  return [f'step_{refeed}'] + [f'tree_{1 + width * d}' for d in range(1, gamma)]


def call_sizes(rows: Sequence[Mapping[str, Any]]) -> Dict[str, Tuple[List[int], List[int]]]:
  """The calls the rows need compiled: {'target': (chain positions k > 1, tree sizes),
  'draft': (step sizes k > 1, tree sizes) of the dynamic trees' draft calls}."""
  chains = sorted({r['verified_positions'] for r in rows
                   if r['verified_positions'] > 1 and not is_tree(r)})
  trees = sorted({r['verified_positions'] for r in rows if is_tree(r)})
  drafts = {name for r in rows for name in draft_programs(r) or ()}
  size = lambda kind: sorted({int(n.split('_')[1]) for n in drafts if n.startswith(kind)})
  return {'target': (chains, trees), 'draft': (size('step_'), size('tree_'))}


def tokens_per_call(row: Mapping[str, Any]) -> float:
  """A decode's tokens per target call: the precise count where the experiment made one
  (many inputs and rngs: t > 0), else the timed rows' mean."""
  return row.get('tpc_precise') or row['mean_tokens_per_target_call']


def verify_program(row: Mapping[str, Any]) -> str:
  k = row['verified_positions']
  return f'tree_{k}' if is_tree(row) else f'step_{k}'


def predict(call_seconds: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
            target: str = paper.TARGET, draft: str = DRAFT) -> List[Dict[str, Any]]:
  """Each row's fields (FIELDS) with {'<chip> x<n>': {verify_ratio, speedup_vs_ar,
  speedup_vs_best_chain}}; the best chain is the fastest predicted chain (AR included) of
  the same task and temperature on the same chip."""
  out = [dict({k: r[k] for k in FIELDS}, tree=is_tree(r), draft_programs=draft_programs(r),
              tokens_per_call=tokens_per_call(r), predicted={}) for r in rows]
  for n, chips in call_seconds.items():
    for chip, t in chips.items():
      key = f'{chip} x{n}'
      t_step, t_draft = t[target]['step_1'], t[draft]['step_1']
      for r, row in zip(out, rows):
        t_verify = t[target][verify_program(row)]
        programs = draft_programs(row)
        t_drafts = (sum(t[draft][name] for name in programs) if programs
                    else r['draft_calls'] * t_draft)
        cost = t_verify + t_drafts
        r['predicted'][key] = {'verify_ratio': t_verify / t_step,
                               'draft_calls_over_steps': t_drafts / t_draft,
                               'speedup_vs_ar': r['tokens_per_call'] * t_step / cost}
      for r in out:
        same = [o['predicted'][key]['speedup_vs_ar'] for o in out if not o['tree']
                and (o['task'], o['temperature']) == (r['task'], r['temperature'])]
        r['predicted'][key]['speedup_vs_best_chain'] = (
            r['predicted'][key]['speedup_vs_ar'] / max(same))
  return out


def lines(trees: Optional[Sequence[Mapping[str, Any]]],
          keys: Sequence[str] = ('TPU v4 x1', 'H200 x1')) -> List[str]:
  """The report's section: per tree results file, one row per decode, the predicted
  speedups on `keys`."""
  if not trees:
    return []
  head = ['task', 't', 'decode', 'positions', 'tokens/call (demo)', 'draft calls']
  for key in keys:
    head += [f'{key}: verify/step', f'{key}: drafts/step', f'{key}: vs AR',
             f'{key}: vs best chain']
  out = ['## Draft trees at the paper\'s sizes (predicted)', '',
         f'Call costs of T5 v1.1 {paper.TARGET.upper()} (target) and {DRAFT} (draft) from the '
         'compiled programs above (a tree of k nodes: the target call with the tree\'s '
         'attention layout; verify/step: the target\'s verify call in its one-token steps; '
         'drafts/step: the draft\'s calls of a step in its one-token steps, a dynamic tree\'s '
         'tree calls included). Predictions, not measurements; the acceptance is the demo\'s, '
         'so the rows compare chains with trees at these call costs.', '']
  for section in trees:
    rows = []
    for r in section['rows']:
      cells = [r['task'], f"{r['temperature']:g}", r['decode'], r['verified_positions'],
               f"{r['tokens_per_call']:.2f}", r['draft_calls']]
      for key in keys:
        p = r['predicted'][key]
        cells += [f"{p['verify_ratio']:.2f}", f"{p['draft_calls_over_steps']:.2f}",
                  f"{p['speedup_vs_ar']:.2f}x", f"{p['speedup_vs_best_chain']:.2f}x"]
      rows.append(cells)
    out += ([f"### `{section['source']}`", '',
             f"Tokens per target call and draft calls measured on the demo family in "
             f"`{section['source']}` (revision {section['revision'][:10]}).", '']
            + harness.table(head, rows) + [''])
  return out
