"""research/results/harness.py, research/measure/demo_data.py and measurement.py: the
pieces every result script is built from, checked on stand-ins whose answers are known (no
timing figures are asserted)."""

import argparse
import json
import os
import pathlib
import types

import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x.integration import infer_output
from specdec_t5x.research.measure import demo_data, measurement, timed_rows
from specdec_t5x.research.results import harness

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_parser_has_out_and_optional_repeats():
  ap = harness.parser('doc', '/tmp/x', repeats=4)
  args = ap.parse_args([])
  assert (args.out, args.repeats) == ('/tmp/x', 4)
  assert not hasattr(harness.parser('doc', '/tmp/y').parse_args([]), 'repeats')
  assert harness.ints('1,2,,4') == [1, 2, 4] and harness.floats('0,1') == [0.0, 1.0]
  assert harness.results_path(str(REPO / 'scripts' / 'x.py'), 'name') == str(
      REPO / 'results' / 'name')


def test_add_flags_takes_settings_from_the_table_and_defaults_from_the_caller():
  table = {'n': dict(type=int, help='how many'), 'on': dict(action='store_true')}
  ap = harness.add_flags(argparse.ArgumentParser(), table,
                         dict(n=3, on={}, rate=dict(type=float, default=0.5), name='x'))
  assert vars(ap.parse_args([])) == {'n': 3, 'on': False, 'rate': 0.5, 'name': 'x'}
  assert vars(ap.parse_args(['--n', '4', '--on', '--rate', '1', '--name', 'y'])) == {
      'n': 4, 'on': True, 'rate': 1.0, 'name': 'y'}


def test_a_measurement_parses_its_flags_and_writes_its_report(tmp_path, capsys):
  """Shared flags take FLAGS' settings, a function default is called with the entry point,
  the report records the command and args and holds what `measure` returned."""
  m = measurement.Measurement(
      'x', 'doc', lambda args, script: {'n': args.num_examples * 2},
      lambda report: report.header('T') + harness.table(['n'], [[report['n']]]), repeats=2,
      flags=dict(num_examples=3, temperatures='0,1', alpha_json=measurement.alpha_json,
                 drafts=dict(type=measurement.names, default=['a'])))
  script = str(REPO / 'scripts' / 'compare_decodes.py')
  assert m.parser(script).parse_args([]).out == str(REPO / 'results' / 'x')
  data = m.main(['--num_examples', '4', '--out', str(tmp_path / 'x')], script, ['--flag'])
  assert data['n'] == 8 and data['command'] == 'python scripts/compare_decodes.py --flag'
  assert data['args'] == {'out': str(tmp_path / 'x'), 'repeats': 2, 'num_examples': 4,
                          'temperatures': [0.0, 1.0], 'drafts': ['a'],
                          'alpha_json': str(REPO / 'results' / 'alpha_demo.json')}
  assert json.loads((tmp_path / 'x.json').read_text())['n'] == 8
  assert '| 8 |' in (tmp_path / 'x.md').read_text() and '# T' in capsys.readouterr().out


def test_a_measurements_setup_runs_first_and_adds_to_the_environment(tmp_path):
  """`setup(args)` runs before `measure`, and what it returns joins the report's
  environment (a library's version, a thread count it set)."""
  calls = []
  m = measurement.Measurement(
      'x', 'doc', lambda args, script: calls.append('measure') or {'n': 1},
      lambda report: [], prints=False, flags=dict(threads=dict(type=int, default=2)),
      setup=lambda args: calls.append('setup') or {'threads_set': args.threads})
  data = m.main(['--threads', '3', '--out', str(tmp_path / 'x')], 'scripts/y.py')
  assert calls == ['setup', 'measure'] and data['environment']['threads_set'] == 3


def test_pairs_parses_key_values_and_refuses_malformed_items():
  assert harness.pairs('ende=3, summarize=1,', float) == {'ende': 3.0, 'summarize': 1.0}
  assert harness.pairs('') == {} and harness.pairs('a=x=y') == {'a': 'x=y'}
  for bad in ('ende', '=3', 'ende=three'):
    with pytest.raises(argparse.ArgumentTypeError, match='expected key=value|three'):
      harness.pairs(bad, int)


