"""scripts/compiled_report.py: Table 2 predicted from the compiled programs.

The script runs at tiny shapes in a subprocess (it sets 8 fake host devices before JAX
starts); the properties checked hold at any size: partitioning splits the target's
weights, only partitioned programs communicate, the predicted speedups are the paper's cost
model worked out by hand from the recorded times, memory grows with batch and shrinks with
devices. The committed full-size results are checked for what the README quotes of them
and for the same predictions.
"""

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from specdec_t5x.research.predict import compiled_costs, compiled_tables, device_tables, paper
from specdec_t5x.research.results import headlines

pytestmark = pytest.mark.slow  # the compiled-cost report, run end to end

REPO = pathlib.Path(__file__).resolve().parents[1]
COMMITTED = REPO / 'results' / 'compiled_table2.json'


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  out = tmp_path_factory.mktemp('compiled') / 'tiny'
  proc = subprocess.run([sys.executable, 'scripts/compiled_report.py', '--tiny', f'--out={out}'],
                        cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(pathlib.Path(f'{out}.json').read_text()), \
      pathlib.Path(f'{out}.md').read_text()


def _check_predictions(data):
  """Each row's predicted c, verify ratio and speedup worked out by hand from the recorded
  call seconds: the paper's expected tokens per step (1 - alpha^(gamma+1)) / (1 - alpha)
  times a target step's seconds, over a step's (gamma draft steps and one verify call)."""
  for r in data['table2']:
    assert set(r['predicted']) == {'TPU v4 x1', 'H200 x1', 'TPU v4 x8', 'H200 x8'}
    alpha, gamma = r['alpha_paper'], r['gamma']
    tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    for key, p in r['predicted'].items():
      chip, n = key.split(' x')
      for suffix in ('', '_unfused'):
        t = data['call_seconds' + suffix][n][chip]
        t_t, t_d = t['xxl']['step_1'], t[r['draft']]['step_1']
        t_v = t['xxl'][f'step_{gamma + 1}']
        assert p['c' + suffix] == pytest.approx(t_d / t_t)
        assert p['verify_ratio' + suffix] == pytest.approx(t_v / t_t)
        assert p['speedup' + suffix] == pytest.approx(tokens * t_t / (gamma * t_d + t_v))
      assert 0 < p['c'] < 1 and p['verify_ratio'] > 1  # verifying k > 1 positions costs more


def test_every_paper_row_is_predicted_by_the_cost_model(tiny):
  data, _ = tiny
  assert [(r['task'], r['draft'], r['gamma'], r['alpha_paper'], r['speedup_paper'])
          for r in data['table2']] == [(r.task, r.draft, r.gamma, r.alpha, r.speedup)
                                       for r in paper.TABLE_2]
  _check_predictions(data)


def test_partitioning_splits_the_target_and_only_then_communicates(tiny):
  data, _ = tiny
  one, eight = data['models']['1'], data['models']['8']
  for size in compiled_costs.SIZES:
    assert eight[size]['param_bytes'] < one[size]['param_bytes'] / 2
    for name, rec in eight[size]['programs'].items():
      assert not any(one[size]['programs'][name]['collectives'].values())
      assert rec['collectives']['all-reduce'] > 0, (size, name)
      assert rec['compiled']['flops'] < one[size]['programs'][name]['compiled']['flops']
    assert set(one[size]['programs']) == _expected_programs().get(size, {'prefill', 'step_1'})
  step = data['per_device_costs']['8']['xxl']['step_1']
  assert 0 < step['share']['bytes'] < 1 and 0 < step['share']['flops'] < 1
  assert step['bytes'] < data['per_device_costs']['1']['xxl']['step_1']['bytes']


def test_memory_grows_with_batch_and_shrinks_with_devices(tiny):
  data, _ = tiny
  for r in data['memory']:
    m = {k: v['resident_bytes'] for k, v in r['per_device'].items()}
    assert m['x1 b32'] > m['x1 b1'] > m['x8 b1'] and m['x1 b32'] > m['x8 b32'] > m['x8 b1']
    for v in r['per_device'].values():
      for chip in compiled_costs.CHIPS:
        assert v['fits'][chip.name] == (v['resident_bytes'] <= chip.hbm_bytes)


TREE_FILES = ('results/tree.json', 'results/dynamic_tree.json', 'results/sampled_tree.json',
              'results/tree_budget.json')


def _tree_rows():
  return [r for name in TREE_FILES if (REPO / name).exists()
          for r in json.loads((REPO / name).read_text())['results']]


def _dynamic_draft_calls(decode):
  """A dynamic tree g<gamma>+w<W>[+c<n>]'s draft calls per step: its re-feed of
  max(gamma, n) + 1 tokens and its tree calls over 1 + W d nodes (d < gamma); [] for any
  other decode."""
  m = re.match(r'g(\d+)\+w(\d+)', decode)
  if not m:
    return []
  gamma, width = int(m.group(1)), int(m.group(2))
  copy = re.search(r'\+c(\d+)', decode)
  refeed = max(gamma, int(copy.group(1)) if copy else 0) + 1
  return [f'step_{refeed}'] + [f'tree_{1 + width * d}' for d in range(1, gamma)]


def _expected_programs():
  """The programs each model needs: the target's for the paper's rows (gamma 3, 5, 7) and
  each tree decode's verify call; the draft's for each dynamic tree's calls."""
  xxl, small = {'prefill', 'step_1', 'step_4', 'step_6', 'step_8'}, {'prefill', 'step_1'}
  for r in _tree_rows():
    if r['verified_positions'] > 1:
      xxl.add(f"{'tree' if '+' in r['decode'] else 'step'}_{r['verified_positions']}")
    small.update(_dynamic_draft_calls(r['decode']))
  return {'xxl': xxl, 'small': small}


def _draft_seconds(row, t_draft):
  """A step's draft calls: a dynamic tree's own (_dynamic_draft_calls), else draft calls x
  the one-token step."""
  calls = _dynamic_draft_calls(row['decode'])
  return (sum(t_draft[name] for name in calls) if calls
          else row['draft_calls'] * t_draft['step_1'])


def _check_tree_predictions(data):
  """Each decode of each tree results file predicted by hand: tokens per call x t_step
  over its verify call (a tree's over its nodes, a chain's over its positions) plus its
  draft calls, and against the fastest chain of its file, task and temperature."""
  sources = [t['source'] for t in data['trees']]
  assert sources == [s for s in TREE_FILES if (REPO / s).exists()]
  for trees in data['trees']:
    tree_rows = json.loads((REPO / trees['source']).read_text())['results']
    assert [(r['task'], r['decode']) for r in trees['rows']] == [
        (r['task'], r['decode']) for r in tree_rows]
    for key in ('TPU v4 x1', 'H200 x8'):
      chip, n = key.split(' x')
      t = data['call_seconds'][n][chip]
      best = {}
      for i, r in enumerate(trees['rows']):
        k = r['verified_positions']
        is_tree = '+' in r['decode']  # +c<n> / +s<k> / +w<W>: a copy branch, siblings, own tree
        assert r['tree'] == is_tree
        verify = t['xxl'][f"{'tree' if is_tree else 'step'}_{k}"]
        tokens = tree_rows[i].get('tpc_precise') or r['mean_tokens_per_target_call']
        want = tokens * t['xxl']['step_1'] / (verify + _draft_seconds(r, t['small']))
        assert r['predicted'][key]['speedup_vs_ar'] == pytest.approx(want)
        if not is_tree:
          cell = (r['task'], r['temperature'])
          best[cell] = max(best.get(cell, 0.0), want)
      for r in trees['rows']:
        assert r['predicted'][key]['speedup_vs_best_chain'] == pytest.approx(
            r['predicted'][key]['speedup_vs_ar'] / best[(r['task'], r['temperature'])])


def test_trees_are_predicted_with_their_own_verify_calls(tiny):
  """A tree call of k nodes is compiled apart from the k-position chain call, and costs
  about as much (the same products; its attention layout adds a little)."""
  data, text = tiny
  _check_tree_predictions(data)
  costs = data['per_device_costs']['1']['xxl']
  for k in (4, 6):
    assert costs[f'tree_{k}']['bytes'] == pytest.approx(costs[f'step_{k}']['bytes'], rel=0.05)
    assert costs[f'step_{k}']['flops'] <= costs[f'tree_{k}']['flops'] < 1.2 * costs[
        f'step_{k}']['flops']
  assert "## Draft trees at the paper's sizes (predicted)" in text
  # the draft's own calls of results/dynamic_tree's g3+w2: its re-feed and two tree calls
  assert {'step_4', 'tree_3', 'tree_5'} <= set(data['per_device_costs']['1']['small'])


def test_markdown_is_labelled_as_predictions(tiny):
  data, text = tiny
  assert compiled_tables.LABEL in text
  assert '\n'.join(compiled_tables.table2_lines(data)) in text


def test_roofline_is_the_slower_of_compute_and_memory():
  chip = compiled_costs.Chip('x', flops=100.0, hbm_bytes_per_s=10.0, hbm_bytes=1.0, source='')
  assert compiled_costs.roofline_s(1000.0, 10.0, chip) == 10.0  # compute bound
  assert compiled_costs.roofline_s(10.0, 1000.0, chip) == 100.0  # memory bound


def test_lengths_are_the_paper_runs():
  for base in paper.BASES.values():
    text = (REPO / base).read_text()
    lengths = re.search(r"TASK_FEATURE_LENGTHS = \{'inputs': (\d+), 'targets': (\d+)\}", text)
    assert lengths and tuple(map(int, lengths.groups())) == (
        compiled_costs.INPUT_LEN, compiled_costs.TARGET_LEN), base


def test_committed_results_are_what_the_readme_quotes():
  """The README's speedup box quotes the committed predictions, labelled as predicted,
  with their error on the paper's own rows."""
  data = json.loads(COMMITTED.read_text())
  assert data['lengths']['input'] == compiled_costs.INPUT_LEN
  assert data['configs']['xxl'].startswith('T5Config(vocab_size=32128')
  readme = (REPO / 'README.md').read_text()
  quoted = headlines.compiled(data)
  errors = [abs(r['predicted']['TPU v4 x1']['speedup'] - r['speedup_paper'])
            for r in data['table2']]
  assert quoted.startswith('PREDICTED')
  assert f'off by {np.mean(errors):.2f}x on average, {max(errors):.2f}x at most' in quoted
  assert f'| TPU v4 / H200 (predicted, not measured) | {quoted} |' in readme
  _check_predictions(data)
  _check_tree_predictions(data)
  speedups = [p['speedup'] for r in data['table2'] for p in r['predicted'].values()]
  assert all(np.isfinite(speedups)) and min(speedups) > 1  # memory-bound steps at XXL


def test_device_report_shows_measured_costs_beside_the_predictions(tiny):
  data, _ = tiny
  measured = {'target': 'xxl', 'enc_len': 128, 'cache_len': 72, 'pairs': {'small': {'c': 0.05}},
              'sizes': {size: {'call_s': {1: t, 8: 1.5 * t}, 'prefill_s': 10 * t,
                               'call_ratio_to_k1': {1: 1.0, 8: 1.5}}
                        for size, t in (('small', 0.001), ('xl', 0.01), ('xxl', 0.02))}}
  gpu = device_tables.vs_compiled(measured, data, 'NVIDIA H200')
  predicted = data['call_seconds']['1']['H200']
  assert gpu['chip'] == 'H200' and set(gpu['sizes']) == {'small', 'xxl'}  # xl: not compiled
  assert gpu['sizes']['xxl']['step_s_predicted'] == predicted['xxl']['step_1']
  assert gpu['sizes']['xxl']['verify_ratio_predicted'][8] == pytest.approx(
      predicted['xxl']['step_8'] / predicted['xxl']['step_1'])
  assert gpu['pairs']['small'] == {'c': 0.05, 'c_predicted': pytest.approx(
      predicted['small']['step_1'] / predicted['xxl']['step_1'])}
  assert device_tables.vs_compiled(measured, data, 'TPU v4')['chip'] == 'TPU v4'
  cpu = device_tables.vs_compiled(measured, data, 'cpu')
  assert cpu['chip'] is None and 'step_s_predicted' not in cpu['sizes']['xxl']
  text = '\n'.join(device_tables.render_vs_compiled(gpu))
  assert "beside the compiler's predictions" in text and 'small: 0.050' in text


def test_bytes_are_what_each_program_must_move(tiny):
  data, _ = tiny
  for n, sizes in data['models'].items():
    for size, m in sizes.items():
      for name, rec in m['programs'].items():
        mem, cost = rec['memory'], data['per_device_costs'][n][size][name]
        assert cost['bytes'] == mem['argument'] + mem['output'] - mem['alias']
        assert cost['bytes'] < cost['bytes_unfused']  # fusion only removes traffic
      assert m['programs']['step_1']['memory']['alias'] > 0  # the cache is donated
  for r in data['table2']:
    for p in r['predicted'].values():
      assert p['speedup_unfused'] > 0 and p['c_unfused'] > 0
