"""gs:// checkpoints, model directories, draft files and vocabularies, read as T5X reads
them, against a local GCS: gcp-storage-emulator in a child process, with tf.io.gfile and
tensorstore pointed at it by their environment variables (tests/gcs_emulator.py says
which and why). Nothing of the loader is replaced.

The draft checkpoint is written to the bucket by T5X's own legacy Checkpointer (msgpack +
zarr, the format of the public T5 v1.1 checkpoints; on gs:// T5X stores each array's spec
with a 'gcs' kvstore and a placeholder bucket). T5X finalises a gs:// checkpoint with
`gcloud storage mv`; the CLI is not installed here, so a `gcloud` on PATH does that move
through tensorstore (gcs_emulator.install_gcloud). T5X's Orbax manager needs
google-cloud-storage on gs://, which is not installed: Orbax checkpoints on gs:// are read
by Orbax itself (checkpoints._read_orbax passes the path on) and are not covered here.
"""
import dataclasses
import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_child

pytest.importorskip('gcp_storage_emulator', reason='pip install -e ".[test]"')
pytest.importorskip('cryptography', reason='pip install -e ".[test]"')
# pylint: disable=g-import-not-at-top,g-bad-import-order
import gcs_emulator
import tensorflow as tf
from flax import serialization, traverse_util

from specdec_t5x.algorithm import network
from specdec_t5x.integration import (checkpoints, demo, draft_files, draft_state, model_dir,
                                     models, tasks, vocab_check)

REPO = pathlib.Path(__file__).resolve().parents[1]
BUCKET = 'specdec-test'
DRAFT_DIR = f'gs://{BUCKET}/t5x/draft'
DRAFT = f'{DRAFT_DIR}/checkpoint_1'


@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  """The emulator, this process's (and its children's) environment pointed at it, and a
  `gcloud` for T5X on PATH."""
  root = tmp_path_factory.mktemp('gcs')
  proc, env = gcs_emulator.start(root, BUCKET)
  try:
    with pytest.MonkeyPatch.context() as mp:
      for key, value in env.items():
        mp.setenv(key, value)
      bin_dir = os.path.dirname(gcs_emulator.install_gcloud(root / 'bin'))
      mp.setenv('PATH', bin_dir + os.pathsep + os.environ['PATH'])
      yield env
  finally:
    proc.terminate()
    proc.wait(timeout=60)
    proc.stdin.close()
    proc.stdout.close()


def _upload(local, url):
  tf.io.gfile.copy(str(local), url, overwrite=True)


def _flat(params):
  return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}


def _assert_same_params(got, want):
  got, want = _flat(got), _flat(want)
  assert sorted(got) == sorted(want)
  for key in want:
    assert got[key].dtype == want[key].dtype, key
    np.testing.assert_array_equal(got[key], want[key], err_msg='/'.join(key))


@pytest.fixture(scope='module')
def t5x_draft(gcs, tmp_path_factory):
  """A target and a noisy draft (test_t5x_infer's tiny models), written by T5X locally, and
  the draft also by T5X to DRAFT_DIR."""
  pytest.importorskip('t5x', reason='T5X is not installed (not on PyPI; see docs/t5x.md)')
  import test_t5x_infer as card
  from t5x import adafactor, partitioning, train_state
  from t5x import checkpoints as t5x_checkpoints
  root = tmp_path_factory.mktemp('t5x_ckpts')
  target = card._t5x_variables(0)  # pylint: disable=protected-access
  draft = card._noisy(target, 1)  # pylint: disable=protected-access
  local = {name: card._t5x_save(v, root / name, orbax=False)  # pylint: disable=protected-access
           for name, v in (('target', target), ('draft', draft))}
  state = train_state.FlaxOptimTrainState.create(adafactor.Adafactor(), draft)
  state = state.replace_step(jnp.asarray(1, jnp.int32))
  t5x_checkpoints.Checkpointer(state, partitioning.PjitPartitioner(num_partitions=1),
                               DRAFT_DIR).save(state)
  return dict(card=card, root=root, local=local, draft=draft)


def test_load_params_from_gs_equals_the_local_restore(t5x_draft):
  """The checkpoint directory and its `checkpoint` file, from the bucket: every array
  equal to the same checkpoint read from local disk, and to the params T5X saved."""
  stored = serialization.msgpack_restore(tf.io.gfile.GFile(f'{DRAFT}/checkpoint', 'rb').read())
  spec = stored['optimizer']['target']['decoder']['logits_dense']['kernel']
  assert spec['kvstore']['driver'] == 'gcs'  # T5X's gs:// format, not a copied local one
  local = checkpoints.load_params(t5x_draft['local']['draft'])
  _assert_same_params(local, t5x_draft['draft']['params'])
  for path in (DRAFT, f'{DRAFT}/', f'{DRAFT}/checkpoint'):
    _assert_same_params(checkpoints.load_params(path), local)


