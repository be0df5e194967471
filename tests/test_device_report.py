"""scripts/device_report.py end to end at tiny shapes on CPU (--tiny): the accelerator
command runs every part (costs, predicted Table 2, efficiency with stock T5X, the demo
family) through the same code as on a GPU, and writes consistent JSON, Markdown, plots."""

import json
import pathlib

import pytest

from conftest import load_script
from specdec_t5x.algorithm import theory
from specdec_t5x.research.measure import t5x_reference

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path


def test_device_report_tiny_runs_every_part(tmp_path):
  script = load_script('device_report')
  out = str(tmp_path / 'device')
  result = script.main(['--tiny', '--out', out])
  saved = json.loads(pathlib.Path(out + '.json').read_text())
  md = pathlib.Path(out + '.md').read_text()
  assert saved['command'] == f'python scripts/device_report.py --tiny --out {out}'
  assert saved['environment']['device_kind'] and saved['environment']['git_revision']
  assert set(saved['part_seconds']) == {'weights', 'costs', 'table2', 'efficiency', 'demo'}
  # the committed compiler predictions (results/compiled_table2.json) beside the costs
  assert set(saved['vs_compiled']['sizes']) == {'small', 'xxl'}
  assert "beside the compiler's predictions" in md

  # 1. costs: every size timed; c and the verify ratio follow from the call costs.
  costs = result['costs']
  assert set(costs['sizes']) == {'small', 'xxl'} and costs['dtype'] == 'bfloat16'
  t = costs['sizes']['xxl']['call_s']
  assert sorted(t) == [1, 3]  # --ks 1 and gamma 2 + 1
  small = costs['sizes']['small']
  assert small['prefill_s'] > 0 and small['num_params'] < costs['sizes']['xxl']['num_params']
  assert costs['pairs']['small']['c'] == pytest.approx(small['call_s'][1] / t[1])
  assert costs['verify_ratio'][2] == pytest.approx(t[3] / t[1])

  # 2. the paper's 12 rows: predicted from its alpha and these costs, or marked.
  rows = result['table2']
  assert len(rows) == 12 and sum(r['speedup_paper'] == 3.4 for r in rows) == 1
  for r in rows:
    if r['draft'] != 'small':
      assert r['note'].startswith('not measured')
      continue
    t_v = t[3]  # the paper's gamma + 1 >= 4 lies beyond k = 3: held at the largest measured k
    assert r['verify'] == 'held at k=3'
    assert r['speedup_predicted'] == pytest.approx(float(theory.walltime_improvement_measured(
        r['alpha_paper'], r['gamma'], small['call_s'][1], t[1], t_v)))
    assert 1 <= r['best_gamma'] <= 2

  # 3. efficiency: the smallest draft and draft == target, with stock T5X alongside.
  eff = result['efficiency']
  assert eff['draft_sizes'] == {'small': 'small', 'self': 'xxl'}
  for d in eff['drafts'].values():
    (row,) = d['rows']
    assert row['gamma'] == 2 and 1 <= row['tokens_per_target_call'] <= 3
    assert row['efficiency'] == pytest.approx(row['speedup_measured'] / row['speedup_ideal'])
  assert eff['drafts']['self']['rows'][0]['alpha'] > 0.5
  cmp_ = eff['ar_vs_t5x']
  assert cmp_['t5x_importable'] == t5x_reference.available()
  if cmp_['t5x_importable']:
    assert cmp_['t5x_tokens_per_s'] > 0 and isinstance(cmp_['same_tokens'], bool)

  # 4. the demo family (float32): greedy speculative == AR, batch rows == batch-1 rows.
  (group,) = result['demo']['table2']
  (row,) = group['drafts']['demo_draft_s']['rows']
  assert group['task'] == 'ende' and row['same_tokens_as_ar'] == 2
  batch = result['demo']['batch']['rows']
  assert [(r['batch'], r['method']) for r in batch] == [
      (1, 'ar'), (1, 'spec_g2'), (2, 'ar'), (2, 'spec_g2')]
  assert all(r['rows_equal_batch1'] for r in batch)
  assert all(r['speedup_vs_ar'] == 1.0 for r in batch if r['method'] == 'ar')

  for heading in ('## 1. Call costs', "## 2. The paper's Table 2", '## 3. Efficiency',
                  '## 4. The demo family'):
    assert heading in md
  assert '| EnDe | small | 0 | 7 | 0.75 | 3.4x |' in md
  assert '| EnDe | base | 0 | 7 | 0.8 | 2.8x | not measured' in md
  assert sorted(pathlib.Path(p).name for p in result['plots']) == [
      'device_batch.png', 'device_costs.png', 'device_table2.png']
  assert all(pathlib.Path(p).stat().st_size > 0 for p in result['plots'])


def test_device_report_rejects_bad_flags():
  script = load_script('device_report')
  with pytest.raises(ValueError, match="unknown \\['speed'\\]"):
    script.parse_args(['--parts', 'costs,speed'])
  with pytest.raises(ValueError, match="unknown size 'huge'"):
    script.parse_args(['--sizes', 'small,huge'])
