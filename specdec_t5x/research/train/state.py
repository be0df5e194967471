"""A training run's workdir: Orbax checkpoints of the train state, config.json, log.jsonl.

  <workdir>/checkpoint_<step>/state/   Orbax PyTree {'params' (float32), 'opt_state'}
  <workdir>/checkpoint_<step>/meta/    JSON {'cursors', 'elapsed', 'total_steps'}
  <workdir>/config.json                the run's settings ({'model': T5Config fields,
                                       'train': TrainConfig} for a model)
  <workdir>/log.jsonl                  one record per log, eval and end event

Orbax's `CheckpointManager` keeps the latest `keep` steps and writes each step into a
`checkpoint_<step>.orbax-checkpoint-tmp` directory renamed into place when complete, so an
interrupted save is never listed as a checkpoint; the next run removes it
(`cleanup_tmp_directories`). `load_params` reads the params of a workdir checkpoint (T5X's
Orbax layout), so a workdir is also a valid `--init_from`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from specdec_t5x.algorithm.network import T5Config, Transformer
from specdec_t5x.integration import model_dir, run_dir
from specdec_t5x.integration.checkpoints import load_params
from specdec_t5x.research.train.config import TrainConfig, changed_settings

Params = Any
STEP_PREFIX = 'checkpoint'  # Step directories are checkpoint_<step>, as T5X names them.


@dataclasses.dataclass
class Start:
  """Where a run starts: its checkpoint manager and the state at `step`."""
  manager: ocp.CheckpointManager
  params: Params
  opt_state: Any
  cursors: np.ndarray  # [tasks] int64: examples consumed per task.
  elapsed: float  # Seconds trained by earlier calls.
  total_steps: Optional[int]  # Known or fitted total (None: not yet known).
  step: int


def checkpoint_manager(workdir: str, keep: Optional[int] = None,
                       read_only: bool = False) -> ocp.CheckpointManager:
  """Orbax manager of `workdir`'s checkpoint_<step> dirs (synchronous saves)."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, step_prefix=STEP_PREFIX, create=not read_only, read_only=read_only,
      cleanup_tmp_directories=not read_only, enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(workdir), options=options,
                               item_names=('state', 'meta'))


def latest_step(workdir: str) -> Optional[int]:
  """Highest step whose checkpoint finished writing (None if there is none)."""
  if not os.path.isdir(workdir):
    return None
  with checkpoint_manager(workdir, read_only=True) as manager:
    return manager.latest_step()


def save(manager: ocp.CheckpointManager, step: int, params: Params, opt_state: Any,
         cursors: np.ndarray, elapsed: float, total_steps: Optional[int]) -> None:
  """Writes step `step` (the manager then drops all but the latest `keep`)."""
  meta = {'cursors': [int(c) for c in cursors], 'elapsed': float(elapsed),
          'total_steps': int(total_steps or 0)}
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave({'params': params, 'opt_state': opt_state}),
      meta=ocp.args.JsonSave(meta)))


def restore(manager: ocp.CheckpointManager, step: int, params: Params,
            opt_state: Any) -> tuple[Params, Any, dict[str, Any]]:
  """(params, opt_state, meta) of `step`; `params` and `opt_state` give the structure."""
  abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct,
                                    {'params': params, 'opt_state': opt_state})
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
  return restored.state['params'], restored.state['opt_state'], dict(restored.meta)


def check_config(workdir: str, model_cfg: T5Config, cfg: TrainConfig, saved: Optional[dict],
                 resuming: Optional[int], allow_changed_config: bool = False) -> None:
  """Refuses a workdir whose config.json (`saved`) holds another model, or (when
  `resuming`) other hyperparameters (see `changed_settings`) unless `allow_changed_config`."""
  if glob.glob(os.path.join(glob.escape(workdir), 'train_state_*.msgpack')):
    raise ValueError(f'{workdir} was written by an older version of this trainer '
                     '(train_state_<step>.msgpack files); use another --workdir.')
  if saved is None:
    return
  model = model_dir.config_to_dict(model_cfg)
  if saved['model'] != model:
    raise ValueError(f'{workdir} holds a different model than {model}')
  changed = changed_settings(saved.get('train', {}), cfg) if resuming else []
  if changed and not allow_changed_config:
    detail = ', '.join(f'{k}: {saved["train"][k]!r} -> {getattr(cfg, k)!r}' for k in changed)
    raise ValueError(
        f'{workdir} was trained with other hyperparameters ({detail}); resuming at step '
        f'{resuming} would mix two runs. Use another --workdir, restore the old values, '
        'or pass --allow_changed_config (train(..., allow_changed_config=True)).')


