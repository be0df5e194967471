"""Reliability of `python -m specdec_t5x.infer`: a locked
output directory, recorded settings that a reuse must match, inputs checked before any
decoding, crash-safe finalisation and clear errors for bad flags.

Runs configs/spec_tiny_test.gin (random tiny models, 8 demo examples) in-process, so one
compilation serves every run of the module.
"""
import json
import os
import pathlib
import subprocess
import sys
import time

import gin
import pytest
from conftest import train_tiny_spm

from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.integration import demo, infer, run_dir, tasks, vocab_check

pytestmark = pytest.mark.slow  # the runner end to end

REPO = pathlib.Path(__file__).resolve().parents[1]
OUTPUT = 'demo_ende-predict_with_aux.jsonl-00000-of-00001'  # mode: T5X's default
BASELINE = 'demo_ende-predict_with_aux-baseline.jsonl-00000-of-00001'
# A kernel mode other than the one the finished run decoded in (the default).
OTHER_KERNEL_MODE = 'xla' if modes.default_mode() != 'xla' else 'packed'


@pytest.fixture(autouse=True)
def _demo_tasks():
  tasks.register_tasks()
  yield
  gin.clear_config()
  tasks.register_tasks()


def _run(out, *extra):
  return infer.main(['--gin_file=configs/spec_tiny_test.gin',
                     f"--gin.INFER_OUTPUT_DIR='{out}'", *extra])


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  tasks.register_tasks()
  out = tmp_path_factory.mktemp('finished')
  metrics = _run(out, '--gin.infer.compare_baseline=True')
  gin.clear_config()
  return out, metrics


# ---------------------------------------------------------------- item 4: the lock


def test_a_second_runner_fails_fast_naming_the_holder(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time; from specdec_t5x.integration import run_dir; '
       f'lock = run_dir.DirLock({str(tmp_path)!r}).acquire(); print("held", flush=True); '
       'time.sleep(120)'],
      cwd=REPO, stdout=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=str(REPO)))
  try:
    assert holder.stdout.readline().strip() == 'held'
    tick = time.time()
    with pytest.raises(RuntimeError, match=rf'{tmp_path} is in use by another run \(pid '
                                           rf'{holder.pid} on host .*since'):
      _run(tmp_path)
    assert time.time() - tick < 60  # Before any data or weights are read.
    assert not (tmp_path / 'config.gin').exists()
  finally:
    holder.kill()  # kill -9 style: the kernel drops the lock with the process.
    holder.wait()
  with run_dir.DirLock(str(tmp_path)):
    pass


def test_lock_is_per_shard_and_released_on_error(tmp_path):
  with run_dir.DirLock(str(tmp_path), run_dir.lock_file_name(0, 2)):
    with run_dir.DirLock(str(tmp_path), run_dir.lock_file_name(1, 2)):
      pass  # Shards of one run share the directory.
  with pytest.raises(ValueError):
    _run(tmp_path, '--gin.BATCH_SIZE=0')
  assert not list(tmp_path.glob('.lock*'))  # Released (and removed) after the error.


# -------------------------------------------- items 4, 5, 8: settings and finalisation


def test_metrics_record_the_settings_and_seed(finished):
  out, metrics = finished
  assert metrics['decode_seed'] == 0
  recorded = metrics['run_settings']
  assert recorded['decode_seed'] == 0 and recorded['gamma'] == 4
  assert json.loads((out / 'metrics.json').read_text()) == metrics
  assert sorted(p.name for p in out.iterdir()) == [
      'config.gin', BASELINE, OUTPUT, 'metrics.json']


@pytest.mark.parametrize('flag,changed', [
    ('--gin.GAMMA=5', 'gamma'), ('--gin.infer.decode_seed=7', 'decode_seed'),
    (f"--gin.config.DecodeConfig.cpu_kernels='{OTHER_KERNEL_MODE}'", 'cpu_kernels')])
def test_finished_run_with_other_settings_is_refused(finished, flag, changed):
  out, _ = finished
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  with pytest.raises(ValueError, match=rf"holds a finished run with other settings "
                                       rf"\(changed: \['{changed}'\]\).*infer.overwrite=True"):
    _run(out, '--gin.infer.compare_baseline=True', flag)
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # config.gin too


def test_rerun_of_a_finished_run_is_a_no_op(finished, capsys):
  out, metrics = finished
  mtime = (out / OUTPUT).stat().st_mtime_ns
  assert _run(out, '--gin.infer.compare_baseline=True') == metrics
  assert (out / OUTPUT).stat().st_mtime_ns == mtime
  assert 'walltime speedup' in capsys.readouterr().out  # The summary, reprinted.


def test_overwrite_replaces_a_run_with_other_settings(tmp_path, finished):
  out = tmp_path / 'o'
  out.mkdir()
  for name in (OUTPUT, 'metrics.json'):
    (out / name).write_bytes((finished[0] / name).read_bytes())
  (out / BASELINE).write_bytes((finished[0] / BASELINE).read_bytes())
  # Another seed (greedy: same compiled function, so the test stays fast).
  metrics = _run(out, '--gin.infer.decode_seed=7', '--gin.infer.overwrite=True')
  assert metrics['decode_seed'] == 7 and metrics['run_settings']['decode_seed'] == 7
  assert not (out / BASELINE).exists()  # The old run's files went with it.
  assert 'decode_seed = 7' in (out / 'config.gin').read_text()


