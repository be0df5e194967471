"""Multi-host runs of `python -m specdec_t5x.infer`, with real processes on localhost.

Two processes of 4 CPU devices each, joined by jax.distributed over a free local port
(gloo collectives), against one process of 8 devices: the same mesh (data 4, model 2),
so the predictions must agree row for row in every mode: greedy and sampled, a draft
chain and a draft tree, a T5 draft and a feature head, with the interleaved baseline,
and a finished run reused.
Then the failures: processes given other settings are refused before decoding; a process
that never joins, or that is killed mid-run, stops the other within a minute with no
metrics.json written; the same command then resumes and completes. Every process runs
under a timeout. The models are the random tiny ones of configs/spec_tiny_test.gin.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import REPO

from specdec_t5x.integration import infer

pytestmark = pytest.mark.slow  # several processes, each compiling its programs

TIMEOUT = 420  # seconds, per process

# Runs infer.main once per run in argv[1] (a JSON list of [name, flags]); with a process
# count > 1 it first joins the others (process index argv[2] of argv[3], port argv[4]).
# KILL_AFTER_BATCHES=n: this process kills itself (SIGKILL) before its (n+1)-th batch,
# noting the time in $KILL_AFTER_BATCHES_NOTE.
_DRIVER = textwrap.dedent('''
    import json, os, signal, sys, time
    from specdec_t5x.integration import infer as runner, infer_run, multihost
    runs, index, count, port = json.loads(sys.argv[1]), *map(int, sys.argv[2:5])
    if count > 1:
      multihost.initialize(f'127.0.0.1:{port}', count, index)
    kill_after = os.environ.get('KILL_AFTER_BATCHES')
    if kill_after:
      run = infer_run.BatchRunner.run
      def run_then_die(self, *args, **kwargs):
        if self.batches_run >= int(kill_after):
          with open(os.environ['KILL_AFTER_BATCHES_NOTE'], 'w') as f:
            f.write(str(time.time()))
          os.kill(os.getpid(), signal.SIGKILL)
        return run(self, *args, **kwargs)
      infer_run.BatchRunner.run = run_then_die
    out = {}
    for name, flags in runs:
      metrics = runner.main(flags)  # (it binds the name `infer` here to its function)
      out[name] = {k: metrics.get(k) for k in ('resumed_chunks', 'num_processes',
                                               'num_devices', 'accepted_tokens')}
    print('RESULT ' + json.dumps(out))
''')

_HEAD_GIN = """
from __gin__ import dynamic_registration
from specdec_t5x.algorithm import feature_draft
include 'configs/spec_tiny_test.gin'
DRAFT_CONFIG = @feature_draft.FeatureDraftConfig()
feature_draft.FeatureDraftConfig:
  vocab_size = 8064
  target_emb_dim = 32
  emb_dim = 16
  num_heads = 2
  head_dim = 8
  mlp_dim = 32