def test_interleaved_runs_each_fn_in_turn_and_keeps_outputs():
  calls = []

  def fn(name):
    def call():
      calls.append(name)
      return np.full(2, len(calls))
    return call
  t = harness.interleaved({'a': fn('a'), 'b': fn('b')}, repeats=3)
  assert calls == ['a', 'b'] + ['a', 'b'] * 3  # compile once, then interleaved
  assert [len(t.seconds[k]) for k in 'ab'] == [3, 3]
  np.testing.assert_array_equal(t.outputs['b'], [8, 8])  # the last call's output


def test_median_is_the_one_statistic():
  t = harness.Timings({'a': [1.0, 9.0, 2.0], 'b': [2.0, 2.0, 8.0]}, {})
  assert t.median == {'a': 2.0, 'b': 2.0}
  assert t.speed_ratios('a') == {'b': pytest.approx(2.0)}  # median of 2/1, 2/9, 8/2


def test_table_and_fmt():
  assert harness.table(['x', 'y'], [[1, None], ['a', 2.5]], 'lr') == [
      '| x | y |', '|---|---:|', '| 1 | None |', '| a | 2.5 |']
  assert harness.fmt(None) == '-' and harness.fmt(1.234, unit='x') == '1.23x'
  assert harness.fmt(0.5, '.3f') == '0.500'


def test_report_writes_command_environment_args_markdown_and_figure(tmp_path):
  out = str(tmp_path / 'sub' / 'result')
  args = types.SimpleNamespace(out=out, repeats=2)
  report = harness.Report('/anywhere/scripts/bench_x.py', args, ['--out', out, '--name', 'a b'],
                          extra_version='1.0')
  assert report.command == f"python scripts/bench_x.py --out {out} --name 'a b'"
  report['rows'] = [{'x': np.float32(0.5)}]
  lines = report.header('Title', 'A note.') + harness.table(['x'], [[0.5]])
  text = report.write(lines)
  saved = json.loads(pathlib.Path(out + '.json').read_text())
  assert saved['command'] == report.command and saved['args'] == {'out': out, 'repeats': 2}
  env = saved['environment']
  assert env['extra_version'] == '1.0' and env['cpu_count'] == os.cpu_count()
  for key in ('git_revision', 'device_kind', 'jax', 'numpy', 'python'):
    assert env[key]
  assert saved['rows'] == [{'x': 0.5}]
  md = pathlib.Path(out + '.md').read_text()
  assert md == text and md.startswith(f'# Title\n\nCommand: `{report.command}`\n')
  assert '\nA note.\n\n| x |' in md
  report.write(suffix='_more')  # JSON only
  assert os.path.exists(out + '_more.json') and not os.path.exists(out + '_more.md')
  assert not [p for p in os.listdir(tmp_path / 'sub') if '.tmp' in p]
  plt = harness.pyplot()
  if plt is None:
    pytest.skip('matplotlib is not installed')
  fig, ax = plt.subplots()
  demo_data.throughput_plot(ax, [{'batch': b, 'method': m, 'tokens_per_s': 10.0 * b}
                                 for b in (1, 2) for m in ('ar', 'spec_g2')])
  path = report.save_figure(fig, '_plot')
  assert path == out + '_plot.png' and pathlib.Path(path).read_bytes()[:4] == b'\x89PNG'


def test_report_command_defaults_to_sys_argv(monkeypatch, tmp_path):
  monkeypatch.setattr('sys.argv', ['scripts/y.py', '--repeats', '3'])
  report = harness.Report('y.py', out=str(tmp_path / 'y'))
  assert report.command == 'python scripts/y.py --repeats 3' and 'args' not in report.data


class _Letters:
  """A stand-in vocabulary: id i is the letter chr(96 + i); ids past 5 decode as '?'
  (as seqio's SentencePieceVocabulary maps them to unk)."""

  def decode(self, ids):
    return ''.join(chr(96 + i) if i < 5 else '?' for i in ids)


