"""What a new user sees from `python -m specdec_t5x.infer` (README command 1): no
TensorFlow / CUDA / absl start-up lines, one line each for the pauses of a first run (the
CPU kernels' build, the first compilation), where the outputs went, and, rerun into a
finished output directory, that the run was reused and how to decode again.

The end-to-end tests run configs/spec_tiny_test.gin (random tiny models, 4 demo examples)
as a subprocess, as a user would; the others check the pieces in-process.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import pytest

from specdec_t5x.algorithm.cpu import build, modes
from specdec_t5x.integration import console, infer_output

REPO = pathlib.Path(__file__).resolve().parents[1]
# Lines TensorFlow 2.x, CUDA and absl print on a CPU machine (seen before the fix).
STARTUP = [
    'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR',
    'I0000 00:00:1796437852.232967   17149 port.cc:153] oneDNN custom operations are on. You '
    'may see slightly different numerical results due to floating-point round-off errors.',
    'I0000 00:00:1796437852.234142   17149 cudart_stub.cc:31] Could not find cuda drivers on '
    'your machine, GPU will not be used.',
    'E0000 00:00:1796437860.922569   17149 cuda_platform.cc:52] failed call to cuInit: '
    'INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)',
    '2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could '
    'not find cuda drivers on your machine, GPU will not be used.',
    'To enable the following instructions: AVX2 FMA, in other operations, rebuild '
    'TensorFlow with the appropriate compiler flags.',
]
NOISE = re.compile(r'absl::InitializeLog|oneDNN|cudart|cuda drivers|cuInit|rebuild TensorFlow'
                   r'|^[IWE]\d{4} ', re.MULTILINE)


def test_startup_lines_are_noise_and_nothing_else_is():
  kept = [
      'specdec_t5x: the packed CPU matmul is off (no C++ compiler); decoding uses XLA dot.',
      'W0000 00:00:1796437852.2 17149 cpu_kernels.py:260] specdec_t5x: the packed CPU matmul '
      'is off (no C++ compiler); decoding uses XLA dot.',  # ours, through absl's handler
      'E0000 00:00:1796437860.9 17149 env.cc:12] Could not open file: permission denied',
      '/x/seqio/utils.py:12: DeprecationWarning: use y', 'Traceback (most recent call last):',
      'ValueError: Gin macro INFER_OUTPUT_DIR is required but not set',
  ]
  assert [line for line in STARTUP + kept if not console.is_noise(line)] == kept


@pytest.mark.parametrize('user_level', [None, '3', '0'])
def test_quiet_start_filters_fd_2_and_honours_the_users_level(capfd, monkeypatch, user_level):
  monkeypatch.setenv(console.LEVEL, user_level or '')  # restored afterwards, even if unset
  if user_level is None:
    monkeypatch.delenv(console.LEVEL)
  with console.quiet_start():  # C++ libraries and Python's stderr both write to fd 2
    os.write(2, ''.join(f'{line}\n' for line in STARTUP).encode())
    os.write(2, b'our warning\n')
  err = capfd.readouterr().err
  assert os.environ[console.LEVEL] == (user_level or console.DEFAULT_LEVEL)
  if user_level == '0':  # the user asked for every line
    assert err.splitlines() == STARTUP + ['our warning']
  else:
    assert err == 'our warning\n'


def test_quiet_start_lets_an_error_through(capfd, monkeypatch):
  monkeypatch.setenv(console.LEVEL, '1')
  with pytest.raises(ImportError):
    with console.quiet_start():
      os.write(2, f'{STARTUP[0]}\nlibfoo.so: cannot open shared object file\n'.encode())
      raise ImportError('libfoo.so')
  assert capfd.readouterr().err == 'libfoo.so: cannot open shared object file\n'


def _can_build() -> bool:
  """Whether the CPU kernels build here (the CPU backend, an x86-64 CPU with AVX2 and FMA,
  a C++ compiler)."""
  return (jax.default_backend() == 'cpu'
          and build.cpu_runs_kernels()
          and shutil.which(os.environ.get('CXX', 'g++')) is not None)


def test_needs_build_only_without_a_built_library(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECDEC_KERNEL_CACHE', str(tmp_path))
  assert not modes.needs_build('xla')  # that mode builds nothing
  assert modes.needs_build('packed') == _can_build()
  pathlib.Path(build.library_path()).write_bytes(b'')
  assert not modes.needs_build('packed')  # reused from the cache: no build, no line


def _metrics(out, baseline):
  m = {'task': 'demo_ende', 'speculative': True, 'gamma': 1, 'metrics': {'bleu': 9.45},
       'alpha': 0.702, 'acceptance_rate': 0.643, 'mean_tokens_per_target_call': 1.61,
       'predictions_file': 'demo_ende-predict.jsonl-00000-of-00001',
       'target_config': {'dtype': 'bfloat16'}, 'cpu_kernels': 'packed_bf16', 'platform': 'cpu'}
  if baseline:
    m['baseline'] = {'metrics': {'bleu': 9.45},
                     'predictions_file': 'demo_ende-predict-baseline.jsonl-00000-of-00001'}
    m['walltime_speedup_stats'] = None
  for name in ('metrics.json', 'config.gin', m['predictions_file']) + (
      (m['baseline']['predictions_file'],) if baseline else ()):
    (out / name).write_text('')
  return m


@pytest.mark.parametrize('baseline', [True, False])
def test_summary_says_where_the_outputs_are_and_when_a_run_was_reused(tmp_path, capsys,
                                                                      baseline):
  m = _metrics(tmp_path, baseline)
  infer_output.print_summary(m, str(tmp_path))
  fresh = capsys.readouterr().out
  assert fresh.startswith('demo_ende: speculative [bleu 9.45]')
  assert ('walltime speedup' in fresh) == baseline
  files = 'metrics.json, config.gin, demo_ende-predict.jsonl-00000-of-00001'
  assert f'outputs in {tmp_path}: {files}' in fresh
  assert 'reused' not in fresh and 'decode again' not in fresh
  infer_output.print_summary(m, str(tmp_path), reused=True)
  reused = capsys.readouterr().out.splitlines()
  if baseline:  # the speedup says what arithmetic the two decodes ran in
    speed = next(line for line in fresh.splitlines() if line.startswith('walltime speedup'))
    assert speed.endswith('(bfloat16, CPU kernels packed_bf16)'), speed
  assert reused[0].startswith(f'reused the run finished in {tmp_path} at ')
  assert 'nothing decoded' in reused[0] and '\n'.join(reused[1:-1]) == fresh.rstrip('\n')
  assert reused[-1] == (f'to decode again: delete {tmp_path} (or its metrics.json), or pass '
                        'another --gin.INFER_OUTPUT_DIR')


def _command(out, kernel_cache):
  env = {k: v for k, v in os.environ.items() if k not in (console.LEVEL, 'SPECDEC_CPU_KERNELS')}
  env['SPECDEC_KERNEL_CACHE'] = str(kernel_cache)
  proc = subprocess.run(
      [sys.executable, '-m', 'specdec_t5x.infer', '--gin_file=configs/spec_tiny_test.gin',
       f"--gin.INFER_OUTPUT_DIR='{out}'", '--gin.infer.num_examples=4'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


@pytest.fixture(scope='module')
def first_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('first_run')
  return root, _command(root / 'out', root / 'kernels')  # an empty kernel cache: builds


@pytest.mark.slow
def test_first_run_prints_no_startup_noise_and_names_its_pauses(first_run):
  root, proc = first_run
  assert not NOISE.search(proc.stdout + proc.stderr), proc.stderr[:3000]
  assert 'compiling the decode program (at the first batch of each input length)...' in proc.stderr
  built = re.search(r'building the CPU decode kernels \(once, ~5 s\)\.\.\. done \(\d+\.\d s\)\n',
                    proc.stderr)
  assert bool(built) == _can_build()  # an empty kernel cache
  assert proc.stdout.startswith('demo_ende: speculative [')
  assert f"outputs in {root / 'out'}: metrics.json, config.gin, demo_ende-" in proc.stdout


@pytest.mark.slow
def test_rerun_into_a_finished_directory_says_it_reused_it(first_run):
  root, _ = first_run
  proc = _command(root / 'out', root / 'kernels')
  assert not NOISE.search(proc.stdout + proc.stderr), proc.stderr[:3000]
  assert 'compiling' not in proc.stderr and 'building' not in proc.stderr  # nothing decoded
  lines = proc.stdout.splitlines()
  assert lines[0].startswith(f"reused the run finished in {root / 'out'} at ")
  assert lines[-1].startswith(f"to decode again: delete {root / 'out'} (or its metrics.json)")
