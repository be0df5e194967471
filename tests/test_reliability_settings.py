"""Reliability of `python -m specdec_t5x.infer`: a run is identified by its inputs too, and
every runner and decode setting is checked before anything is read or written.

Runs configs/spec_tiny_test.gin (random tiny models, the demo EnDe task) in-process; the
refusals raise before any compilation, so only the inputs tests decode.
"""
import json
import pathlib

import gin
import pytest

from specdec_t5x.integration import infer, infer_checks, tasks

OUTPUT = 'demo_ende-predict_with_aux.jsonl-00000-of-00001'
PAIRS_A = [(f'the house number {i}', f'das Haus Nummer {i}') for i in range(8)]
PAIRS_B = [(f'a small cat {i}', f'eine kleine Katze {i}') for i in range(8)]


@pytest.fixture(autouse=True)
def _demo_tasks():
  tasks.register_tasks()
  yield
  gin.clear_config()
  tasks.register_tasks()


def _run(out, *extra):
  gin.clear_config()
  return infer.main(['--gin_file=configs/spec_tiny_test.gin',
                     f"--gin.INFER_OUTPUT_DIR='{out}'", *extra])


def _corpus(root: pathlib.Path, pairs) -> str:
  (root / 'ende').mkdir(parents=True, exist_ok=True)
  (root / 'ende' / 'test.tsv').write_text(''.join(f'{a}\t{b}\n' for a, b in pairs), 'utf-8')
  return f"--gin.infer.task_data_dir='{root}'"


def _files(out: pathlib.Path):
  return {p.relative_to(out).as_posix(): p.read_bytes()
          for p in sorted(out.rglob('*')) if p.is_file()}


# ------------------------------------------------------- a run's identity: its inputs


def test_finished_run_with_other_inputs_of_the_same_count_is_refused(tmp_path):
  data, out = tmp_path / 'data', tmp_path / 'out'
  metrics = _run(out, _corpus(data, PAIRS_A))
  recorded = metrics['run_settings']
  assert recorded['num_examples'] == 8 and len(recorded['examples_sha256']) == 64
  assert json.loads((out / 'metrics.json').read_text())['run_settings'] == recorded
  before = _files(out)
  _corpus(data, PAIRS_B)  # Same line count, other text.
  with pytest.raises(ValueError, match=r"holds a finished run with other settings "
                                       r"\(changed: \['examples_sha256'\]\); its inputs differ"
                                       r'.*infer.overwrite=True'):
    _run(out, _corpus(data, PAIRS_B))
  assert _files(out) == before  # Old predictions neither returned nor touched.
  # The same inputs again: the finished run is reused (nothing decoded).
  _corpus(data, PAIRS_A)
  assert _run(out, _corpus(data, PAIRS_A)) == metrics
  # overwrite: the run is redone for the new inputs.
  new = _run(out, _corpus(data, PAIRS_B), '--gin.infer.overwrite=True')
  assert new['run_settings']['examples_sha256'] != recorded['examples_sha256']
  rows = [json.loads(line) for line in (out / OUTPUT).read_text('utf-8').splitlines()]
  assert [r['inputs']['targets_pretokenized'] for r in rows] == [b for _, b in PAIRS_B]


def test_unfinished_run_resumes_only_for_the_same_inputs(tmp_path):
  data, out = tmp_path / 'data', tmp_path / 'out'
  with pytest.raises(RuntimeError, match='Simulated preemption'):
    _run(out, _corpus(data, PAIRS_A), '--gin.infer.preempt_after_batches=1')
  before = _files(out)
  assert any(name.startswith('tmp-') for name in before)  # One chunk made durable.
  with pytest.raises(ValueError, match=r"holds an unfinished run with other settings "
                                       r"\(changed: \['examples_sha256'\]\); its inputs"):
    _run(out, _corpus(data, PAIRS_B))
  assert _files(out) == before
  # Same inputs: resumes the chunk it has.
  metrics = _run(out, _corpus(data, PAIRS_A))
  assert metrics['resumed_chunks'] == 1


def test_inputs_hash_depends_on_every_feature_and_the_order():
  from specdec_t5x.integration.infer_run import examples_sha256  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  a = {'inputs': np.array([5, 6, 1], np.int32), 'inputs_pretokenized': b'x y'}
  b = {'inputs': np.array([5, 7, 1], np.int32), 'inputs_pretokenized': b'x y'}
  c = dict(a, inputs_pretokenized=b'x z')
  assert examples_sha256([a, b]) == examples_sha256([dict(a), dict(b)])
  assert len({examples_sha256(x) for x in ([a, b], [b, a], [a, c], [a], [a, a])}) == 5
  # The same bytes as another dtype or shape are other inputs.
  assert examples_sha256([a]) != examples_sha256([dict(a, inputs=a['inputs'].astype(np.uint32))])


# ----------------------------------------- every setting, checked before reading data