"""

FILE = 'demo_ende-predict_with_aux.jsonl-00000-of-00001'
BASELINE_FILE = 'demo_ende-predict_with_aux-baseline.jsonl-00000-of-00001'


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _flags(out, *extra, gin_file='configs/spec_tiny_test.gin', examples=16):
  return [f'--gin_file={gin_file}', f"--gin.INFER_OUTPUT_DIR='{out}'",
          '--gin.partitioning.PjitPartitioner.num_partitions=2', '--gin.BATCH_SIZE=8',
          f'--gin.infer.num_examples={examples}', '--gin.infer.checkpoint_period=1', *extra]


def _launch(runs, count, devices, per_process=None, port=None):
  """Starts `count` driver processes at once; returns [(rc, stdout, stderr, end time)].
  `per_process`: {index: (more flags for every run, more environment)}."""
  port = port or _free_port()
  procs = []
  for index in range(count):
    flags, env = (per_process or {}).get(index, ((), {}))
    env = dict(os.environ, XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
               JAX_PLATFORMS='cpu', **env)
    argv = json.dumps([[name, list(f) + list(flags)] for name, f in runs])
    procs.append(subprocess.Popen(
        [sys.executable, '-c', _DRIVER, argv, str(index), str(count), str(port)], cwd=REPO,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  results = []
  for proc in procs:
    try:
      stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise
    results.append((proc.returncode, stdout, stderr, time.time()))
  return results


def _result(launched):
  for rc, stdout, stderr, _ in launched:
    assert rc == 0, stderr[-4000:]
  lines = [l for l in launched[0][1].splitlines() if l.startswith('RESULT ')]
  return json.loads(lines[-1][len('RESULT '):])


def _rows(path):
  return [json.loads(line) for line in pathlib.Path(path).read_text('utf-8').splitlines()]


def _same_rows(path, ref):
  """The two files' rows are equal, each row's beta_sum to float32 rounding: a sum over the
  vocabulary, whose order follows how the logits are sharded."""
  rows, ref_rows = _rows(path), _rows(ref)
  betas = [[r.get('aux', {}).pop('beta_sum', 0.0) for r in x] for x in (rows, ref_rows)]
  return rows == ref_rows and np.allclose(*betas, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module')
def head_gin(tmp_path_factory):
  path = tmp_path_factory.mktemp('gin') / 'head.gin'
  path.write_text(_HEAD_GIN, 'utf-8')
  return str(path)


def _runs(root, head_gin):
  sampled = ('--gin.TEMPERATURE=1.0', '--gin.infer.decode_seed=7')
  return [  # greedy: a T5 draft's chain, and the baseline; sampled: the chain, a head's tree
      ('greedy', _flags(root / 'greedy', '--gin.infer.compare_baseline=True')),
      ('sampled', _flags(root / 'sampled', *sampled)),
      ('head_tree', _flags(root / 'head_tree', *sampled, '--gin.GAMMA=2',
                           '--gin.config.DecodeConfig.draft_tree_width=2', gin_file=head_gin)),
  ]


@pytest.fixture(scope='module')
def reference(tmp_path_factory, head_gin):
  """Every run in one process of 8 devices."""
  root = tmp_path_factory.mktemp('one_process')
  return root, _result(_launch(_runs(root, head_gin), 1, 8))


def test_two_processes_decode_as_one(tmp_path, head_gin, reference):
  ref_root, ref = reference
  runs = _runs(tmp_path, head_gin)
  launched = _launch(runs + runs[:1], 2, 4)  # the first again: the finished run, reused
  got = _result(launched)
  assert 'reused the run finished' in launched[0][1]
  assert not [l for l in launched[1][1].splitlines() if l.startswith(('demo_ende', 'reused'))]
  for name, _ in runs:
    assert _same_rows(tmp_path / name / FILE, ref_root / name / FILE), name
    assert got[name]['num_processes'] == 2 and ref[name]['num_processes'] is None
    assert got[name]['num_devices'] == ref[name]['num_devices'] == 8
    assert got[name]['accepted_tokens'] == ref[name]['accepted_tokens'], name
    assert not (tmp_path / name / 'tmp-demo_ende-00000-of-00001').exists()
  assert _same_rows(tmp_path / 'greedy' / BASELINE_FILE, ref_root / 'greedy' / BASELINE_FILE)
  assert got['sampled']['accepted_tokens'] > 0  # the sampled runs accept draft tokens
  metrics = json.loads((tmp_path / 'greedy' / 'metrics.json').read_text('utf-8'))
  assert metrics['num_examples'] == 16 and 'walltime_speedup' in json.dumps(metrics)


def test_a_killed_process_stops_the_other_and_the_rerun_resumes(tmp_path, head_gin,
                                                                 reference):
  ref_root, _ = reference
  run = [r for r in _runs(tmp_path, head_gin) if r[0] == 'sampled']
  note = tmp_path / 'killed_at'
  launched = _launch(run, 2, 4, per_process={1: ((), {
      'KILL_AFTER_BATCHES': '1', 'KILL_AFTER_BATCHES_NOTE': str(note)})})
  (rc0, _, err0, end0), (rc1, _, _, _) = launched
  assert rc1 == -9 and rc0 != 0, err0[-3000:]
  assert end0 - float(note.read_text()) < 60
  assert 'detected fatal errors' in err0, err0[-3000:]
  out = tmp_path / 'sampled'
  assert not (out / 'metrics.json').exists() and not (out / FILE).exists()
  assert (out / 'tmp-demo_ende-00000-of-00001' / f'{FILE}-chunk00000').exists()
  got = _result(_launch(run, 2, 4))
  assert got['sampled']['resumed_chunks'] == 1
  assert _same_rows(out / FILE, ref_root / 'sampled' / FILE)


def test_other_settings_or_a_missing_process_are_refused(tmp_path):
  """Process 1 with another GAMMA: both refuse before decoding. Meanwhile a process
  whose partner never starts gives up within a minute."""
  lone = subprocess.Popen(
      [sys.executable, '-c', _DRIVER, json.dumps([['x', _flags(tmp_path / 'lone')]]), '0',
       '2', str(_free_port())], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  start = time.time()
  run = [('mixed', _flags(tmp_path / 'mixed'))]
  launched = _launch(run, 2, 4, per_process={1: (('--gin.GAMMA=3',), {})})
  for rc, _, stderr, _ in launched:
    assert rc != 0 and 'with other settings than process 0' in stderr, stderr[-3000:]
  assert "differs in ['gamma', 'gin']" in launched[1][2]
  assert not list((tmp_path / 'mixed').iterdir())  # nothing written
  _, stderr = lone.communicate(timeout=TIMEOUT)
  assert lone.returncode != 0 and time.time() - start < 60, stderr[-3000:]
  assert 'must join within' in stderr and not (tmp_path / 'lone').exists()


def test_start_up_names_what_is_missing(tmp_path):
  proc = subprocess.run(
      [sys.executable, '-m', 'specdec_t5x.infer', '--multihost',
       '--gin_file=configs/spec_tiny_test.gin'], cwd=REPO, capture_output=True, text=True,
      timeout=120, env=dict(os.environ, JAX_PLATFORMS='cpu',
                            JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{_free_port()}'))
  assert proc.returncode != 0
  assert '--process_count=N' in proc.stderr and '--process_index' in proc.stderr, proc.stderr
  with pytest.raises(SystemExit):
    infer.main(['--process_count=2', '--gin_file=configs/spec_tiny_test.gin'])


# Each of 2 processes: the Python API on arrays placed over the 8 devices of both (the
# target and draft by the partitioner, the batch from this process's rows), gathered, and
# the same decode on this process's first device alone; then the compiled loop audit of
# the 2-process program (research/measure/hlo_loops.py, as tests/test_compiled_loops.py).
_API_CHILD = textwrap.dedent('''
    import json, os, sys
    os.environ['XLA_FLAGS'] += ' --xla_backend_optimization_level=0'
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental import multihost_utils
    from specdec_t5x.integration import multihost, partitioning
    multihost.initialize(f'127.0.0.1:{sys.argv[2]}', 2, int(sys.argv[1]))
    from specdec_t5x import generate
    from specdec_t5x.algorithm import api, network
    from specdec_t5x.algorithm.config import DecodeConfig
    from specdec_t5x.algorithm.cpu import packing
    from specdec_t5x.research.measure import hlo_loops
    assert jax.device_count() == 8 and jax.local_device_count() == 4

    def model(emb, layers, seed):
      cfg = network.T5Config(vocab_size=64, emb_dim=emb, num_heads=4, num_encoder_layers=layers,
                             num_decoder_layers=layers, head_dim=8, mlp_dim=2 * emb,
                             mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
      module, dummy = network.Transformer(cfg), jnp.ones((1, 4), jnp.int32)
      return module, module.init(jax.random.PRNGKey(seed), dummy, dummy)['params']

    target, draft = model(32, 2, 0), model(16, 1, 1)
    x = np.random.RandomState(0).randint(2, 64, size=(4, 12)).astype(np.int32)
    x[1, 7:] = x[3, 3:] = 0
    part = partitioning.PjitPartitioner(num_partitions=2)
    tp, dp = part.shard_params(target[1]), part.shard_params(draft[1])
    start, stop = part.host_rows(4)
    xs = part.shard_host_rows(x[start:stop], 4, start)
    out = {'rows': [start, stop], 'params_global': not tp['decoder']['logits_dense'][
        'kernel'].is_fully_addressable}
    local = jax.local_devices()[0]
    for temperature in (0.0, 1.0):
      kw = dict(gamma=3, max_decode_length=10, temperature=temperature,
                rng=jax.random.PRNGKey(3))
      got = generate((target[0], tp), xs, draft=(draft[0], dp), **kw)
      tokens, stats = multihost_utils.process_allgather((got.tokens, got.stats), tiled=True)
      with jax.default_device(local):
        ref = generate(target, x, draft=draft, **kw)
      out[f'tokens_{temperature}'] = bool(np.array_equal(tokens, np.asarray(ref.tokens)))
      out[f'stats_{temperature}'] = all(  # beta_sum: a float sum in the sharding's order
          np.allclose(stats[k], ref.stats[k], rtol=1e-5) if k == 'beta_sum'
          else np.array_equal(stats[k], np.asarray(ref.stats[k])) for k in ref.stats)
    fn = api.compiled_program(target[0], draft[0], max_len=16, config=DecodeConfig(gamma=3))
    args = (packing.decode_variables(target[0], tp), packing.decode_variables(draft[0], dp),
            xs, jax.random.PRNGKey(0), jnp.int32(1))
    cache = 1 * 2 * 8 * (16 + 2)  # one row, 2 of the 4 heads, head_dim, the cache slots
    found = hlo_loops.loop_traffic(fn.lower(*args).compile().as_text(), cache)
    out['whole_buffer'] = found.summary()['whole_buffer']
    print('RESULT ' + json.dumps(out))
''')


def test_generate_on_arrays_spread_over_two_processes():
  port, procs = _free_port(), []
  for index in range(2):
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
               JAX_PLATFORMS='cpu', SPECDEC_CPU_KERNELS='0')
    procs.append(subprocess.Popen([sys.executable, '-c', _API_CHILD, str(index), str(port)],
                                  cwd=REPO, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
  outs = []
  for proc in procs:
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, stderr[-4000:]
    outs.append(json.loads([l for l in stdout.splitlines() if l.startswith('RESULT ')][-1][7:]))
  assert [o['rows'] for o in outs] == [[0, 2], [2, 4]]  # each feeds its half of the batch
  for out in outs:
    assert out['params_global'], out
    for key in ('tokens_0.0', 'stats_0.0', 'tokens_1.0', 'stats_1.0'):
      assert out[key], (key, out)
    assert out['whole_buffer'] == [], out
