"""Reliability of training resume: changed hyperparameters are refused
before config.json is touched, an interrupted checkpoint save never loads (and is removed),
and log.jsonl has one record per step after a resume."""

import collections
import json
import os
import shutil
import threading

import pytest

from specdec_t5x.research.train import (config as train_config, state as train_state,
                                        loop as training)
from test_training import VOCAB, data_dir, small_cfg, tiny_model  # pylint: disable=unused-import

pytestmark = pytest.mark.slow  # training runs, interrupted and resumed


@pytest.fixture(scope='module')
def resumable(data_dir, tmp_path_factory):  # pylint: disable=redefined-outer-name
  """A workdir stopped at step 2 with save_every=2 (as a kill after that save leaves it)."""
  work = str(tmp_path_factory.mktemp('rel') / 'w')
  training.train(tiny_model(), data_dir, work, small_cfg(steps=2, save_every=2))
  return work


@pytest.mark.parametrize('change,named', [
    (dict(batch_size=8), "batch_size: 4 -> 8"), (dict(learning_rate=0.5), 'learning_rate'),
    (dict(seed=3), 'seed: 0 -> 3'), (dict(optimizer='adafactor'), "optimizer: 'adamw'"),
    (dict(steps=9), 'steps: 2 -> 9')], ids=['batch', 'lr', 'seed', 'optimizer', 'steps'])
def test_resume_with_changed_hyperparameters_is_refused(data_dir, resumable, change, named):
  before = open(os.path.join(resumable, 'config.json')).read()
  with pytest.raises(ValueError, match=rf'other hyperparameters \({named}.*resuming at step 2'
                                       r'.*--allow_changed_config'):
    training.train(tiny_model(), data_dir, resumable, small_cfg(**{'steps': 2, **change}))
  assert open(os.path.join(resumable, 'config.json')).read() == before  # untouched


def test_run_control_settings_may_change(resumable):
  saved = json.load(open(os.path.join(resumable, 'config.json')))['train']
  cfg = small_cfg(steps=2, save_every=2, max_seconds=5.0, eval_every=1, keep=5)
  assert train_config.changed_settings(saved, cfg) == []


def test_allow_changed_config_resumes(data_dir, tmp_path):
  work = str(tmp_path / 'w')
  training.train(tiny_model(), data_dir, work, small_cfg(steps=2, save_every=2))
  _, summary = training.train(tiny_model(), data_dir, work, small_cfg(steps=3, seed=1),
                              allow_changed_config=True)
  assert summary['step'] == 3
  assert json.load(open(os.path.join(work, 'config.json')))['train']['seed'] == 1


def test_interrupted_save_never_loads_and_log_not_duplicated(data_dir, tmp_path):
  work = str(tmp_path / 'w')
  cfg = small_cfg(steps=4, save_every=2, log_every=1, eval_every=100)
  training.train(tiny_model(), data_dir, work, cfg)
  # What a kill during step 4's save leaves (as a kill -9 inside Orbax's save was seen to):
  # Orbax's temporary step dir, renamed to checkpoint_4 only once complete, here without
  # its meta item; a half-written config.json; and the log records past step 2.
  shutil.rmtree(os.path.join(work, 'checkpoint_4', 'meta'))
  os.rename(os.path.join(work, 'checkpoint_4'),
            os.path.join(work, 'checkpoint_4.orbax-checkpoint-tmp'))
  with open(os.path.join(work, 'config.json.tmp-4242'), 'w') as f:
    f.write('{"model": ')
  with open(os.path.join(work, 'log.jsonl'), 'a') as f:
    f.write('{"step": 4, "train_lo')  # A record cut by the kill.
  assert train_state.latest_step(work) == 2
  training.train(tiny_model(), data_dir, work, cfg)
  assert not [n for n in os.listdir(work) if 'tmp' in n]
  assert train_state.latest_step(work) == 4
  records = [json.loads(line) for line in open(os.path.join(work, 'log.jsonl'))]
  per_step = collections.Counter(r['step'] for r in records if 'train_loss' in r)
  # The first step after each start is the compile (not timed, not logged): steps 2 and
  # 4 log, and step 4, logged before the kill and again after the resume, only once.
  assert per_step == {2: 1, 4: 1}, per_step
  assert [r['step'] for r in records if r.get('event') == 'end'] == [4]


# ------------------------------------- bad data, non-finite losses and failed saves


