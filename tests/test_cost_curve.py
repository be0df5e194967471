"""research/measure/cost_curve.py (compare_decodes.py --experiment=cpu_cost_curve):
verify-call costs by model size, the acceptance each speedup needs, and a run that resumes
from its saved cells."""

import json
import pathlib

import pytest
from conftest import load_script

from specdec_t5x.algorithm import theory
from specdec_t5x.research.measure import cost_curve

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path


def _cell(step, verify, size='base'):
  return dict(size=size, dtype='float32', mode='packed', decoder_bytes=1,
              seconds={1: step, **verify})


def test_an_ideal_verify_call_gives_the_papers_speedup():
  """Verify calls as cheap as a step and a free draft: the paper's expected tokens per
  step at the best gamma; a draft of cost c: the paper's walltime improvement."""
  ks = range(2, 9)
  out = cost_curve.analyse(_cell(1.0, {k: 1.0 for k in ks}),
                      _cell(0.1, {k: 0.1 for k in ks}, size='small'))
  alpha = cost_curve.PAPER_SMALL_ALPHA
  free = out['free draft']['at_paper_alpha']
  assert free['gamma'] == 7
  assert free['speedup'] == pytest.approx(float(theory.expected_tokens_per_step(alpha, 7)))
  small = out['T5 v1.1 small']['at_paper_alpha']
  assert out['c_small'] == pytest.approx(0.1)
  assert small['speedup'] == pytest.approx(max(
      float(theory.walltime_improvement(alpha, g, 0.1)) for g in range(1, 8)))
  needed = out['T5 v1.1 small']['alpha_needed']
  assert needed['1x'] <= needed['1.5x'] <= needed['2x']


def test_a_costly_verify_call_needs_more_acceptance():
  cheap = cost_curve.analyse(_cell(1.0, {k: 1.0 for k in range(2, 9)}))
  dear = cost_curve.analyse(_cell(1.0, {k: 0.5 + 0.5 * k for k in range(2, 9)}))
  assert dear['verify_over_step'][4] == 2.5
  assert dear['free draft']['alpha_needed']['1.5x'] > cheap['free draft']['alpha_needed']['1.5x']
  assert dear['free draft']['at_paper_alpha']['speedup'] < cheap['free draft']['at_paper_alpha']['speedup']


def test_a_small_run_writes_its_files_and_resumes(tmp_path, monkeypatch):
  out = str(tmp_path / 'curve')
  argv = ['--sizes', 'demo', '--forms', 'float32:packed,float32:xla', '--ks', '1,2',
          '--repeats', '1', '--out', out]
  kept = _cell(1e-3, {2: 5e-3}, size='demo')  # a saved cell: reused, not re-timed
  pathlib.Path(out + '.partial.json').write_text(json.dumps(dict(ks=[1, 2], cells=[kept])))
  timed = []
  real = cost_curve.measure
  monkeypatch.setattr(cost_curve, 'measure', lambda *a: timed.append(a[:3]) or real(*a))
  load_script('compare_decodes').main(['--experiment=cpu_cost_curve'] + argv)
  assert timed == [('demo', 'float32', 'xla')]
  data = json.loads(pathlib.Path(out + '.json').read_text())
  assert [(c['size'], c['mode']) for c in data['cells']] == [('demo', 'packed'), ('demo', 'xla')]
  assert data['cells'][0]['verify_over_step'] == {'2': 5.0}
  assert data['cells'][1]['seconds']['1'] > 0 and data['command'].endswith('--ks 1,2 --repeats 1 --out ' + out)
  assert not pathlib.Path(out + '.partial.json').exists()
  assert (tmp_path / 'curve.md').read_text().count('| demo |') == 4  # costs + acceptance rows
