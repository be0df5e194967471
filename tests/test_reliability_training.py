"""Reliability of training resume: changed hyperparameters are refused
before config.json is touched, an interrupted checkpoint save never loads (and is removed),
and log.jsonl has one record per step after a resume."""

import collections
import json
import os
import shutil

import pytest

from specdec_t5x.research import train_config, train_state, training
from test_training import data_dir, small_cfg, tiny_model  # pylint: disable=unused-import

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