def test_kill_during_finalisation_loses_no_chunk(tmp_path, monkeypatch, finished):
  """A kill where metrics.json is written (after the chunks were made durable): the rerun
  resumes every chunk; a kill while the tmp dirs go: the rerun returns the finished run."""
  def killed(path, text):
    raise KeyboardInterrupt(f'killed writing {path}')

  real = run_dir.write_atomic  # the runner's one atomic write (infer, infer_run)
  monkeypatch.setattr(run_dir, 'write_atomic',
                      lambda p, t: killed(p, t) if p.endswith('metrics.json') else real(p, t))
  with pytest.raises(KeyboardInterrupt):
    _run(tmp_path, '--gin.infer.compare_baseline=True')
  monkeypatch.setattr(run_dir, 'write_atomic', real)
  gin.clear_config()
  metrics = _run(tmp_path, '--gin.infer.compare_baseline=True')
  assert metrics['resumed_chunks'] == metrics['num_examples'] // 4  # All: batch 4, period 1.
  assert (tmp_path / OUTPUT).read_bytes() == (finished[0] / OUTPUT).read_bytes()
  assert (tmp_path / BASELINE).read_bytes() == (finished[0] / BASELINE).read_bytes()
  # A kill between metrics.json and removing the tmp dirs: they are left behind...
  (tmp_path / 'tmp-demo_ende-00000-of-00001').mkdir()
  gin.clear_config()
  assert _run(tmp_path, '--gin.infer.compare_baseline=True') == metrics  # ...and go.
  assert not list(tmp_path.glob('tmp-*'))


# ------------------------------------------------ items 7, 10: inputs, checked first


def _corpus(tmp_path, lines: bytes):
  (tmp_path / 'ende').mkdir(parents=True)
  (tmp_path / 'ende' / 'test.tsv').write_bytes(lines)
  return str(tmp_path / 'ende' / 'test.tsv')


@pytest.mark.parametrize('bad,pattern', [
    (b'caf\xff\tdas Cafe\n', r':2: invalid UTF-8 \(byte .*xff.* at column 4\)'),
    (b'no tab on this line\n', r':2: expected inputs<TAB>targets \(one tab\), found 0'),
], ids=['invalid_utf8', 'no_tab'])
def test_bad_tsv_line_named_before_decoding(tmp_path, bad, pattern):
  path = _corpus(tmp_path / 'c', b'a house\tein Haus\n' + bad + b'a cat\teine Katze\n')
  out = tmp_path / 'out'
  with pytest.raises(ValueError, match=f'{path}{pattern}'):
    _run(out, f"--gin.infer.task_data_dir='{tmp_path / 'c'}'")
  assert not (out / OUTPUT).exists() and not list(out.glob('tmp-*'))  # Nothing decoded.


def test_blank_lines_still_skipped(tmp_path):
  path = _corpus(tmp_path, b'a house\tein Haus\n\n  \na cat\teine Katze\n')
  tasks.check_tsv(path)  # No error.


@pytest.mark.parametrize('flags,error,pattern', [
    (['--gin.BATCH_SIZE=0'], ValueError, r'batch_size must be >= 1, got 0 \(BATCH_SIZE\)'),
    (['--gin.GAMA=5'], ValueError,
     r'Gin macro GAMA \(from --gin.GAMA=...\) is not defined.*Did you mean GAMMA'),
], ids=['batch_0', 'unknown_macro'])
def test_clear_errors(tmp_path, flags, error, pattern):
  with pytest.raises(error, match=pattern):
    _run(tmp_path / 'out', *flags)


def test_macro_used_by_another_binding_is_allowed(tmp_path):
  with pytest.raises(ValueError, match=r'batch_size must be >= 1'):  # Got past the check.
    _run(tmp_path / 'out', '--gin.MY_BATCH=0', '--gin.BATCH_SIZE=%MY_BATCH')


def test_missing_gin_file_is_named():
  with pytest.raises(FileNotFoundError, match=r"Gin file 'configs/nope.gin' not found"):
    infer.main(['--gin_file=configs/nope.gin'])


# ---------------------------------------------------- item 6: the task's vocabulary


def test_wrong_task_vocabulary_refused_with_no_model_vocabulary(tmp_path):
  """configs/demo.gin has VOCABULARY = None: the demo checkpoints' vocabulary.json still
  catches a task registered with another SentencePiece model (before any weight is read)."""
  other = train_tiny_spm(tmp_path / 'other.model', ['ein Haus', 'a house'] * 20)
  with pytest.raises(ValueError, match=r'is not the one TARGET_CHECKPOINT '
                                       r'.*demo_target/checkpoint_2239 was trained with '
                                       r'\(demo_spm.model'):
    infer.main(['--gin_file=configs/demo.gin', f"--gin.INFER_OUTPUT_DIR='{tmp_path}/o'",
                f"--gin.infer.task_vocab_path='{other}'"])


def test_demo_checkpoints_record_the_demo_vocabulary():
  vocab = tasks.seqio.get_mixture_or_task(tasks.DEMO_ENDE).output_features['targets'].vocabulary
  vocab_check.check_checkpoints_vocabulary(vocab, {
      name: str(REPO / 'checkpoints' / 'demo' / name)
      for name in ('demo_target', 'demo_draft_m', 'demo_draft_s', 'demo_feature_head_kd')})
  for name in ('demo_target', 'demo_draft_m', 'demo_draft_s', 'demo_feature_head_kd'):
    assert vocab_check.find_record(str(REPO / 'checkpoints' / 'demo' / name))['sha256'] == (
        vocab_check.file_sha256(demo.vocab_path(REPO)))
