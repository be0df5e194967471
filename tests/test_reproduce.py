"""The reproduce-all command (research/results/reproduce.py): it runs every committed result with
the flags that file records, refuses to time on a busy machine, and the README's speedup
box and results/INDEX.md are what the JSON files hold."""
import glob
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time
import types

import pytest

from specdec_t5x.research.results import reproduce

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = str(REPO / 'results')


def _flags(command: str):
  """A recorded command's flags without --out and its value (the step adds its own)."""
  words = shlex.split(command)[2:]
  out, skip = [], False
  for w in words:
    if skip:
      skip = False
    elif w == '--out':
      skip = True
    elif not w.startswith('--out='):
      out.append(w)
  return out


def test_every_committed_result_is_a_step_with_its_recorded_flags():
  """A step's command is the one its committed file records; where the step's script has
  since been folded into another, the command of the script its experiment declares made it
  (`made_by`, with the same flags), and then only while that differs from the step's
  command."""
  steps = {s.name: s for s in reproduce.STEPS}
  for path in sorted(glob.glob(os.path.join(RESULTS, '*.json'))):
    name = os.path.basename(path)[:-5]
    data = reproduce.load(name, RESULTS)
    if 'command' not in data:
      continue  # not a result script's file (e.g. the reproduce log)
    assert name in steps, f'results/{name}.json has no reproduce step'
    step = steps[name]
    script, flags = step.made()
    assert _flags(data['command']) == flags, name
    assert data['command'].split()[1] == f'scripts/{script}', name
    if step.made_by is not None:  # remeasured with today's command: drop made_by
      assert (step.script, list(step.argv)) != (script, flags), name
      assert os.path.isfile(REPO / 'scripts' / step.script), name


def test_made_by_names_the_folded_script_with_the_flags_but_the_experiment():
  step = reproduce.Step('x', 'compare_decodes.py', ('--experiment=x', '--n', '2'),
                        made_by='old_x.py')
  assert step.made() == ('old_x.py', ['--n', '2'])
  assert reproduce.Step('y', 'y.py', ('--a',)).made() == ('y.py', ['--a'])


def test_readme_speedup_box_and_blocks_are_rendered_from_the_json_files():
  text = (REPO / 'README.md').read_text('utf-8')
  assert reproduce.BOX_BEGIN in text and reproduce.BOX_END in text
  assert reproduce.render_readme(text, RESULTS) == text, (
      'README.md quotes other figures than results/*.json: run '
      'python scripts/reproduce_results.py --index --docs')


def test_the_box_check_sees_a_stale_figure():
  text = (REPO / 'README.md').read_text('utf-8')
  stale = text.replace(reproduce.BOX_END, '| CPU | 9.99x typed by hand | x |\n' + reproduce.BOX_END)
  assert stale != text and reproduce.render_readme(stale, RESULTS) == text


def test_index_lists_every_result_as_rendered():
  committed = (REPO / 'results' / 'INDEX.md').read_text('utf-8')
  assert committed == '\n'.join(reproduce.index(RESULTS)) + '\n'


def test_a_running_python_process_makes_the_machine_busy(monkeypatch):
  """busy() sees only this process, its parent and the child through a narrowed /proc
  listing, on CPUs it reads as idle: another test worker's Python (pytest-xdist) or load
  cannot make it busy in the child's stead."""
  child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  # Popen returns once the child has called exec, before the kernel has set up its new
  # command line: /proc/<pid>/cmdline reads empty for a while (long on a loaded machine).
  # Wait until the child is a running Python process, the state this test is about.
  cmdline = pathlib.Path(f'/proc/{child.pid}/cmdline')
  deadline = time.monotonic() + 30
  while not cmdline.read_bytes() and time.monotonic() < deadline:
    time.sleep(0.01)
  shown = [os.getpid(), os.getppid(), child.pid]
  listing = lambda pattern: [f'/proc/{pid}/cmdline' for pid in shown]
  monkeypatch.setattr(reproduce, 'glob', types.SimpleNamespace(glob=listing))
  monkeypatch.setattr(reproduce, 'cpu_busy_fraction', lambda window=2.0: 0.0)
  try:
    why = reproduce.busy()
    assert child.poll() is None, f'the sleeping child ended early (exit {child.returncode})'
    assert why is not None and 'Python' in why and f'pid {child.pid}:' in why
    with pytest.raises(RuntimeError, match=f'Not timing x: .*pid {child.pid}:'):
      reproduce.run([reproduce.Step('x', 'nope.py')], root='/nonexistent', allow_dirty=True)
  finally:
    child.kill()
    child.wait()
  shown.pop()  # the child gone: this Python and its parent alone never make it busy
  assert reproduce.busy() is None


def test_a_spinning_process_makes_the_cpus_busy():
  spin = subprocess.Popen(['sh', '-c', 'while :; do :; done'])
  try:
    one_core = 1.0 / os.cpu_count()
    assert reproduce.cpu_busy_fraction(window=1.0) > 0.8 * one_core
    assert 'CPUs busy' in reproduce.busy(max_cpu=0.5 * one_core)
  finally:
    spin.kill()
    spin.wait()


def test_the_index_leaves_out_the_run_log(tmp_path):
  (tmp_path / f'{reproduce.LOG}.json').write_text('{"steps": [], "total_seconds": 0}')
  (tmp_path / 'bf16_cost.json').write_text(
      '{"command": "python scripts/bf16_agreement.py --gammas 3 --time", '
      '"environment": {"date": "2026-12-01"}}')
  rows = [l for l in reproduce.index(str(tmp_path)) if l.startswith('| `')]
  assert len(rows) == 1 and rows[0].startswith('| `bf16_cost.md`')


def test_the_index_shows_a_dirty_revision_as_dirty(tmp_path):
  """A file measured with uncommitted changes says so in the index (its revision keeps
  '-dirty'); a clean one shows the short revision alone."""
  for name, rev in (('a', '0123456789abcdef-dirty'), ('b', 'fedcba9876543210')):
    (tmp_path / f'{name}.json').write_text(
        json.dumps({'command': f'python scripts/{name}.py', 'environment': {'git_revision': rev}}))
  rows = [line for line in reproduce.index(str(tmp_path)) if line.startswith('| `')]
  assert '| 0123456789-dirty |' in rows[0] and '| fedcba9876 |' in rows[1]


def test_a_step_is_refused_on_uncommitted_code(tmp_path, monkeypatch):
  """A result measured on uncommitted changes names a revision no one can check out: the
  run refuses before starting the step's process, unless allow_dirty (or a quick smoke
  run); a clean checkout runs it."""
  started = []
  monkeypatch.setattr(reproduce.subprocess, 'run', lambda command, check: (
      started.append(command), types.SimpleNamespace(returncode=0))[1])
  step = reproduce.Step('demo_models', 'compare_decodes.py', timed=False, quick=('--x',))
  monkeypatch.setattr(reproduce.run_dir, 'git_revision', lambda: '0123456789abcdef-dirty')
  with pytest.raises(RuntimeError, match='uncommitted changes.*0123456789-dirty'):
    reproduce.run([step], root=str(tmp_path), log=lambda line: None)
  assert not started
  for kw in (dict(allow_dirty=True), dict(quick=True)):
    reproduce.run([step], root=str(tmp_path), log=lambda line: None, **kw)
  monkeypatch.setattr(reproduce.run_dir, 'git_revision', lambda: '0123456789abcdef')
  reproduce.run([step], root=str(tmp_path), log=lambda line: None)
  assert len(started) == 3 and started[1][-3] == '--x'