def model_config(model_cfg: T5Config, cfg: TrainConfig) -> dict[str, Any]:
  """What a model's workdir records in config.json: the model and its hyperparameters."""
  return {'model': model_dir.config_to_dict(model_cfg), 'train': dataclasses.asdict(cfg)}


def init_model(model_cfg: T5Config, cfg: TrainConfig, resuming: bool) -> Params:
  """A model's params before training: `cfg.init_from`'s for a fresh run, else random (a
  resumed run restores into their structure)."""
  if cfg.init_from and not resuming:
    return init_params_from(cfg.init_from, model_cfg)
  dummy = jnp.ones((1, 4), jnp.int32)  # [batch, length]
  return flax.core.unfreeze(Transformer(model_cfg).init(
      jax.random.PRNGKey(cfg.seed), dummy, dummy)['params'])


def remove_partial_writes(workdir: str) -> None:
  """Removes the `*.tmp-<pid>` files a kill during run_dir.write_atomic leaves behind."""
  for path in glob.glob(os.path.join(glob.escape(workdir), '*.tmp-*')):
    if os.path.isfile(path):
      os.remove(path)


def truncate_log(workdir: str, step: int) -> None:
  """Drops log.jsonl records past `step` (logged after the last save, so redone on resume)
  and a last line cut by a kill, so a resumed run never duplicates a step's records."""
  path = os.path.join(workdir, 'log.jsonl')
  if not os.path.isfile(path):
    return
  kept = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if record.get('step', 0) <= step:
        kept.append(json.dumps(record) + '\n')
  run_dir.write_atomic(path, ''.join(kept))


def init_params_from(path: str, model_cfg: T5Config) -> Params:
  """float32 params of checkpoint `path` (a checkpoint_<step> dir or its parent), which
  must match `model_cfg`'s tree and shapes (checkpoints.validate_params)."""
  try:
    loaded = load_params(path, dtype=jnp.float32, config=model_cfg)
  except ValueError as e:
    raise ValueError(f'init_from {path} does not match the model: {e}') from e
  return jax.tree_util.tree_map(jnp.asarray, loaded)


def read_config(workdir: str) -> Optional[dict[str, Any]]:
  """The workdir's config.json, or None where there is none."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def start(workdir: str, keep: Optional[int], config: dict[str, Any],
          check: Callable[[Optional[dict], Optional[int]], None],
          init: Callable[[bool], Params], tx: Any, num_tasks: int) -> Start:
  """A run's start (a model's or a draft head's): restored from the latest checkpoint, or
  fresh from `init(resuming=False)`.

  `check(saved config.json or None, the step resumed or None)` refuses a workdir (raising)
  before anything in it is touched; then interrupted saves and writes are removed, log
  records past the resumed step dropped and `config` recorded as config.json. `init(True)`
  gives the structure a checkpoint restores into. The caller closes `Start.manager`.
  """
  resuming = latest_step(workdir)
  check(read_config(workdir), resuming)
  os.makedirs(workdir, exist_ok=True)
  manager = checkpoint_manager(workdir, keep)  # Removes interrupted saves.
  remove_partial_writes(workdir)
  truncate_log(workdir, resuming or 0)
  run_dir.write_atomic(os.path.join(workdir, 'config.json'), json.dumps(config, indent=1))
  params = init(bool(resuming))
  opt_state = tx.init(params)
  if not resuming:
    return Start(manager, params, opt_state, np.zeros(num_tasks, np.int64), 0.0, None, 0)
  params, opt_state, meta = restore(manager, resuming, params, opt_state)
  return Start(manager, params, opt_state, np.asarray(meta['cursors'], np.int64),
               float(meta['elapsed']), int(meta['total_steps']) or None, resuming)
