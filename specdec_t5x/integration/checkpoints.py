"""T5X checkpoints (native msgpack + zarr, and Orbax) read/write.

The parameter tree is T5X's (t5x/examples/t5/network.py): nested dicts whose leaves are
numpy arrays, kernels stored 2-D as [in, out]. Format facts followed here (from
t5x/checkpoints.py and T5X's own test checkpoints):

* Native: `checkpoint_<step>/checkpoint` is a flax msgpack file holding
  {'version': 3, 'optimizer': {'target': params, 'state': {'step': step}}} (T5X's
  InferenceState layout; a training state adds 'param_states'). Leaves T5X partitions are
  written as zarr arrays (gzip, chunks <= 64 MiB) under the checkpoint directory and
  replaced in the msgpack by their tensorstore spec whose `kvstore.path` (older files: a
  top-level `path`, with a 'gcs' kvstore) is relative to the checkpoint directory. Leaves
  T5X does not partition (the step, factored optimizer moments) are inlined as flax
  msgpack ExtTypes (1 = ndarray, 3 = numpy scalar) holding packb((shape, dtype, bytes)).
  Version 3 stores bfloat16 natively; version 2 stored it as uint16.
* Orbax (newer T5X): `checkpoint_<step>/state/` is a PyTreeCheckpointHandler item holding
  the same state dict ({'target': ..., 'state': ...}).

Both are read from a local path or a URL such as gs://bucket/checkpoint_N, through the
filesystem and tensorstore drivers T5X reads with (storage.py); `save_params` writes local
directories. The tree's names and shapes (`expected_shapes`, `validate_params`) live in
param_tree.py; Hugging Face T5 weights are converted in hf_convert.py.
"""

import json
import math
import os
import re
import shutil
import tempfile
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from flax import serialization, traverse_util

from specdec_t5x.integration import storage
from specdec_t5x.integration.param_tree import Params, Path, validate_params

VERSION = 3
_CHUNK_BYTES = 64 * 1024 * 1024  # T5X's _DESIRED_CHUNK_SIZE_BYTES.
_STEP_DIR = re.compile(r'checkpoint_(\d+)$')
_ORBAX = ('_METADATA', 'manifest.ocdbt', '_sharding')  # Files of an Orbax PyTree dir.


# ------------------------------------------------------------------ native write


