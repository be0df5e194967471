"""reproduce_results.py --check (research/reproduce_check.py): its field lists match the
committed results, its comparison catches every kind of difference, and a rerun of a
deterministic step at its quick size reproduces the first run's fields exactly."""
import json
import pathlib

import pytest

from specdec_t5x.research import reproduce, reproduce_check

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


@pytest.mark.slow  # two quick runs of the alpha script
def test_a_rerun_reproduces_the_deterministic_fields_exactly(tmp_path):
  step = next(s for s in reproduce.STEPS if s.name == 'alpha_demo')
  assert not step.timed and step.quick
  reproduce.run([step], quick=True, root=str(tmp_path), log=lambda _: None)
  got = reproduce_check.run([step], quick=True, reference_root=str(tmp_path),
                            log=lambda _: None)
  assert got['alpha_demo']['exact'] > 50 and got['alpha_demo']['mismatches'] == []
  lines = reproduce_check.report(got)
  assert lines[2].startswith('| alpha_demo |') and lines[2].endswith('| 0 |')


def test_a_missing_reference_is_an_error_before_the_rerun(tmp_path):
  step = next(s for s in reproduce.STEPS if s.name == 'alpha_demo')
  ran = []
  with pytest.raises(FileNotFoundError, match='alpha_demo.json'):
    reproduce_check.run([step], reference_root=str(tmp_path), log=ran.append)
  assert ran == []  # nothing was run
