"""The experiment registry (research/experiments/): every results file is owned by exactly
one experiment file, the run order keeps each experiment after the files it reads, and no
module outside the registry lists experiment names (adding one is one new file)."""
import ast
import glob
import os
import pathlib

import pytest

from specdec_t5x.research import experiments as registry

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path

REPO = pathlib.Path(__file__).resolve().parents[1]
FOLDER = REPO / 'specdec_t5x' / 'research' / 'experiments'


def _stems():
  return {os.path.basename(p)[:-5] for p in glob.glob(str(REPO / 'results' / '*.json'))
          if not p.endswith('reproduce_log.json')}


def test_every_results_file_is_owned_by_exactly_one_experiment_file():
  owners = {}
  for path in sorted(FOLDER.glob('[!_]*.py')):
    module = __import__(f'specdec_t5x.research.experiments.{path.stem}', fromlist=['x'])
    for step in module.EXPERIMENT.steps:
      assert step.name not in owners, f'{step.name}: {owners.get(step.name)} and {path.name}'
      owners[step.name] = path.name
  assert set(owners) == _stems()
  assert len(registry.EXPERIMENTS) == len(list(FOLDER.glob('[!_]*.py')))
  names = [e.name for e in registry.EXPERIMENTS]
  assert len(set(names)) == len(names) and not set(names) & (_stems() - set(owners))


def test_the_run_order_is_declared_once_and_reads_only_earlier_files():
  orders = [e.order for e in registry.EXPERIMENTS]
  assert len(set(orders)) == len(orders) and orders == sorted(orders)
  made = []
  for e in registry.EXPERIMENTS:
    for needed in e.needs:
      assert needed in made, f'{e.name} reads {needed}, made after it'
    made += [s.name for s in e.steps]


def test_the_derived_tables_come_from_the_steps():
  assert registry.STEPS == tuple(s for e in registry.EXPERIMENTS for s in e.steps)
  assert set(registry.HEADLINES) | set(registry.CHECKS) <= {s.name for s in registry.STEPS}
  for e in registry.RUNNABLE.values():  # compare_decodes.py runs it, one way
    assert bool(e.preset) != bool(e.measure), e.name
    assert all(s.script == 'compare_decodes.py' and s.argv[0] == f'--experiment={e.name}'
               for s in e.steps), e.name


def _literal(node):
  """A string literal item, or a call's first argument when that is one (Step('tree', ...))."""
  if isinstance(node, ast.Call) and node.args:
    node = node.args[0]
  return node.value if isinstance(node, ast.Constant) else None


def _name_lists(tree, names):
  """(line, names) of every list, tuple, set or dict display in `tree` that holds two or
  more of `names` as string literals (keys or items, or their calls' first arguments)."""
  for node in ast.walk(tree):
    items = (node.keys if isinstance(node, ast.Dict) else
             node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [])
    found = [_literal(i) for i in items if _literal(i) in names]
    if len(found) >= 2:
      yield node.lineno, found


def test_no_module_outside_the_registry_lists_experiment_names():
  names = _stems() | {e.name for e in registry.EXPERIMENTS}
  files = [p for p in (REPO / 'specdec_t5x').rglob('*.py') if FOLDER not in p.parents]
  files += sorted((REPO / 'scripts').glob('*.py'))
  listed = {f'{p.relative_to(REPO)}:{line}': found for p in files
            for line, found in _name_lists(ast.parse(p.read_text('utf-8')), names)}
  assert listed == {}


def test_the_name_list_check_sees_the_lists_the_registry_replaced():
  names = {'tree', 'lenience'}
  for text in ("STEPS = (Step('tree', 'a.py'), Step('lenience', 'a.py', ('--x',)))",
               "CHECKS = {'tree': Check(), 'lenience': Check()}",
               "PRESETS = {'tree': Preset('t', 'a', 'g2'), 'lenience': Preset('l', 'a', 'g4')}"):
    assert [found for _, found in _name_lists(ast.parse(text), names)] == [
        ['tree', 'lenience']], text