def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
  """Largest chunk (dims dividing the array's) within T5X's 64 MiB chunk budget."""
  chunk = [max(1, d) for d in shape]
  budget = max(1, _CHUNK_BYTES // itemsize)
  while math.prod(chunk) > budget:
    i = max(range(len(chunk)), key=lambda d: chunk[d])
    chunk[i] = max(d for d in range(1, chunk[i]) if shape[i] % d == 0)
  return chunk


def save_params(params: Mapping[str, Any], path: str, step: int = 0,
                dtype: Any = None, overwrite: bool = False) -> str:
  """Writes `params` as a native T5X checkpoint directory (conventionally checkpoint_<step>).

  Every parameter goes to a gzip zarr array (T5X partitions all T5 parameters); the step is
  inlined in the msgpack. Written under a temporary name, then renamed (atomic).

  Args:
    params: the parameter tree (numpy or jax arrays).
    path: the checkpoint directory to create.
    step: training step recorded in `state/step`.
    dtype: storage dtype of floating parameters; float32 when None (bfloat16 halves size).
    overwrite: replace an existing directory at `path` instead of raising.

  Returns:
    `path`.
  """
  if storage.is_url(path):
    raise ValueError(f'save_params writes a local directory, not {os.fspath(path)}: write it '
                     'locally and copy it there (load_params reads either).')
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(f'{path} already exists (pass overwrite=True to replace it)')
  store_dtype = jnp.dtype(dtype if dtype is not None else jnp.float32)
  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=os.path.basename(path) + '.tmp-')
  try:
    specs, writes, pending_bytes = {}, [], 0
    for key, value in traverse_util.flatten_dict(params).items():
      arr = np.asarray(value)
      if jnp.issubdtype(arr.dtype, jnp.floating):
        arr = arr.astype(store_dtype)
      name = '.'.join(('target',) + key)
      spec = {
          'driver': 'zarr',
          'dtype': arr.dtype.name,
          'kvstore': {'driver': 'file', 'path': name + '/'},
          'metadata': {'chunks': _chunk_shape(arr.shape, arr.dtype.itemsize),
                       'compressor': {'id': 'gzip', 'level': 1},
                       'shape': list(arr.shape)},
      }
      specs[key] = spec
      absolute = dict(spec, kvstore={'driver': 'file', 'path': os.path.join(tmp, name)})
      store = ts.open(absolute, create=True, delete_existing=True).result()
      writes.append(store.write(arr))
      pending_bytes += arr.nbytes
      if pending_bytes > 16 * _CHUNK_BYTES:  # Bound the host copies pending writes hold.
        for write in writes:
          write.result()
        writes, pending_bytes = [], 0
    for write in writes:
      write.result()
    state = {'version': VERSION,
             'optimizer': {'state': {'step': np.asarray(step, np.int32)},
                           'target': traverse_util.unflatten_dict(specs)}}
    with open(os.path.join(tmp, 'checkpoint'), 'wb') as f:
      f.write(serialization.msgpack_serialize(state))
    if os.path.exists(path):
      shutil.rmtree(path)
    os.rename(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path


# ------------------------------------------------------------------- native read


def _is_spec(node: Any) -> bool:
  return isinstance(node, dict) and 'driver' in node and (
      'kvstore' in node or 'path' in node)


def _array_spec(spec: Mapping[str, Any], ckpt_dir: str) -> dict[str, Any]:
  """Turns a stored spec (relative path, any kvstore driver) into one that reads the array
  where the checkpoint is: a local file, or the checkpoint's bucket (storage.kvstore).

  Only arrays inside the checkpoint directory are read: T5X writes paths relative to it,
  so an absolute path or one climbing out with '..' means a damaged or hostile file.
  """
  kvstore = spec.get('kvstore') or {}
  rel = kvstore['path'] if 'path' in kvstore else spec.get('path')
  if rel is None:
    raise ValueError(f'tensorstore spec without a path: {spec}')
  full = storage.inside(ckpt_dir, rel)
  if full is None:
    raise ValueError(f'array path {rel!r} is not inside the checkpoint directory {ckpt_dir}: '
                     'only arrays stored in the checkpoint are read (re-export the '
                     'checkpoint, or copy the arrays into it with relative paths).')
  return {'driver': spec['driver'], 'kvstore': storage.kvstore(full)}


def _read_zarray(spec: Mapping[str, Any]) -> Any:
  """A future of the `.zarray` of a zarr (or n5) array spec, else None. A chunk missing
  from an array whose fill value is null (T5X and `save_params` write every chunk) is
  then an error rather than zeros: it is what an interrupted copy leaves."""
  if spec['driver'] not in ('zarr', 'n5'):
    return None
  return ts.KvStore.open(spec['kvstore']).result().read('.zarray')


def _zarr_fill_value(zarray: Any) -> Any:
  """The fill value a `.zarray` read records (None: null, or unreadable)."""
  try:
    return json.loads(zarray.result().value).get('fill_value')
  except (OSError, ValueError):
    return None


def _load_msgpack(file: str) -> dict[str, Any]:
  """Parses a msgpack checkpoint file (flax ExtTypes decoded to numpy)."""
  try:
    contents = serialization.msgpack_restore(storage.read_bytes(file))
  except Exception as e:  # msgpack raises many types on garbage.
    raise ValueError(f'{file} is not a readable T5X checkpoint: {type(e).__name__}: {e}') from e
  if not isinstance(contents, dict):
    raise ValueError(f'{file} is not a readable T5X checkpoint: top level is '
                     f'{type(contents).__name__}, not a dict')
  return contents


def _is_orbax_aggregate(contents: Mapping[str, Any]) -> bool:
  """Old Orbax wrote a msgpack `checkpoint` whose array leaves are PLACEHOLDER strings."""
  return any(isinstance(v, str) and v.startswith('PLACEHOLDER://')
             for v in traverse_util.flatten_dict(contents).values())


def _read_native(contents: Mapping[str, Any], file: str) -> dict[Path, np.ndarray]:
  """Reads the params of a parsed native checkpoint file, opening its zarr arrays."""
  where = f'{file} is not a readable T5X checkpoint'
  version = contents.get('version', 0)
  state = contents.get('optimizer') if version else contents  # Version 0 = plain flax.
  for key in _params_location(state, where):
    state = state[key]
  flat = traverse_util.flatten_dict(state, is_leaf=lambda _, node: _is_spec(node))
  ckpt_dir = storage.dirname(file)
  key = None
  try:
    specs, zarrays, pending = {}, {}, {}
    for key, leaf in flat.items():  # Every metadata read first: on a bucket, round trips.
      if _is_spec(leaf):
        specs[key] = _array_spec(leaf, ckpt_dir)
        zarrays[key] = _read_zarray(specs[key])
    for key, spec in specs.items():
      if zarrays[key] is not None and _zarr_fill_value(zarrays[key]) is None:
        spec = dict(spec, fill_missing_data_reads=False)
      pending[key] = ts.open(spec, read=True).result().read()
    for key, future in pending.items():
      spec, arr = flat[key], future.result()
      shape = tuple(spec.get('metadata', {}).get('shape', arr.shape))
      if arr.shape != shape:
        raise ValueError(f"'{'/'.join(key)}' has shape {arr.shape}, its spec says {shape}")
      if version < 3 and arr.dtype == np.uint16:  # Version 2 stored bfloat16 as uint16.
        arr = arr.view(jnp.bfloat16)
      flat[key] = arr
  except Exception as e:
    param = f" (parameter '{'/'.join(key)}')" if key else ''
    hint = (' The checkpoint is incomplete (an interrupted copy?): copy it again.'
            if 'is missing' in str(e) else '')
    raise ValueError(f'{where}{param}: {type(e).__name__}: {e}.{hint}') from e
  return {k: np.asarray(v) for k, v in flat.items()}


# -------------------------------------------------------------------- orbax read


def _params_location(tree: Any, where: str) -> Path:
  """Key path of the params in a state tree: T5X 'target' (maybe under an optimizer)."""
  for loc in (('target',), ('params',), ('optimizer', 'target'), ('_optimizer', 'target')):
    node = tree
    for key in loc:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
      return loc
  keys = list(tree) if isinstance(tree, dict) else type(tree).__name__
  raise ValueError(f"{where}: no 'target' or 'params' tree (found {keys})")


def _read_orbax(directory: str) -> dict[Path, np.ndarray]:
  """Restores only the params of an Orbax PyTree checkpoint, as numpy arrays."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top  # slow import

  where = f'{directory} is not a readable T5X checkpoint'
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    metadata = checkpointer.metadata(directory)
    tree = getattr(getattr(metadata, 'item_metadata', metadata), 'tree', metadata)
    loc = _params_location(tree, where)
    for key in loc:
      tree = tree[key]
    keys = [loc + k for k in traverse_util.flatten_dict(tree)]
    as_numpy = ocp.RestoreArgs(restore_type=np.ndarray)
    restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
        item=traverse_util.unflatten_dict(dict.fromkeys(keys, 0)),
        restore_args=traverse_util.unflatten_dict(dict.fromkeys(keys, as_numpy)),
        partial_restore=True))
  except Exception as e:
    raise ValueError(e if str(e).startswith(where) else f'{where}: {type(e).__name__}: {e}'
                     ) from e
  flat = traverse_util.flatten_dict(restored)
  return {k[len(loc):]: np.asarray(flat[k]) for k in keys}


# ------------------------------------------------------------------------- load


def _holds_checkpoint(directory: str) -> bool:
  """A checkpoint_<step> dir that finished writing: a native `checkpoint` file, T5X's
  Orbax `state/` item, or Orbax PyTree files (an interrupted or emptied one is skipped)."""
  return storage.isdir(directory) and any(
      storage.exists(storage.join(directory, m)) for m in ('checkpoint', 'state') + _ORBAX)


def _read_any(path: str) -> dict[Path, np.ndarray]:
  """Dispatches on what `path` holds: msgpack file, native dir, Orbax dir, or a parent."""
  if storage.isfile(path):
    return _read_native(_load_msgpack(path), path)
  state_dir = storage.join(path, 'state')  # T5X's Orbax item.
  item_dir = state_dir if storage.isdir(state_dir) else path
  file = storage.join(item_dir, 'checkpoint')
  if storage.isfile(file):
    contents = _load_msgpack(file)
    if not _is_orbax_aggregate(contents):
      return _read_native(contents, file)
    return _read_orbax(item_dir)
  if item_dir == state_dir or any(storage.exists(storage.join(path, m)) for m in _ORBAX):
    return _read_orbax(item_dir)
  steps = [(int(m.group(1)), name) for name in storage.listdir(path)
           if (m := _STEP_DIR.match(name)) and _holds_checkpoint(storage.join(path, name))]
  if not steps:
    raise FileNotFoundError(
        f'No T5X checkpoint in {path}: it has no `checkpoint` file, no Orbax `state/` item '
        'and no checkpoint_<step> subdirectory')
  return _read_any(storage.join(path, max(steps)[1]))


def load_params(path: str, dtype: Any = None, config: Any = None) -> Params:
  """Loads the parameter tree of a T5X checkpoint (native or Orbax).

  `path` may be a `checkpoint_<step>` directory (native msgpack+zarr, or Orbax with a
  `state/` item), its `checkpoint` msgpack file, a bare Orbax PyTree directory with params
  under 'target' or 'params', or a parent directory holding `checkpoint_<step>`
  directories, in which case the highest step that holds a checkpoint is loaded.

  Args:
    path: where the checkpoint is: a local path, or a URL T5X reads (gs://...; see
      storage.py).
    dtype: cast every floating parameter to this dtype; None keeps the stored dtype.
    config: when given (T5Config-like), the tree must match
      `param_tree.expected_shapes(config)`.

  Returns:
    The nested params dict of numpy arrays.

  Raises:
    FileNotFoundError: `path` does not exist or holds no checkpoint.
    ValueError: the checkpoint is unreadable, or does not match `config`.
  """
  path = storage.resolve(path)
  if not storage.exists(path):
    raise FileNotFoundError(f'T5X checkpoint path does not exist: {path}')
  flat = _read_any(path)
  if dtype is not None:
    flat = {k: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
            for k, v in flat.items()}
  params = traverse_util.unflatten_dict(flat)
  if config is not None:
    validate_params(params, config)
  return params
