"""The experiment registry: one file here per experiment of results/, the only place its
name is declared.

Each module (but the private `_base`) declares `EXPERIMENT = Experiment(...)` (`_base.py`):
its name and run order, and per results file (`Step`) the script and flags that make it
(with a quick smoke form, and `made_by`: the script, since folded into another, that made
the committed file), the fields a rerun must reproduce
exactly (`Check`) and its headline function (research/results/headlines.py); for a decode
comparison its `Preset`, for any other measurement of scripts/compare_decodes.py its
measurement module. Everything else derives from here: reproduce_results.py's steps
(`STEPS`, in `order`), its --check fields (`CHECKS`), the headlines of results/INDEX.md, the
README's speedup box and the docs' rendered blocks (`HEADLINES`), compare_decodes.py's
experiments (`RUNNABLE`).

Adding an experiment is one new file here (copy a neighbour: tree.py for a decode
comparison, alpha_demo.py for a measurement of its own); tests/test_registry.py checks
that every results/*.json is owned by exactly one of them.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Dict, Tuple

from specdec_t5x.research.experiments._base import (RESULTS, Check, Experiment,  # noqa: F401
                                                     Preset, Step)


def _discover() -> Tuple[Experiment, ...]:
  """Every module's EXPERIMENT, in their declared run order."""
  found = []
  for info in pkgutil.iter_modules(__path__):
    if not info.name.startswith('_'):
      found.append(importlib.import_module(f'{__name__}.{info.name}').EXPERIMENT)
  return tuple(sorted(found, key=lambda e: e.order))


EXPERIMENTS: Tuple[Experiment, ...] = _discover()
STEPS: Tuple[Step, ...] = tuple(s for e in EXPERIMENTS for s in e.steps)
CHECKS: Dict[str, Check] = {s.name: s.check for s in STEPS if s.check}
HEADLINES: Dict[str, Callable[[Dict[str, Any]], str]] = {
    s.name: s.headline for s in STEPS if s.headline}
# The README's "what speedup where" box: (where, results file), in its rows' order.
SPEEDUP_BOX: Tuple[Tuple[str, str], ...] = tuple(
    (s.box[1], s.name) for s in sorted((s for s in STEPS if s.box), key=lambda s: s.box[0]))
# compare_decodes.py --experiment=<name>: a decode preset or a measurement module.
RUNNABLE: Dict[str, Experiment] = {e.name: e for e in EXPERIMENTS if e.preset or e.measure}
PRESETS: Dict[str, Preset] = {e.name: e.preset for e in EXPERIMENTS if e.preset}
