"""Tests for specdec_t5x.checkpoints: T5X's native format (read/write), Orbax, errors.

Hermetic: a tiny random tree shaped by `expected_shapes`; native checkpoints are also
written here by hand with raw tensorstore + msgpack, independently of `save_params`.
"""

import dataclasses
import os
import subprocess
import sys

import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
import tensorstore as ts
from flax import traverse_util

from specdec_t5x.integration import checkpoints, param_tree


@dataclasses.dataclass(frozen=True)
class TinyConfig:
  """Any object with T5Config's fields will do; this one avoids importing network.py."""
  vocab_size: int = 40
  dtype: str = 'float32'
  emb_dim: int = 8
  num_heads: int = 2
  num_encoder_layers: int = 2
  num_decoder_layers: int = 1
  head_dim: int = 4
  mlp_dim: int = 12
  mlp_activations: tuple = ('gelu', 'linear')
  dropout_rate: float = 0.0
  logits_via_embedding: bool = False


def random_params(config=TinyConfig(), seed=0):
  rng = np.random.default_rng(seed)
  return traverse_util.unflatten_dict({
      k: rng.standard_normal(s).astype(np.float32)
      for k, s in param_tree.expected_shapes(config).items()})


def flat(tree):
  return traverse_util.flatten_dict(tree)


def tree_map(fn, tree):
  return traverse_util.unflatten_dict({k: fn(v) for k, v in flat(tree).items()})


def bf16_rounded(params):
  return tree_map(lambda x: x.astype(jnp.bfloat16).astype(np.float32), params)


def assert_trees_equal(got, want, dtype=None):
  got, want = flat(got), flat(want)
  assert got.keys() == want.keys()
  for k in want:
    expected = want[k] if dtype is None else want[k].astype(dtype)
    assert got[k].dtype == expected.dtype, k
    np.testing.assert_array_equal(got[k], expected, err_msg=str(k))


def ext_ndarray(arr):
  """flax's msgpack ExtType 1: packb((shape, dtype name, raw bytes))."""
  return msgpack.ExtType(1, msgpack.packb((list(arr.shape), arr.dtype.name, arr.tobytes())))


def write_native_by_hand(ckpt_dir, params, storage, layout, inline=lambda key: False):
  """Writes a T5X native checkpoint with raw tensorstore + msgpack (no library code)."""
  os.makedirs(ckpt_dir)
  zarr_dtype = {'float32': '<f4', 'bfloat16': 'bfloat16'}[storage]
  target = {}
  for key, arr in flat(params).items():
    name = '.'.join(('target',) + key)
    if inline(key):
      leaf = ext_ndarray(arr)
    else:
      meta = {'chunks': list(arr.shape), 'compressor': {'id': 'gzip', 'level': 1},
              'shape': list(arr.shape)}
      store = ts.open({'driver': 'zarr', 'metadata': dict(meta, dtype=zarr_dtype),
                       'kvstore': {'driver': 'file', 'path': os.path.join(ckpt_dir, name)}},
                      create=True).result()
      store.write(arr.astype(jnp.dtype(storage))).result()
      if layout == 'kvstore_path':  # T5X with tensorstore >= 0.1.14.
        leaf = {'driver': 'zarr', 'dtype': storage, 'metadata': meta,
                'kvstore': {'driver': 'file', 'path': name + '/'}}
      else:  # Older T5X: top-level path, dummy GCS bucket (the public T5 checkpoints).
        leaf = {'driver': 'zarr', 'path': name, 'metadata': dict(meta, dtype=zarr_dtype),
                'kvstore': {'bucket': 't5x-dummy-bucket', 'driver': 'gcs'}}
    node = target
    for part in key[:-1]:
      node = node.setdefault(part, {})
    node[key[-1]] = leaf
  step = ext_ndarray(np.asarray(5, np.int32))
  payload = {'version': 3, 'optimizer': {'state': {'step': step}, 'target': target}}
  with open(os.path.join(ckpt_dir, 'checkpoint'), 'wb') as f:
    f.write(msgpack.packb(payload))


def test_expected_shapes_count_t5_1_1_sizes():
  """Parameter counts of T5 v1.1 small / base agree with the published 77M / 248M."""
  small = TinyConfig(vocab_size=32128, emb_dim=512, num_heads=6, num_encoder_layers=8,
                     num_decoder_layers=8, head_dim=64, mlp_dim=1024)
  base = dataclasses.replace(small, emb_dim=768, num_heads=12, num_encoder_layers=12,
                             num_decoder_layers=12, mlp_dim=2048)
  count = lambda c: sum(np.prod(s) for s in param_tree.expected_shapes(c).values())
  assert round(count(small) / 1e6) == 77
  assert round(count(base) / 1e6) == 248
  relu = param_tree.expected_shapes(TinyConfig(mlp_activations=('relu',),
                                               logits_via_embedding=True))
  assert ('encoder', 'layers_0', 'mlp', 'wi', 'kernel') in relu
  assert ('decoder', 'logits_dense', 'kernel') not in relu


