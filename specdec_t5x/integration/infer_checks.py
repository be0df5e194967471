"""Every setting of the inference runner, checked before any data is read or file written.

`checked_first` wraps `infer.infer`: each of its arguments (and the fields of the dataset,
checkpoint and decode configurations it is given) is checked against its rule, and the
first that breaks one raises a ValueError naming the setting (with its gin macro where
the run files use one), the value and the rule. Only then is the output directory locked
and created, so a refused run leaves no trace. What needs the task or the checkpoints
(vocabularies, checkpoint paths) is checked by the runner right after, still before any
example or weight is read.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, Mapping, Optional

MODES = ('predict', 'predict_with_aux')
SEED_LIMIT = 2 ** 32  # jax.random.PRNGKey(s) == PRNGKey(s + 2**32): larger seeds collide.
RESTORE_DTYPES = (None, 'float32', 'bfloat16', 'float16')


def _refuse(name: str, value: Any, rule: str) -> None:
  raise ValueError(f'{name} must be {rule}, got {value!r}.')


def _is_int(value: Any) -> bool:
  if isinstance(value, (bool, str)) or value is None:
    return False
  try:
    return int(value) == value
  except (TypeError, ValueError):
    return False


def check_int(name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None,
              optional: bool = False) -> None:
  """Refuses `value` unless it is an integer in [low, high) (or None when `optional`)."""
  if optional and value is None:
    return
  rule = ('an integer' + (f' >= {low}' if low is not None and high is None else '')
          + (f' in [{low}, {high})' if low is not None and high is not None else '')
          + (' or None' if optional else ''))
  if (not _is_int(value) or (low is not None and value < low)
      or (high is not None and value >= high)):
    _refuse(name, value, rule)


def check_bool(name: str, value: Any) -> None:
  if not isinstance(value, bool):
    _refuse(name, value, 'True or False')


def _check_path(name: str, value: Any, kind: str) -> None:
  """None, a remote path (not checked here), or an existing local file / directory."""
  if value is None:
    return
  if not isinstance(value, (str, os.PathLike)) or not str(value):
    _refuse(name, value, f'a path to a {kind} or None')
  path = str(value)
  if '://' in path:
    return
  exists = os.path.isdir(path) if kind == 'directory' else os.path.isfile(path)
  if not exists:
    _refuse(name, value, f'an existing {kind} (or None)')


def check_output_dir(output_dir: Any) -> None:
  """A directory, or a path where one can be made (its nearest existing parent is a
  writable directory)."""
  if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir):
    _refuse('output_dir (INFER_OUTPUT_DIR)', output_dir, 'a directory path')
  path = os.path.abspath(str(output_dir))
  if os.path.exists(path) and not os.path.isdir(path):
    _refuse('output_dir (INFER_OUTPUT_DIR)', str(output_dir),
            'a directory or a path that does not exist yet (it is a file)')
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    _refuse('output_dir (INFER_OUTPUT_DIR)', str(output_dir),
            f'a path whose existing parent is a directory ({parent} is a file)')
  if not os.access(parent, os.W_OK | os.X_OK):
    _refuse('output_dir (INFER_OUTPUT_DIR)', str(output_dir),
            f'writable ({parent} is not)')


def check_dataset_cfg(cfg: Any) -> None:
  """DatasetConfig: task and split named, lengths and batch size positive, no shuffle or
  packing (the runner decodes every example once, in the source's order)."""
  for field, macro in (('mixture_or_task_name', 'MIXTURE_OR_TASK_NAME'),
                       ('split', 'DatasetConfig.split')):
    value = getattr(cfg, field, None)
    if not isinstance(value, str) or not value:
      _refuse(f'{field} ({macro})', value, 'a non-empty string')
  lengths = getattr(cfg, 'task_feature_lengths', None)
  if not isinstance(lengths, Mapping) or not {'inputs', 'targets'} <= set(lengths):
    _refuse('task_feature_lengths (TASK_FEATURE_LENGTHS)', lengths,
            "a mapping with 'inputs' and 'targets'")
  for key in ('inputs', 'targets'):
    check_int(f"task_feature_lengths['{key}'] (TASK_FEATURE_LENGTHS)", lengths[key], 1)
  if not _is_int(cfg.batch_size):
    _refuse('batch_size (BATCH_SIZE)', cfg.batch_size, 'an integer >= 1')
  if cfg.batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {cfg.batch_size} (BATCH_SIZE).')
  for field in ('shuffle', 'pack'):
    if getattr(cfg, field, False):
      _refuse(f'DatasetConfig.{field}', getattr(cfg, field),
              'False: the runner decodes every example once, in the order of the source '
              '(resumable chunks depend on it)')
  module = getattr(cfg, 'module', None)
  if module is not None and (not isinstance(module, str) or not module):
    _refuse('DatasetConfig.module (MIXTURE_OR_TASK_MODULE)', module,
            'a module name or None')


def check_restore_cfg(cfg: Any) -> None:
  if cfg.mode == 'all' or not isinstance(cfg.path, (str, type(None))):
    raise ValueError('Restore one checkpoint: RestoreCheckpointConfig.mode must be '
                     "'specific' or 'latest' and its path a string.")
  if cfg.dtype not in RESTORE_DTYPES:
    _refuse('RestoreCheckpointConfig.dtype (CHECKPOINT_DTYPE)', cfg.dtype,
            f'one of {RESTORE_DTYPES}')


def check_model(model: Any, dataset_cfg: Any) -> None:
  """The model's decode length and its decode settings against its networks."""
  for method in ('predict_batch_with_stats', 'describe', 'decode_config'):
    if not hasattr(model, method):
      _refuse('model (MODEL)', type(model).__name__,
              'a specdec_t5x.models.SpeculativeEncoderDecoderModel')
  check_int('max_decode_length (the model\'s)', model.max_decode_length, 1, optional=True)
  max_len = model.max_decode_length or dataset_cfg.task_feature_lengths['targets']
  vocab_size = getattr(getattr(model.target_module, 'config', None), 'vocab_size', None)
  model.decode_config.check_models(vocab_size=vocab_size, max_decode_length=int(max_len),
                                   speculative=model.is_speculative)


def check_runner_settings(*, mode, model, dataset_cfg, restore_checkpoint_cfg, output_dir,
                          partitioner, checkpoint_period, shard_id, num_shards,
                          allow_truncation, num_examples, decode_seed, fallback_init_rng,
                          task_vocab_path, task_data_dir, tfds_data_dir,
                          preempt_after_batches, compare_baseline, overwrite) -> None:
  """Raises ValueError for the first argument of `infer` that breaks its rule."""
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}, got {mode!r}.')
  check_dataset_cfg(dataset_cfg)
  check_restore_cfg(restore_checkpoint_cfg)
  check_model(model, dataset_cfg)
  check_output_dir(output_dir)
  if partitioner is not None and not all(
      hasattr(partitioner, m) for m in ('shard_params', 'shard_batch')):
    _refuse('partitioner', type(partitioner).__name__,
            'None or a partitioning.PjitPartitioner (shard_params, shard_batch)')
  if partitioner is not None:
    getattr(partitioner, 'mesh')  # Built now: a bad num_partitions fails before any read.
  check_int('checkpoint_period', checkpoint_period, 1)
  check_int('num_shards', num_shards, 1)
  check_int('shard_id', shard_id, 0, num_shards)
  check_int('num_examples', num_examples, 1, optional=True)
  check_int('decode_seed', decode_seed, 0, SEED_LIMIT)
  check_int('fallback_init_rng', fallback_init_rng, 0, SEED_LIMIT - 1, optional=True)
  check_int('preempt_after_batches', preempt_after_batches, 0, optional=True)
  for name, value in (('allow_truncation', allow_truncation),
                      ('compare_baseline', compare_baseline), ('overwrite', overwrite)):
    check_bool(name, value)
  _check_path('task_vocab_path', task_vocab_path, 'file')
  _check_path('task_data_dir', task_data_dir, 'directory')
  _check_path('tfds_data_dir', tfds_data_dir, 'directory')


def checked_first(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Decorates the runner so that `check_runner_settings` sees all its arguments (the
  defaults included) before `fn`, and the lock it holds, runs."""
  signature = inspect.signature(fn)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    check_runner_settings(**bound.arguments)
    return fn(*args, **kwargs)
  return wrapper