def test_texts_cut_at_eos_and_drop_padding_as_the_runner_writes():
  rows = [[2, 3, 7, 4, 1, 2, 2], [0, 2, 1], [4, 4]]
  assert demo_data.texts(_Letters(), rows) == ['bc?d', 'b', 'dd']
  assert demo_data.texts(_Letters(), rows) == [
      infer_output.decode_text(_Letters(), np.asarray(r), 1) for r in rows]


def test_row_totals_rates_and_results():
  out = lambda tok, **st: types.SimpleNamespace(tokens=np.asarray([tok]),
                                                stats={k: np.asarray([v]) for k, v in st.items()})
  outs = [out([5, 1], generated_tokens=2, target_calls=1, drafted_tokens=4, accepted_tokens=1,
              beta_positions=2, beta_sum=1.0),
          out([6, 6], generated_tokens=2, target_calls=2, drafted_tokens=4, accepted_tokens=2,
              beta_positions=3, beta_sum=1.5)]
  tokens, stats = timed_rows.row_totals(outs)
  np.testing.assert_array_equal(tokens, [[5, 1], [6, 6]])
  assert stats == {'generated_tokens': 4, 'target_calls': 3, 'drafted_tokens': 8,
                   'accepted_tokens': 3, 'beta_positions': 5, 'beta_sum': 2.5}
  assert demo_data.rates(stats) == pytest.approx(
      {'alpha': 2.5 / 5, 'acceptance_rate': 3 / 8, 'mean_tokens_per_target_call': 4 / 3,
       'drafts_per_step': 8 / 3})
  none = demo_data.rates(dict(stats, drafted_tokens=0, accepted_tokens=0, beta_positions=0,
                              beta_sum=0.0))
  assert none['alpha'] is None and none['acceptance_rate'] is None

  ar = [out([5, 1], generated_tokens=2, target_calls=2, drafted_tokens=0, accepted_tokens=0,
            beta_positions=0, beta_sum=0.0),
        out([6, 6], generated_tokens=2, target_calls=2, drafted_tokens=0, accepted_tokens=0,
            beta_positions=0, beta_sum=0.0)]
  res = demo_data.row_results(harness.Timings({'AR': [4.0], 'spec': [2.0]},
                                              {'AR': ar, 'spec': outs}))
  assert res['AR']['speedup_vs_ar'] == 1.0 and res['AR']['alpha'] is None
  assert res['spec']['speedup_vs_ar'] == 2.0 and res['spec']['seconds'] == 2.0
  assert res['spec']['equal_to_ar'] and res['spec']['target_calls'] == 3
  outs[1] = out([6, 7], generated_tokens=2, target_calls=2, drafted_tokens=4, accepted_tokens=2,
                beta_positions=3, beta_sum=1.5)
  assert not demo_data.row_results(harness.Timings({'AR': [1.0], 'spec': [1.0]},
                                                   {'AR': ar, 'spec': outs}))['spec']['equal_to_ar']


def test_alpha_cells(tmp_path):
  assert demo_data.alpha_cells(str(tmp_path / 'missing.json')) == []
  path = tmp_path / 'alpha.json'
  path.write_text(json.dumps({'cells': [{'draft': 'd', 'alpha': 0.5}]}))
  assert demo_data.alpha_cells(str(path)) == [{'draft': 'd', 'alpha': 0.5}]


def test_throughput_table():
  rows = [dict(batch=1, method='ar', tokens_per_s=10.0, speedup_vs_ar=1.0,
               alpha=None, acceptance_rate=None, mean_tokens_per_target_call=1.0,
               rows_equal_batch1=True, rows_checked=1)]
  assert demo_data.throughput_table(rows)[2] == (
      '| 1 | ar | 10.0 | 1.00x | - | - | 1.00 | True (1 rows) |')


def test_row_decoder_decodes_each_row_alone():
  target = make_model(tiny_config(), seed=0)
  enc = random_inputs(3, 9, 40, seed=3, min_len=3)
  outs = demo_data.row_decoder(target, enc, 4)()
  assert len(outs) == 3 and all(o.tokens.shape == (1, 4) for o in outs)
  tokens, stats = timed_rows.row_totals(outs)
  assert tokens.shape == (3, 4) and stats['drafted_tokens'] == 0