@pytest.mark.parametrize('storage', ['float32', 'bfloat16'])
@pytest.mark.parametrize('layout', ['kvstore_path', 'top_level_path'])
def test_load_independently_written_native(tmp_path, storage, layout):
  params = random_params()
  inline = lambda key: key[-1] == 'scale'  # Small leaves inlined in the msgpack.
  write_native_by_hand(str(tmp_path / 'checkpoint_5'), params, storage, layout, inline)
  stored = {k: v if inline(k) else v.astype(jnp.dtype(storage)) for k, v in flat(params).items()}
  loaded = checkpoints.load_params(tmp_path / 'checkpoint_5', config=TinyConfig())
  assert_trees_equal(loaded, traverse_util.unflatten_dict(stored))
  as_f32 = checkpoints.load_params(tmp_path / 'checkpoint_5' / 'checkpoint', dtype=np.float32)
  assert_trees_equal(as_f32, traverse_util.unflatten_dict(stored), dtype=np.float32)


def test_save_load_round_trip_float32_is_bit_identical(tmp_path):
  params = random_params()
  path = checkpoints.save_params(params, tmp_path / 'checkpoint_7', step=7)
  assert_trees_equal(checkpoints.load_params(path, config=TinyConfig()), params)
  with open(os.path.join(path, 'checkpoint'), 'rb') as f:  # T5X's on-disk layout.
    raw = msgpack.unpackb(f.read(), strict_map_key=False)
  assert raw['version'] == 3 and set(raw['optimizer']) == {'target', 'state'}
  spec = raw['optimizer']['target']['encoder']['layers_0']['attention']['query']['kernel']
  assert spec['kvstore'] == {'driver': 'file',
                             'path': 'target.encoder.layers_0.attention.query.kernel/'}
  assert spec['metadata']['shape'] == [8, 8] and spec['metadata']['compressor']['id'] == 'gzip'
  assert os.path.isdir(os.path.join(path, 'target.encoder.layers_0.attention.query.kernel'))
  for key, leaf in traverse_util.flatten_dict(  # Every spec opens as T5X would open it.
      raw['optimizer']['target'], is_leaf=lambda _, node: 'driver' in node).items():
    absolute = dict(leaf, kvstore={'driver': 'file',
                                   'path': os.path.join(path, leaf['kvstore']['path'])})
    np.testing.assert_array_equal(ts.open(absolute, open=True).result().read().result(),
                                  flat(params)[key])
  step = raw['optimizer']['state']['step']
  assert step.code == 1 and msgpack.unpackb(step.data) == [[], 'int32', b'\x07\0\0\0']
  assert not [p for p in os.listdir(tmp_path) if '.tmp-' in p]  # Atomic: no temp left.


def test_chunks_divide_the_array_and_fit_t5x_budget():
  chunk_shape = checkpoints._chunk_shape  # pylint: disable=protected-access
  for shape in [(32128, 4096), (4096, 10240), (64, 32), (7,), ()]:
    chunk = chunk_shape(shape, 4)
    assert np.prod(chunk) * 4 <= 64 * 2**20
    assert all(s % c == 0 for s, c in zip(shape, chunk))
  assert chunk_shape((32128, 4096), 4) == [4016, 4096]


def test_save_bfloat16_storage_and_jax_input(tmp_path):
  params = random_params()
  jax_params = tree_map(jnp.asarray, params)
  path = checkpoints.save_params(jax_params, tmp_path / 'checkpoint_0', dtype=jnp.bfloat16)
  assert_trees_equal(checkpoints.load_params(path), params, dtype=jnp.bfloat16)
  assert_trees_equal(checkpoints.load_params(path, dtype=jnp.float32),
                     bf16_rounded(params))
  with pytest.raises(FileExistsError):
    checkpoints.save_params(params, path)
  checkpoints.save_params(params, path, overwrite=True)
  assert_trees_equal(checkpoints.load_params(path), params)


def test_parent_directory_loads_latest_step(tmp_path):
  checkpoints.save_params(random_params(seed=1), tmp_path / 'checkpoint_2', step=2)
  checkpoints.save_params(random_params(seed=2), tmp_path / 'checkpoint_10', step=10)
  assert_trees_equal(checkpoints.load_params(tmp_path), random_params(seed=2))


