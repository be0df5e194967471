"""The CPU's description that results files record (algorithm/cpu/info.py,
research/results/harness.environment) and the results index shows (research/results/reproduce.py)."""

import json
import os
import pathlib

from specdec_t5x.algorithm.cpu import info
from specdec_t5x.research.results import harness, reproduce

RESULTS = pathlib.Path(__file__).resolve().parents[1] / 'results'

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B45
flags\t\t: fpu avx2 fma avx512f avx512bw avx512_bf16 sha_ni

processor\t: 1
model name\t: not the first line
"""


def test_fields_are_read_from_the_first_processor():
  assert info.field(CPUINFO, 'model name') == 'AMD EPYC 9B45'
  assert info.field(CPUINFO, 'flags').split()[-2:] == ['avx512_bf16', 'sha_ni']
  assert info.field(CPUINFO, 'microcode') == ''
  assert info.field('', 'flags') == ''


def test_description_keeps_the_kernel_features_in_order(monkeypatch):
  monkeypatch.setattr(info, '_cpuinfo', lambda: CPUINFO)
  assert info.describe() == {
      'cpu': 'AMD EPYC 9B45',
      'cpu_features': ['avx2', 'fma', 'avx512f', 'avx512bw', 'avx512_bf16']}
  monkeypatch.setattr(info, '_cpuinfo', lambda: '')
  assert info.describe() == {'cpu': 'unknown', 'cpu_features': []}


def test_results_record_this_machines_cpu_and_the_index_shows_it():
  env = harness.environment()
  assert env['cpu'] == (info.cpu_model() or 'unknown')
  assert set(env['cpu_features']) == set(info.KERNEL_FEATURES) & info.cpu_flags()
  bf16 = ''.join(f', {f}' for f in env['cpu_features'] if 'bf16' in f)  # avx512_bf16, amx_bf16
  machine = reproduce._machine  # pylint: disable=protected-access
  assert machine(env) == f"cpu, {os.cpu_count()} cores, {env['cpu']}{bf16}"
  assert machine({'platform': 'cpu', 'cpu_count': 2}) == 'cpu, 2 cores'  # an older file


def test_the_readme_box_names_the_cpu_of_a_cpu_row(tmp_path):
  """The committed files' headlines, their environment replaced by one that names a CPU."""
  env = {'platform': 'cpu', 'cpu_count': 2, 'cpu': 'AMD EPYC', 'cpu_features': ['avx512_bf16'],
         'git_revision': 'abcdef0123'}
  for name in ('demo_speedup_runs', 'compiled_table2'):
    d = json.loads((RESULTS / f'{name}.json').read_text())
    (tmp_path / f'{name}.json').write_text(json.dumps(dict(d, environment=env)))
  rows = {line.split(' | ')[0]: line for line in reproduce.speedup_box(str(tmp_path))}
  assert rows['| CPU, the demo command (measured)'].endswith(
      '(abcdef0123; cpu, 2 cores, AMD EPYC, avx512_bf16) |')
  assert rows['| TPU v4 / H200 (predicted, not measured)'].endswith('(abcdef0123) |')
