"""`reproduce_results.py --check`: re-run result steps and compare what they print with the
files they replace, without touching those files.

Each checked step (its `Check`, declared with the step in its experiment file,
research/experiments/) lists the JSON fields that a rerun must reproduce EXACTLY (acceptance
rates and histograms, target calls, identical-token counts, BLEU/ROUGE, compiled FLOPs:
deterministic on one machine and one set of library versions) and the timing fields it
must reproduce within `rtol` (the run-to-run spread of timings on a 2-core VM). Fields are
named by fnmatch patterns over the JSON's flattened paths ('cells/3/alpha'); every pattern
must match a field of the committed file, so the lists cannot silently go stale
(tests/test_reproduce_check.py checks them against results/).
"""

from __future__ import annotations

import fnmatch
import tempfile
from typing import Any, Dict, List, Sequence

from specdec_t5x.research.experiments import CHECKS, Check
from specdec_t5x.research.results import reproduce


def flatten(tree: Any, prefix: str = '') -> Dict[str, Any]:
  """{'a/0/b': leaf} for a JSON tree (dict keys and list indices joined by '/')."""
  if isinstance(tree, dict):
    items = tree.items()
  elif isinstance(tree, list):
    items = enumerate(tree)
  else:
    return {prefix: tree}
  out: Dict[str, Any] = {}
  for key, value in items:
    out.update(flatten(value, f'{prefix}/{key}' if prefix else str(key)))
  return out


def _matching(flat: Dict[str, Any], patterns: Sequence[str]) -> Dict[str, List[str]]:
  return {p: [k for k in flat if fnmatch.fnmatchcase(k, p)] for p in patterns}


def stale_patterns(check: Check, reference: Dict[str, Any]) -> List[str]:
  """The patterns of `check` that match no field of `reference` (a JSON tree)."""
  flat = flatten(reference)
  return [p for p, keys in _matching(flat, check.exact + check.timing).items() if not keys]


def compare(check: Check, reference: Dict[str, Any], fresh: Dict[str, Any]) -> Dict[str, Any]:
  """Fields of `fresh` against `reference`: {'exact': n compared, 'timing': n compared,
  'mismatches': [(field, reference value, fresh value, rule)]}. A field missing from
  `fresh` is a mismatch; so is a pattern matching nothing in `reference`."""
  ref, new = flatten(reference), flatten(fresh)
  mismatches, counted = [], {'exact': 0, 'timing': 0}
  for rule, patterns in (('exact', check.exact), ('timing', check.timing)):
    for pattern, keys in _matching(ref, patterns).items():
      if not keys:
        mismatches.append((pattern, None, None, 'matches no field'))
      for key in keys:
        counted[rule] += 1
        a, b = ref[key], new.get(key, '<missing>')
        if rule == 'exact':
          ok = a == b
        else:
          ok = (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and abs(b - a) <= check.rtol * abs(a))
        if not ok:
          mismatches.append((key, a, b, rule if rule == 'exact' else f'within {check.rtol:.0%}'))
  return {**counted, 'mismatches': mismatches}


def run(steps: Sequence[reproduce.Step], quick: bool = False, allow_busy: bool = False,
        reference_root: str = reproduce.RESULTS, log=print) -> Dict[str, Dict[str, Any]]:
  """Re-runs each step of `steps` that has a Check into a scratch folder and compares its
  JSON with `reference_root`'s; returns {step: compare(...)}. Nothing under
  `reference_root` is written."""
  checked = [s for s in steps if s.name in CHECKS and (not quick or s.quick is not None)]
  out = {}
  with tempfile.TemporaryDirectory(prefix='reproduce_check_') as scratch:
    for step in checked:
      reference = reproduce.load(step.name, reference_root)
      if reference is None:  # before spending the rerun
        raise FileNotFoundError(f'No {step.name}.json under {reference_root} to check against.')
      # Uncommitted code may be checked: nothing it writes is kept as a result.
      reproduce.run([step], quick=quick, allow_busy=allow_busy, root=scratch, log=log,
                    allow_dirty=True)
      out[step.name] = compare(CHECKS[step.name], reference, reproduce.load(step.name, scratch))
      got = out[step.name]
      log(f'[{step.name}] {got["exact"]} exact and {got["timing"]} timing fields, '
          f'{len(got["mismatches"])} differ')
  return out


def report(results: Dict[str, Dict[str, Any]], limit: int = 10) -> List[str]:
  """Markdown lines: a row per step, then the first `limit` differing fields of each."""
  lines = ['| step | exact fields | timing fields | differing |', '|---|---:|---:|---:|']
  lines += [f'| {name} | {r["exact"]} | {r["timing"]} | {len(r["mismatches"])} |'
            for name, r in results.items()]
  for name, r in results.items():
    for field, a, b, rule in r['mismatches'][:limit]:
      lines.append(f'- {name}: `{field}` committed {a!r}, rerun {b!r} ({rule})')
  return lines