def test_parent_directory_skips_step_dirs_without_a_checkpoint(tmp_path):
  checkpoints.save_params(random_params(seed=1), tmp_path / 'checkpoint_2', step=2)
  (tmp_path / 'checkpoint_10').mkdir()  # interrupted write, or files removed
  assert_trees_equal(checkpoints.load_params(tmp_path), random_params(seed=1))
  (tmp_path / 'checkpoint_2' / 'checkpoint').unlink()
  with pytest.raises(FileNotFoundError, match='no checkpoint_<step> subdirectory'):
    checkpoints.load_params(tmp_path)


def test_orbax_checkpoint_manager_as_t5x_saves(tmp_path):
  """T5X's Orbax path: CheckpointManager, item 'state', step prefix 'checkpoint'."""
  ocp = pytest.importorskip('orbax.checkpoint')
  params = random_params()
  state = {'target': tree_map(jnp.asarray, params), 'state': {'step': jnp.int32(3)}}
  manager = ocp.CheckpointManager(
      str(tmp_path), item_handlers={'state': ocp.PyTreeCheckpointHandler(use_ocdbt=True)},
      options=ocp.CheckpointManagerOptions(step_prefix='checkpoint'))
  manager.save(3, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)))
  manager.wait_until_finished()
  manager.close()
  assert os.path.isdir(tmp_path / 'checkpoint_3' / 'state')
  assert_trees_equal(checkpoints.load_params(tmp_path / 'checkpoint_3', config=TinyConfig()),
                     params)
  assert_trees_equal(checkpoints.load_params(tmp_path, dtype=jnp.bfloat16), params,
                     dtype=jnp.bfloat16)


def test_orbax_standard_checkpointer_params_tree(tmp_path):
  ocp = pytest.importorskip('orbax.checkpoint')
  params = random_params()
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / 'pytree', {'params': params})
  checkpointer.wait_until_finished()
  assert_trees_equal(checkpoints.load_params(tmp_path / 'pytree'), params)


def test_missing_path_and_empty_dir_raise_file_not_found(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    checkpoints.load_params(tmp_path / 'nope')
  with pytest.raises(FileNotFoundError, match='No T5X checkpoint'):
    checkpoints.load_params(tmp_path)


def test_corrupt_files_raise_value_error(tmp_path):
  bad = tmp_path / 'checkpoint_1'
  bad.mkdir()
  (bad / 'checkpoint').write_bytes(b'\xc1 definitely not msgpack')
  with pytest.raises(ValueError, match='is not a readable T5X checkpoint'):
    checkpoints.load_params(bad)
  path = checkpoints.save_params(random_params(), tmp_path / 'checkpoint_2')
  name = 'target.decoder.layers_0.mlp.wo.kernel'
  for chunk in os.listdir(os.path.join(path, name)):
    if not chunk.startswith('.'):
      with open(os.path.join(path, name, chunk), 'wb') as f:
        f.write(b'garbage')  # Not gzip.
  with pytest.raises(ValueError, match='is not a readable T5X checkpoint'):
    checkpoints.load_params(path)


def test_config_mismatch_names_the_parameter(tmp_path):
  params = random_params()
  path = checkpoints.save_params(params, tmp_path / 'checkpoint_0')
  with pytest.raises(ValueError, match=r"decoder/layers_0/mlp/wi_0/kernel.*\(8, 12\).*\(8, 16\)"):
    checkpoints.load_params(path, config=TinyConfig(mlp_dim=16))
  del params['decoder']['logits_dense']
  path = checkpoints.save_params(params, tmp_path / 'checkpoint_1')
  with pytest.raises(ValueError, match=r"decoder/logits_dense/kernel.*None.*\(8, 40\)"):
    checkpoints.load_params(path, config=TinyConfig())
  with pytest.raises(ValueError, match=r"decoder/layers_0/mlp/wi/kernel.*None"):
    checkpoints.load_params(path, config=TinyConfig(mlp_activations=('relu',)))


def test_checkpoint_modules_import_without_torch():
  """T5X checkpoints need no torch: HF conversion imports torch/safetensors lazily."""
  code = ('import sys\n'
          'import specdec_t5x.integration.checkpoints, specdec_t5x.integration.hf_convert\n'
          'print(sorted(m for m in ("torch", "transformers", "safetensors") if m in sys.modules))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       check=True).stdout.strip().splitlines()[-1]
  assert out == '[]', f'importing the checkpoint modules loaded {out}'
