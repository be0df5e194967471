"""reproduce_results.py --check (research/results/check.py): its field lists match the
committed results, its comparison catches every kind of difference, a field altered from a
committed file is flagged against that file, and a rerun of a deterministic step at its
quick size reproduces the first run's fields exactly.

No checked step reruns in seconds at its committed size (its script puts the bfloat16
diagnosis, bit-level and so tied to the CPU's kernels, at about a minute and the compiled
XXL programs at minutes; the others decode hundreds of examples or time them), so against
the committed files the rerun is a copy of the file with one exact field altered."""
import copy
import fnmatch
import json
import pathlib

import pytest

from conftest import load_script
from specdec_t5x.research.results import reproduce, check as reproduce_check

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path

RESULTS = pathlib.Path(__file__).resolve().parents[1] / 'results'


def test_every_checked_field_names_a_field_of_the_committed_file():
  steps = {s.name for s in reproduce.STEPS}
  assert set(reproduce_check.CHECKS) <= steps
  for name, check in reproduce_check.CHECKS.items():
    reference = json.loads((RESULTS / f'{name}.json').read_text())
    assert reproduce_check.stale_patterns(check, reference) == [], name
    assert check.exact, name  # every checked step has a deterministic part


def test_flatten_names_every_leaf_by_its_path():
  assert reproduce_check.flatten({'a': [{'b': 1}, 2], 'c': {'d': 'x'}}) == {
      'a/0/b': 1, 'a/1': 2, 'c/d': 'x'}


def test_compare_catches_changed_missing_and_drifted_fields():
  check = reproduce_check.Check(exact=('rows/*/alpha', 'n'), timing=('rows/*/speedup',),
                                rtol=0.2)
  ref = {'n': 3, 'rows': [{'alpha': 0.5, 'speedup': 1.0}, {'alpha': 0.7, 'speedup': 2.0}]}
  same = reproduce_check.compare(check, ref, json.loads(json.dumps(ref)))
  assert same == {'exact': 3, 'timing': 2, 'mismatches': []}
  fresh = {'n': 3, 'rows': [{'alpha': 0.5000001, 'speedup': 1.19}, {'speedup': 2.5}]}
  got = reproduce_check.compare(check, ref, fresh)
  assert [(m[0], m[3]) for m in got['mismatches']] == [
      ('rows/0/alpha', 'exact'), ('rows/1/alpha', 'exact'), ('rows/1/speedup', 'within 20%')]
  assert got['mismatches'][1][2] == '<missing>'
  stale = reproduce_check.compare(reproduce_check.Check(exact=('nothing/*',)), ref, ref)
  assert stale['mismatches'] == [('nothing/*', None, None, 'matches no field')]


def test_a_rerun_reproduces_the_deterministic_fields_exactly(tmp_path):
  step = next(s for s in reproduce.STEPS if s.name == 'alpha_demo')
  assert not step.timed and step.quick
  reproduce.run([step], quick=True, root=str(tmp_path), log=lambda _: None)
  got = reproduce_check.run([step], quick=True, reference_root=str(tmp_path),
                            log=lambda _: None)
  assert got['alpha_demo']['exact'] > 50 and got['alpha_demo']['mismatches'] == []
  lines = reproduce_check.report(got)
  assert lines[2].startswith('| alpha_demo |') and lines[2].endswith('| 0 |')


def _leaves(tree, path=()):
  """(path, value) of every leaf of a JSON tree; path: its keys and list indices."""
  if isinstance(tree, (dict, list)):
    for key, value in (tree.items() if isinstance(tree, dict) else enumerate(tree)):
      yield from _leaves(value, path + (key,))
  else:
    yield path, tree


def _named(path):
  return '/'.join(map(str, path))


def _altered(value):
  if isinstance(value, bool):
    return not value
  if isinstance(value, (int, float)):
    return value + 1
  return f'{value} (altered)'


@pytest.mark.parametrize('name', sorted(reproduce_check.CHECKS))
def test_check_flags_a_field_altered_from_the_committed_file(name, monkeypatch, capsys):
  committed = json.loads((RESULTS / f'{name}.json').read_text())
  check = reproduce_check.CHECKS[name]
  counts = {rule: sum(fnmatch.fnmatchcase(_named(path), pattern)
                      for path, _ in _leaves(committed) for pattern in patterns)
            for rule, patterns in (('exact', check.exact), ('timing', check.timing))}
  exact = [(path, value) for path, value in _leaves(committed)
           if any(fnmatch.fnmatchcase(_named(path), p) for p in check.exact)]
  path, value = exact[len(exact) // 2]
  rerun = {}

  def rerun_step(steps, root, **kw):  # stands in for the script: writes `rerun`
    del kw
    assert [s.name for s in steps] == [name]
    (pathlib.Path(root) / f'{name}.json').write_text(json.dumps(rerun))
  monkeypatch.setattr(reproduce, 'run', rerun_step)
  script = load_script('reproduce_results')
  argv = ['--check', '--only', name, '--root', str(RESULTS)]
  rerun.update(committed)  # a rerun that reproduces the committed file
  assert script.main(argv) == {name: {**counts, 'mismatches': []}}
  rerun.clear()
  rerun.update(copy.deepcopy(committed))
  leaf = rerun
  for key in path[:-1]:
    leaf = leaf[key]
  leaf[path[-1]] = _altered(value)
  capsys.readouterr()
  with pytest.raises(SystemExit) as stop:
    script.main(argv)
  assert stop.value.code == 1
  out = capsys.readouterr().out
  assert f'| {name} | {counts["exact"]} | {counts["timing"]} | 1 |' in out
  assert (f'- {name}: `{_named(path)}` committed {value!r}, rerun {_altered(value)!r} '
          '(exact)') in out


def test_a_missing_reference_is_an_error_before_the_rerun(tmp_path):
  step = next(s for s in reproduce.STEPS if s.name == 'alpha_demo')
  ran = []
  with pytest.raises(FileNotFoundError, match='alpha_demo.json'):
    reproduce_check.run([step], reference_root=str(tmp_path), log=ran.append)
  assert ran == []  # nothing was run