def _copy_data(data_dir, dst, **edits):
  """data_dir's npz files copied to `dst`, with {(file, key, row, col): value} edits."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  os.makedirs(dst)
  for name in os.listdir(data_dir):
    with np.load(os.path.join(data_dir, name)) as z:
      arrays = {k: z[k].copy() for k in z.keys()}
    for (fname, key, row, col), value in edits.get('edits', {}).items():
      if fname == name:
        arrays[key][row, col] = value
    np.savez(os.path.join(dst, name), **arrays)
  return str(dst)


@pytest.mark.parametrize('value', [VOCAB, -2], ids=['vocab_size', 'negative'])
def test_token_ids_outside_the_vocabulary_are_refused_at_load(data_dir, tmp_path, value):
  model = tiny_model()
  rule = rf'\[0, {VOCAB}\)'
  bad = _copy_data(data_dir, tmp_path / 'd',
                   edits={('summarize_train.npz', 'targets', 3, 0): value})
  work = tmp_path / 'w'
  with pytest.raises(ValueError, match=rf'summarize_train.npz: targets row 3 \(column 0\) '
                                       rf'holds token id {value}, outside the vocabulary {rule}'):
    training.train(model, bad, str(work), small_cfg(steps=2))
  assert not work.exists()  # Refused before the workdir is made.


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
  work = str(tmp_path / 'w')
  training.train(tiny_model(), data_dir, work, small_cfg(steps=2, save_every=2))
  before = sorted(os.listdir(work))
  # An absurd learning rate sends the params to inf and the loss to NaN within steps.
  with pytest.raises(FloatingPointError,
                     match=r'Training stopped: (the training loss of step \d is (nan|inf)|the '
                           r'parameters are no longer finite)\. Nothing was saved after it: '
                           r'the last good checkpoint is step 2 in '):
    training.train(tiny_model(), data_dir, work,
                   small_cfg(steps=8, save_every=2, learning_rate=1e30),
                   allow_changed_config=True)
  assert train_state.latest_step(work) == 2
  assert sorted(os.listdir(work)) == before  # No checkpoint_4, no temporary save.


def test_failed_save_ends_in_one_clear_error_and_resumes(data_dir, tmp_path, monkeypatch):
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  work = str(tmp_path / 'w')
  cfg = small_cfg(steps=4, save_every=2)
  training.train(tiny_model(), data_dir, work, small_cfg(steps=2, save_every=2))
  real_save, real_open = train_state.save, ts.open

  def disk_full(*args, **kwargs):
    raise OSError(28, 'No space left on device')

  spawned = []  # Orbax's writer threads of the failed save.

  def save_on_full_disk(*args, **kwargs):  # Orbax's writer threads fail, as on a full disk.
    monkeypatch.setattr(ts, 'open', disk_full)  # From now on, as a disk stays full.
    before = set(threading.enumerate())
    try:
      return real_save(*args, **kwargs)
    finally:
      spawned.extend(set(threading.enumerate()) - before)

  monkeypatch.setattr(train_state, 'save', save_on_full_disk)
  with pytest.raises(RuntimeError, match=r'Saving the checkpoint of step 4 in .* failed '
                                         r'\(.*No space left on device.*\).*The last good '
                                         r'checkpoint is step 2: .*rerun to resume'):
    training.train(tiny_model(), data_dir, work, cfg, allow_changed_config=True)
  # Orbax's writer threads have ended (and logged) before the error: none is left to
  # print its traceback after it. Executor pool workers (asyncio.to_thread's) never print
  # one (their errors go to futures); one may still wait on a future of the failed save.
  pool = ('asyncio_', 'ThreadPoolExecutor-')
  assert not [t.name for t in spawned if t.is_alive() and not t.name.startswith(pool)]
  assert train_state.latest_step(work) == 2
  monkeypatch.setattr(train_state, 'save', real_save)
  monkeypatch.setattr(ts, 'open', real_open)
  _, summary = training.train(tiny_model(), data_dir, work, cfg, allow_changed_config=True)
  assert summary['step'] == 4 and train_state.latest_step(work) == 4


@pytest.mark.parametrize('field,value,rule', [
    ('save_every', 0, 'an integer >= 1'), ('log_every', -1, 'an integer >= 1'),
    ('batch_size', 2.5, 'an integer >= 1'), ('steps', -1, 'an integer >= 0 or None'),
    ('keep', 0, 'an integer >= 1 or None'), ('optimizer', 'sgd', "'adamw' or 'adafactor'"),
    ('learning_rate', float('nan'), 'a finite number > 0'),
    ('learning_rate', 0.0, 'a finite number > 0'),
    ('kd_weight', 1.5, r'a finite number >= 0 and <= 1'),
    ('max_seconds', -1.0, 'a finite number >= 0 or None'),
    ('mixing_rates', {'ende': 0.0}, r'None or \{task: finite rate >= 0\}, not all 0'),
])
def test_bad_train_settings_are_named(field, value, rule):
  with pytest.raises(ValueError, match=rf'TrainConfig.{field} must be {rule}, got '):
    small_cfg(**{field: value})