@pytest.mark.parametrize('flags,pattern', [
    (['--gin.infer.checkpoint_period=0'], r'checkpoint_period must be an integer >= 1, got 0'),
    (['--gin.infer.checkpoint_period=-1'], r'checkpoint_period must be an integer >= 1, got -1'),
    (['--gin.infer.num_shards=2', '--gin.infer.shard_id=2'],
     r'shard_id must be an integer in \[0, 2\), got 2'),
    (['--gin.infer.shard_id=-1'], r'shard_id must be an integer in \[0, 1\), got -1'),
    (['--gin.infer.num_shards=0'], r'num_shards must be an integer >= 1, got 0'),
    (['--gin.infer.num_examples=0'], r'num_examples must be an integer >= 1 or None, got 0'),
    (['--gin.infer.num_examples=2.5'], r'num_examples must be an integer >= 1 or None'),
    (["--gin.TASK_FEATURE_LENGTHS={'inputs': 0, 'targets': 16}"],
     r"task_feature_lengths\['inputs'\] \(TASK_FEATURE_LENGTHS\) must be an integer >= 1"),
    (["--gin.TASK_FEATURE_LENGTHS={'inputs': 64}"],
     r"task_feature_lengths \(TASK_FEATURE_LENGTHS\) must be a mapping with 'inputs' and "
     r"'targets'"),
    (['--gin.models.SpeculativeEncoderDecoderModel.max_decode_length=0'],
     r"max_decode_length \(the model's\) must be an integer >= 1 or None, got 0"),
    (['--gin.infer.decode_seed=-1'], r'decode_seed must be an integer in \[0, 4294967296\)'),
    (['--gin.infer.decode_seed=4294967296'], r'decode_seed must be an integer in \[0, 42'),
    (['--gin.infer.fallback_init_rng=-3'], r'fallback_init_rng must be an integer in \[0, '),
    (['--gin.infer.preempt_after_batches=-1'], r'preempt_after_batches must be an integer >= 0'),
    (['--gin.infer.overwrite=1'], r'overwrite must be True or False, got 1'),
    (['--gin.infer.allow_truncation=None'], r'allow_truncation must be True or False'),
    (["--gin.infer.mode='decode'"], r"mode must be one of \('predict', 'predict_with_aux'\)"),
    (["--gin.infer.task_data_dir='/nonexistent/data'"],
     r"task_data_dir must be an existing directory \(or None\), got '/nonexistent/data'"),
    (["--gin.infer.task_vocab_path='/nonexistent/spm.model'"],
     r'task_vocab_path must be an existing file'),
    (['--gin.BATCH_SIZE=2.5'], r'batch_size \(BATCH_SIZE\) must be an integer >= 1, got 2.5'),
    (["--gin.MIXTURE_OR_TASK_SPLIT=''"], r"split \(DatasetConfig.split\) must be a non-empty"),
    (['--gin.utils.DatasetConfig.shuffle=True'], r'DatasetConfig.shuffle must be False'),
    (['--gin.utils.DatasetConfig.pack=True'], r'DatasetConfig.pack must be False'),
    (["--gin.CHECKPOINT_DTYPE='int8'"],
     r'RestoreCheckpointConfig.dtype`? must be'),  # T5X's class checks it when built
    (['--gin.partitioning.PjitPartitioner.num_partitions=3'],
     r'num_partitions=3 must divide the number of devices'),
    (['--gin.TOPK=9000'], r'topk must be <= the vocabulary size \(8064\), got 9000'),
    (['--gin.GAMMA=17'], r'gamma must be <= max_decode_length \(16\).*got 17'),
    (['--gin.GAMMA=10000'], r'gamma must be <= 64 \(MAX_GAMMA'),
    (['--gin.TOPK=2.5'], r'topk must be an integer >= 0 \(0 = off\), got 2.5'),
    (["--gin.TEMPERATURE='hot'"], r"temperature must be a number, got 'hot'"),
], ids=lambda x: x[0] if isinstance(x, list) else None)
def test_bad_setting_refused_before_anything_is_read_or_written(tmp_path, flags, pattern):
  out = tmp_path / 'out'
  with pytest.raises(ValueError, match=pattern):
    _run(out, *flags)
  assert not out.exists()  # Not even the lock file.


def test_output_dir_that_is_a_file_is_refused_untouched(tmp_path):
  out = tmp_path / 'out'
  out.write_text('not a directory')
  with pytest.raises(ValueError, match=r'output_dir \(INFER_OUTPUT_DIR\) must be a directory '
                                       r'or a path that does not exist yet \(it is a file\)'):
    _run(out)
  assert out.read_text() == 'not a directory'
  with pytest.raises(ValueError, match=r'whose existing parent is a directory .*out is a file'):
    _run(out / 'below')


def test_every_runner_parameter_has_a_check():
  """A parameter added to infer without a rule in infer_checks fails here."""
  import inspect  # pylint: disable=g-import-not-at-top
  params = set(inspect.signature(infer.infer).parameters)
  checked = set(inspect.signature(infer_checks.check_runner_settings).parameters)
  assert params == checked