def test_model_directory_on_gs(t5x_draft):
  """config.json and the highest checkpoint_<step> of a model directory in the bucket."""
  card = t5x_draft['card']
  config = network.T5Config(**{f.name: getattr(card.CONFIG, f.name)
                              for f in dataclasses.fields(network.T5Config)})
  with tf.io.gfile.GFile(f'{DRAFT_DIR}/{model_dir.CONFIG}', 'w') as f:
    f.write(json.dumps(model_dir.config_to_dict(config)))
  got_config, params = model_dir.load(DRAFT_DIR)
  assert got_config == config
  _assert_same_params(params, jax.tree_util.tree_map(
      lambda x: np.asarray(x, np.float32), t5x_draft['draft']['params']))


def test_ngram_draft_file_on_gs(gcs, tmp_path):
  del gcs
  rs = np.random.RandomState(0)
  params = {'logits': rs.randn(6, 6).astype(np.float32)}
  draft_files.save_ngram(str(tmp_path / 'bigram.npz'), params, 6)
  _upload(tmp_path / 'bigram.npz', f'gs://{BUCKET}/drafts/bigram.npz')
  local_module, local = draft_files.load_ngram(str(tmp_path / 'bigram.npz'))
  module, loaded = draft_files.load_ngram(f'gs://{BUCKET}/drafts/bigram.npz')
  assert type(module) is type(local_module)
  _assert_same_params(loaded, local)
  with pytest.raises(FileNotFoundError, match=f"No n-gram draft at 'gs://{BUCKET}/drafts/no.npz'"):
    draft_files.load_ngram(f'gs://{BUCKET}/drafts/no.npz')


@pytest.mark.parametrize('path', [f'gs://{BUCKET}/nothing/checkpoint_1',
                                  'gs://no-such-bucket-specdec/draft/checkpoint_1'],
                         ids=['missing_object', 'missing_bucket'])
def test_missing_gs_checkpoint_is_named_exactly(gcs, path):
  """The error names the gs:// path as given (not a local path made of it)."""
  del gcs
  with pytest.raises(FileNotFoundError) as error:
    checkpoints.load_params(path)
  assert str(error.value) == f'T5X checkpoint path does not exist: {path}'
  with pytest.raises(FileNotFoundError) as error:
    models.load_checkpoint(path, macro='DRAFT_CHECKPOINT', what='Draft')
  assert f'Draft checkpoint not found: {path!r}. Set the gin macro DRAFT_CHECKPOINT' in str(
      error.value)
  assert 'gsutil' not in str(error.value) and os.getcwd() not in str(error.value)
  with pytest.raises(FileNotFoundError, match=re.escape(path)):
    draft_state.restore_draft({}, {'flax_mutables': {'draft': {}}}, checkpoint=path)


_UNREACHABLE = '''
import json, sys
from specdec_t5x.integration import checkpoints
try:
  checkpoints.load_params(sys.argv[1])
except Exception as e:
  print('RESULT ' + json.dumps([type(e).__name__, str(e)]))
'''


def test_unreachable_gcs_error_names_the_path(gcs):
  """No connection at all (the proxy TensorFlow's client goes through is gone; one
  attempt, no retries): an OSError that names the gs:// path."""
  del gcs
  name, message = run_child(_UNREACHABLE, DRAFT, https_proxy='http://127.0.0.1:9',
                            GCS_RETRY_CONFIG_MAX_RETRIES='0')
  assert name == 'OSError' and message.startswith(f'Cannot read {DRAFT}: '), message


def _rewrite_spec(url, key, rel):
  contents = serialization.msgpack_restore(tf.io.gfile.GFile(url, 'rb').read())
  contents['optimizer']['target'][key[0]][key[1]]['kvstore']['path'] = rel
  with tf.io.gfile.GFile(url, 'wb') as f:
    f.write(serialization.msgpack_serialize(contents))


