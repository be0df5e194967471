"""Reliability of checkpoint loading: a checkpoint missing a
zarr chunk file, or whose specs point outside its directory, is refused by name."""

import os
import shutil

import numpy as np
import pytest
from flax import serialization

from specdec_t5x.integration import checkpoints


def _params():
  rs = np.random.RandomState(0)
  return {'a': {'kernel': rs.randn(4, 6).astype(np.float32)},
          'b': {'scale': rs.randn(6).astype(np.float32)}}


def _rewrite_spec_path(ckpt, key, path):
  file = os.path.join(ckpt, 'checkpoint')
  with open(file, 'rb') as f:
    state = serialization.msgpack_restore(f.read())
  state['optimizer']['target'][key[0]][key[1]]['kvstore']['path'] = path
  with open(file, 'wb') as f:
    f.write(serialization.msgpack_serialize(state))


def test_missing_chunk_file_is_refused_not_zeros(tmp_path):
  ckpt = checkpoints.save_params(_params(), str(tmp_path / 'checkpoint_1'), step=1)
  array_dir = os.path.join(ckpt, 'target.a.kernel')
  chunks = [f for f in os.listdir(array_dir) if not f.startswith('.')]
  assert chunks  # Intact: loads bit-identically.
  np.testing.assert_array_equal(checkpoints.load_params(ckpt)['a']['kernel'],
                                _params()['a']['kernel'])
  os.remove(os.path.join(array_dir, chunks[0]))
  with pytest.raises(ValueError, match=r"parameter 'a/kernel'.*is missing.*incomplete "
                                       r'\(an interrupted copy\?\): copy it again'):
    checkpoints.load_params(ckpt)


def test_demo_checkpoint_missing_chunk_is_refused(tmp_path):
  """The reproduction on a committed checkpoint (one small array suffices)."""
  src = os.path.join(os.path.dirname(__file__), '..', 'checkpoints', 'demo', 'demo_draft_s',
                     'checkpoint_800')
  ckpt = str(tmp_path / 'checkpoint_800')
  shutil.copytree(src, ckpt)
  name = 'target.decoder.layers_0.mlp.wo.kernel'
  os.remove(os.path.join(ckpt, name, '0.0'))
  with pytest.raises(ValueError, match=r"'decoder/layers_0/mlp/wo/kernel'.*is missing"):
    checkpoints.load_params(ckpt)


@pytest.mark.parametrize('escape', ['absolute', 'dotdot'])
def test_spec_paths_outside_the_checkpoint_are_refused(tmp_path, escape):
  other = checkpoints.save_params(_params(), str(tmp_path / 'elsewhere'), step=1)
  ckpt = checkpoints.save_params(
      {'a': {'kernel': np.zeros((4, 6), np.float32)}, 'b': _params()['b']},
      str(tmp_path / 'model' / 'checkpoint_1'), step=1)
  path = (os.path.join(other, 'target.a.kernel') + '/' if escape == 'absolute'
          else '../../elsewhere/target.a.kernel/')
  _rewrite_spec_path(ckpt, ('a', 'kernel'), path)
  with pytest.raises(ValueError, match=r"array path '.*target\.a\.kernel/' is not inside the "
                                       r'checkpoint directory'):
    checkpoints.load_params(ckpt)