def test_gs_checkpoint_safety_checks(gcs, tmp_path):
  """A missing chunk is an error (not zeros) and an array path outside the checkpoint is
  refused, in a bucket as on local disk."""
  del gcs
  rs = np.random.RandomState(0)
  params = {'a': {'kernel': rs.randn(4, 6).astype(np.float32)},
            'b': {'scale': rs.randn(6).astype(np.float32)}}
  local = checkpoints.save_params(params, str(tmp_path / 'checkpoint_1'), step=1)
  url = f'gs://{BUCKET}/safety/checkpoint_1'
  for directory, _, files in os.walk(local):
    for name in files:
      _upload(os.path.join(directory, name), url + os.path.join(directory, name)[len(local):])
  _assert_same_params(checkpoints.load_params(url), params)
  _rewrite_spec(f'{url}/checkpoint', ('a', 'kernel'), '../elsewhere/target.a.kernel/')
  with pytest.raises(ValueError, match=re.escape(
      f"array path '../elsewhere/target.a.kernel/' is not inside the checkpoint directory "
      f'{url}:')):
    checkpoints.load_params(url)
  _rewrite_spec(f'{url}/checkpoint', ('a', 'kernel'), 'target.a.kernel/')
  _assert_same_params(checkpoints.load_params(url), params)
  chunks = [n for n in tf.io.gfile.listdir(f'{url}/target.a.kernel') if not n.startswith('.')]
  assert chunks
  tf.io.gfile.remove(f'{url}/target.a.kernel/{chunks[0]}')
  with pytest.raises(ValueError, match=r"parameter 'a/kernel'.*is missing.*incomplete"):
    checkpoints.load_params(url)


class _Vocab:  # what vocab_check reads of a seqio.SentencePieceVocabulary
  def __init__(self, path, extra_ids=0):
    self.sentencepiece_model_file, self.extra_ids = path, extra_ids


def test_vocab_check_hashes_gs_sentencepiece_models(gcs, tmp_path):
  """A SentencePiece model and a vocabulary record in the bucket are read and hashed,
  not skipped: the same model matches, another is refused naming the record."""
  del gcs
  spm = demo.vocab_path(REPO)
  remote, other = f'gs://{BUCKET}/vocab/demo_spm.model', f'gs://{BUCKET}/vocab/other.model'
  _upload(spm, remote)
  with tf.io.gfile.GFile(other, 'wb') as f:
    f.write(pathlib.Path(spm).read_bytes() + b'another model')
  assert vocab_check.file_sha256(remote) == vocab_check.file_sha256(spm)
  assert vocab_check.file_sha256(other) != vocab_check.file_sha256(spm)
  assert vocab_check.same_sentencepiece(_Vocab(spm), _Vocab(remote))
  assert not vocab_check.same_sentencepiece(_Vocab(spm), _Vocab(other))
  assert not vocab_check.same_sentencepiece(_Vocab(remote), _Vocab(remote, extra_ids=100))
  record = vocab_check.record_vocabulary(str(tmp_path), spm)
  model = f'gs://{BUCKET}/vocab_model'
  _upload(record, f'{model}/{vocab_check.RECORD}')
  found = vocab_check.find_record(f'{model}/checkpoint_7')
  assert found['record'] == f'{model}/{vocab_check.RECORD}'
  assert found['sha256'] == vocab_check.file_sha256(spm)
  vocab_check.check_checkpoints_vocabulary(_Vocab(remote), {'DRAFT_CHECKPOINT': model})
  with pytest.raises(ValueError, match=f'The task vocabulary \\({other}, extra_ids=0\\) is not '
                                       f'the one DRAFT_CHECKPOINT {model} was trained with.*'
                                       f'per {model}/{vocab_check.RECORD}'):
    vocab_check.check_checkpoints_vocabulary(_Vocab(other), {'DRAFT_CHECKPOINT': model})


@pytest.mark.slow  # two python -m t5x.infer subprocesses
def test_card_command_restores_the_draft_from_gs(t5x_draft):
  """`python -m t5x.infer --gin_file=configs/spec_t5_small_xxl.gin` (test_t5x_infer's
  tiny overrides) with DRAFT_CHECKPOINT on gs://: the same predictions and per-example
  speculative statistics, token for token, as with the draft's local copy."""
  card, root = t5x_draft['card'], t5x_draft['root']
  lines = pathlib.Path(tasks.demo_tsv_path('ende', 'test')).read_text('utf-8').splitlines()
  (root / 'corpus' / 'ende').mkdir(parents=True)
  (root / 'corpus' / 'ende' / 'test.tsv').write_text(
      '\n'.join(lines[:card.NUM_EXAMPLES]) + '\n')
  (root / 'tiny_demo_tasks.py').write_text(
      'from specdec_t5x import tasks\n'
      f'tasks.register_tasks(data_dir={str(root / "corpus")!r})\n')
  env = dict(root=root, ckpts={'gcs': dict(t5x_draft['local'], draft=DRAFT),
                               'local': t5x_draft['local']})
  rows, logged = {}, {}
  for where in ('gcs', 'local'):
    rows[where], logged[where] = card._t5x_infer(  # pylint: disable=protected-access
        env, root / f'out_{where}', where, '--gin.GAMMA=3')
  assert len(rows['gcs']) == card.NUM_EXAMPLES and any(r['prediction'] for r in rows['gcs'])
  assert rows['gcs'] == rows['local']
  assert logged['gcs'] == logged['local']
  assert 0 < float(logged['gcs'][-1][2]) < 1  # the noisy draft: some drafts rejected
