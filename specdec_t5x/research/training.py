"""Teacher-forced training of small T5 v1.1 models on a multitask mixture of token arrays.

Data: `{data_dir}/{task}_{split}.npz`, int32 `inputs` [N, in_len] and `targets` [N, tgt_len]
(0-padded, EOS 1 included). Batches mix tasks example by example (proportional to size by
default, as T5's mixtures), each task read in seeded epoch permutations, so batch `s` is a
function of (seed, s, per-task cursors) and a resumed run sees the same batches.
Optimizer: AdamW + linear warmup + cosine decay by default (see `train`); T5's Adafactor +
rsqrt is an option. `steps=None` fits the cosine to `max_seconds` from the step rate
measured just after compiling (the warmup does not depend on the total).
Workdir: `checkpoint_<step>/` (T5X native params, float32), `train_state_<step>.msgpack`
(optimizer state, data cursors, elapsed time, total steps), `config.json`, `log.jsonl`;
the latest `keep` checkpoints are kept and every write is atomic (temp + rename).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import math
import os
import re
import shutil
import time
from typing import Any, Mapping, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import serialization

from specdec_t5x.algorithm import api
from specdec_t5x.integration import run_dir, vocab_check
from specdec_t5x.integration.checkpoints import load_params, save_params
from specdec_t5x.algorithm.network import T5Config, Transformer

Batch = dict[str, np.ndarray]
Params = Any

_V11 = dict(vocab_size=8192, head_dim=64, mlp_activations=('gelu', 'linear'),
            dropout_rate=0.1, logits_via_embedding=False)
# name -> (emb_dim, num_heads, encoder = decoder layers, mlp_dim[, other T5Config fields]).
# The demo family ties input and output embeddings (logits_via_embedding) so that all
# three fit the 40 MB commit budget in bf16; the target is decoder-heavy (3 + 4 layers)
# because per-token decode cost, which speculative decoding saves, lives in the decoder.
_TIED = {'logits_via_embedding': True}
PRESETS = {
    'demo_target': (384, 6, 3, 768, {**_TIED, 'num_decoder_layers': 4}),  # 15.8M params.
    'demo_draft_m': (128, 2, 2, 512, _TIED),  # 2.2M.
    'demo_draft_s': (64, 1, 1, 256, _TIED),  # 0.6M.
    'tiny': (32, 2, 1, 64),  # For tests and smoke runs.
}
_STATE_FILE = re.compile(r'train_state_(\d+)\.msgpack$')


def model_config(name: str, **overrides: Any) -> T5Config:
  """A T5 v1.1-style PRESETS entry (gated GELU, untied logits, head_dim 64, vocab 8192).

  `overrides`: any T5Config field, plus `layers` (encoder and decoder layers alike).
  """
  if name not in PRESETS:
    raise ValueError(f'Unknown model {name!r}; presets: {sorted(PRESETS)}')
  emb, heads, layers, mlp, *extra = PRESETS[name]
  layers = overrides.pop('layers', layers)
  kw = {**_V11, 'emb_dim': emb, 'num_heads': heads, 'num_encoder_layers': layers,
        'num_decoder_layers': layers, 'mlp_dim': mlp, **(extra[0] if extra else {}),
        **overrides}
  kw['dtype'] = jnp.dtype(kw.get('dtype', jnp.float32))  # Names too; one hash per dtype.
  return T5Config(**kw)


def config_to_dict(cfg: T5Config) -> dict[str, Any]:
  """JSON-able T5Config fields (dtype by name); `T5Config(**d)` rebuilds it."""
  d = dataclasses.asdict(cfg)
  d['dtype'], d['mlp_activations'] = jnp.dtype(cfg.dtype).name, list(cfg.mlp_activations)
  return d


def num_params(params: Params) -> int:
  return sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))


@dataclasses.dataclass
class TrainConfig:
  """Training hyperparameters; `steps=None` fits the cosine schedule to `max_seconds`."""
  steps: Optional[int] = 10_000
  batch_size: int = 64
  optimizer: str = 'adamw'  # 'adamw' or 'adafactor'.
  schedule: str = 'cosine'  # 'cosine' (to final_lr_fraction * peak) or 'rsqrt'.
  learning_rate: float = 2e-3
  warmup_steps: int = 500
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.01
  z_loss: float = 1e-4
  mixing_rates: Optional[Mapping[str, float]] = None  # None: proportional to size.
  max_seconds: Optional[float] = None  # Budget per call, compile included.
  save_every: int = 1000
  eval_every: int = 500
  log_every: int = 50
  num_val_examples: int = 512  # Per task, a fixed seeded subset of the validation split.
  keep: int = 2
  seed: int = 0
  init_from: Optional[str] = None  # A checkpoint dir whose params start a fresh run.
  teacher: Optional[str] = None  # A model dir (config.json + checkpoint_*) for token-level KD.
  kd_weight: float = 0.5  # Weight of KL(teacher || model) when a teacher is given.


def load_split(data_dir: str, split: str) -> dict[str, dict[str, np.ndarray]]:
  """{task: {'inputs', 'targets'}} from every `{task}_{split}.npz` in `data_dir`."""
  files = sorted(glob.glob(os.path.join(data_dir, f'*_{split}.npz')))
  if not files:
    raise FileNotFoundError(f'No *_{split}.npz files in {data_dir}')
  tasks = {}
  for f in files:
    with np.load(f) as z:
      tasks[os.path.basename(f)[:-len(f'_{split}.npz')]] = {k: z[k].astype(np.int32)
                                                            for k in ('inputs', 'targets')}
  return tasks


def make_batch(inputs: np.ndarray, targets: np.ndarray) -> Batch:
  """T5X feature dict; decoder inputs are the targets shifted right behind BOS 0."""
  dec_in = np.zeros_like(targets)  # [batch, tgt_len]
  dec_in[:, 1:] = targets[:, :-1]
  return {'encoder_input_tokens': inputs, 'decoder_input_tokens': dec_in,
          'decoder_target_tokens': targets}


class Mixture:
  """Deterministic multitask batches: `batch(step, cursors) -> (batch, new cursors)`.

  Each example picks a task with probability `rates`; task t then yields its next example
  of a seeded per-epoch permutation. `cursors[t]` counts task t's examples consumed.
  """

  def __init__(self, tasks: Mapping[str, Mapping[str, np.ndarray]], batch_size: int,
               seed: int = 0, rates: Optional[Mapping[str, float]] = None):
    self.names = sorted(tasks)
    self.tasks, self.batch_size, self.seed = tasks, batch_size, seed
    if rates is not None and set(rates) - set(self.names):
      raise ValueError(f'Mixing rates for unknown tasks: {set(rates) - set(self.names)}')
    raw = np.array([len(tasks[n]['inputs']) if rates is None else rates.get(n, 0.0)
                    for n in self.names], np.float64)
    self.rates = raw / raw.sum()  # [tasks]
    self._perm = {}

  def _permutation(self, t: int, epoch: int) -> np.ndarray:
    if self._perm.get(t, (None,))[0] != epoch:
      n = len(self.tasks[self.names[t]]['inputs'])
      self._perm[t] = (epoch, np.random.default_rng([self.seed, t, epoch]).permutation(n))
    return self._perm[t][1]

  def batch(self, step: int, cursors: np.ndarray) -> tuple[Batch, np.ndarray]:
    rng = np.random.default_rng([self.seed, 1 << 20, step])
    which = rng.choice(len(self.names), size=self.batch_size, p=self.rates)  # [batch]
    inputs, targets = (np.zeros((self.batch_size, self.tasks[self.names[0]][k].shape[1]),
                                np.int32) for k in ('inputs', 'targets'))  # [batch, len]
    cursors = np.array(cursors, np.int64)
    for t, name in enumerate(self.names):
      rows = np.flatnonzero(which == t)
      n = len(self.tasks[name]['inputs'])
      idx = np.array([self._permutation(t, p // n)[p % n]
                      for p in range(cursors[t], cursors[t] + len(rows))], np.int64)
      inputs[rows] = self.tasks[name]['inputs'][idx]
      targets[rows] = self.tasks[name]['targets'][idx]
      cursors[t] += len(rows)
    return make_batch(inputs, targets), cursors


def validation_batches(tasks: Mapping[str, Mapping[str, np.ndarray]], batch_size: int,
                       num_examples: int, seed: int = 1234) -> list[tuple[str, Batch]]:
  """Fixed held-out batches per task (a seeded subset), padded with all-zero rows."""
  out = []
  for name in sorted(tasks):
    inp, tgt = tasks[name]['inputs'], tasks[name]['targets']
    idx = np.sort(np.random.default_rng(seed).permutation(len(inp))[:num_examples])
    for s in range(0, len(idx), batch_size):
      rows = idx[s:s + batch_size]
      pad = ((0, batch_size - len(rows)), (0, 0))
      out.append((name, make_batch(np.pad(inp[rows], pad), np.pad(tgt[rows], pad))))
  return out


def loss_fn(params: Params, model: Transformer, batch: Batch, z_loss: float,
            dropout_rng: Optional[jax.Array], teacher_logits: Optional[jax.Array] = None,
            kd_weight: float = 0.0) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Mean loss over non-pad targets; aux (sum of cross-entropy on the targets, count).

  Loss per token: (1 - kd_weight) * CE(target token) + kd_weight * KL(p_teacher || q)
  + z_loss * logsumexp^2. With teacher logits [batch, len, vocab] this is token-level
  knowledge distillation (forward KL, as DistillSpec recommends for drafts): q learns the
  teacher's whole distribution, which is what alpha = E[sum_x min(p, q)] rewards at any
  temperature, not only its argmax.
  """
  logits = model.apply(
      {'params': params}, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
      batch['decoder_target_tokens'], enable_dropout=dropout_rng is not None,
      rngs=None if dropout_rng is None else {'dropout': dropout_rng})  # [batch, len, vocab]
  targets = batch['decoder_target_tokens']  # [batch, len]
  weights = (targets > 0).astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)  # [batch, len]
  ce = lse - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  per_token = ce
  if teacher_logits is not None:
    teacher = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32))
    log_q = logits.astype(jnp.float32) - lse[..., None]
    kl = jnp.sum(jnp.exp(teacher) * (teacher - log_q), axis=-1)  # [batch, len]
    per_token = (1.0 - kd_weight) * ce + kd_weight * kl
  count = weights.sum()
  loss = jnp.sum((per_token + z_loss * lse ** 2) * weights) / jnp.maximum(count, 1.0)
  return loss, (jnp.sum(ce * weights), count)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """The update direction at unit learning rate; the step multiplies in lr(step)."""
  if cfg.optimizer == 'adamw':
    matrices = lambda p: jax.tree_util.tree_map(lambda x: x.ndim > 1, p)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(1.0, b1=0.9, b2=0.98, eps=1e-9,
                                   weight_decay=cfg.weight_decay, mask=matrices))
  if cfg.optimizer == 'adafactor':  # T5's defaults (factored, clip 1.0, param scale).
    return optax.adafactor(learning_rate=None)
  raise ValueError(f'Unknown optimizer {cfg.optimizer!r} (adamw or adafactor)')


def learning_rate(step: int, cfg: TrainConfig, total_steps: Optional[int]) -> float:
  """Linear warmup to the peak, then cosine to the total (peak until it is known) or rsqrt."""
  peak, warm = cfg.learning_rate, max(cfg.warmup_steps, 1)
  if step < warm:
    return peak * (step + 1) / warm
  if cfg.schedule == 'rsqrt':
    return peak * math.sqrt(warm / (step + 1))
  if cfg.schedule != 'cosine':
    raise ValueError(f'Unknown schedule {cfg.schedule!r} (cosine or rsqrt)')
  if not total_steps:
    return peak
  frac = min(max((step - warm) / max(total_steps - warm, 1), 0.0), 1.0)
  low = cfg.final_lr_fraction
  return peak * (low + (1 - low) * 0.5 * (1 + math.cos(math.pi * frac)))


@functools.lru_cache(maxsize=16)
def make_steps(model_cfg: T5Config, optimizer: str, weight_decay: float, z_loss: float,
               teacher_cfg: Optional[T5Config] = None, kd_weight: float = 0.0):
  """Jitted (train_step, eval_step, optimizer), cached so restarts in-process reuse them.

  train_step(params, opt_state, batch, lr, key, step, teacher_params=None): with a
  `teacher_cfg`, the teacher's logits on the same batch feed the KD term of `loss_fn`.
  """
  model = Transformer(model_cfg)
  teacher = None if teacher_cfg is None else Transformer(teacher_cfg)
  tx = make_optimizer(TrainConfig(optimizer=optimizer, weight_decay=weight_decay))

  def train_step(params, opt_state, batch, lr, key, step, teacher_params=None):
    teacher_logits = None
    if teacher is not None:
      teacher_logits = teacher.apply(
          {'params': teacher_params}, batch['encoder_input_tokens'],
          batch['decoder_input_tokens'], batch['decoder_target_tokens'])  # [b, len, V]
    (loss, (ce_sum, count)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, model, batch, z_loss, jax.random.fold_in(key, step), teacher_logits, kd_weight)
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree_util.tree_map(lambda u: (lr * u).astype(u.dtype), updates)
    return optax.apply_updates(params, updates), opt_state, {
        'loss': loss, 'ce_sum': ce_sum, 'count': count}  # Loss includes the z-loss.

  def eval_step(params, batch):
    return loss_fn(params, model, batch, 0.0, None)[1]

  return jax.jit(train_step, donate_argnums=(0, 1)), jax.jit(eval_step), tx


def evaluate(params: Params, eval_step: Any, batches: list[tuple[str, Batch]]) -> dict[str, float]:
  """Mean per-token cross-entropy per task ('val_loss_<task>') and overall ('val_loss')."""
  sums: dict[str, list] = {}
  for name, batch in batches:
    sums.setdefault(name, []).append(eval_step(params, batch))
  totals = {k: np.sum(jax.device_get(v), axis=0) for k, v in sums.items()}  # [2]: ce, n
  totals['val_loss'] = sum(totals.values())
  return {k if k == 'val_loss' else f'val_loss_{k}': float(ce / max(n, 1.0))
          for k, (ce, n) in totals.items()}


def latest_step(workdir: str) -> Optional[int]:
  """Highest step with both its params checkpoint and its train state written."""
  names = os.listdir(workdir) if os.path.isdir(workdir) else []
  steps = [int(m.group(1)) for f in names if (m := _STATE_FILE.match(f)) and
           os.path.isfile(f'{workdir}/checkpoint_{m.group(1)}/checkpoint')]
  return max(steps, default=None)


def save_checkpoint(workdir: str, step: int, params: Params, opt_state: Any,
                    extra: Mapping[str, Any], keep: int = 2) -> None:
  """Params as T5X `checkpoint_<step>`, the rest in `train_state_<step>.msgpack`."""
  save_params(jax.device_get(params), f'{workdir}/checkpoint_{step}', step=step, overwrite=True)
  state = {'opt_state': jax.device_get(opt_state), **{k: np.asarray(v) for k, v in extra.items()}}
  run_dir.write_atomic(f'{workdir}/train_state_{step}.msgpack', serialization.to_bytes(state))
  steps = sorted(int(m.group(1)) for f in os.listdir(workdir) if (m := _STATE_FILE.match(f)))
  for old in steps[:-keep]:
    os.remove(f'{workdir}/train_state_{old}.msgpack')
    shutil.rmtree(f'{workdir}/checkpoint_{old}', ignore_errors=True)


def restore_checkpoint(workdir: str, step: int, opt_state: Any, extra: Mapping[str, Any]):
  """(params, opt_state, extra) saved at `step`; templates give the tree structures."""
  params = jax.tree_util.tree_map(jnp.asarray, load_params(f'{workdir}/checkpoint_{step}'))
  template = {'opt_state': opt_state, **{k: np.asarray(v) for k, v in extra.items()}}
  with open(f'{workdir}/train_state_{step}.msgpack', 'rb') as f:
    state = serialization.from_bytes(template, f.read())
  return params, jax.tree_util.tree_map(jnp.asarray, state.pop('opt_state')), state


def export_params(params: Params, out_dir: str, model_cfg: T5Config, step: int,
                  vocab_path: Optional[str] = None) -> str:
  """Final params in bfloat16 as `out_dir/checkpoint_<step>` plus `out_dir/config.json`
  (and `out_dir/vocabulary.json` recording `vocab_path`, see vocab_check)."""
  path = save_params(jax.device_get(params), f'{out_dir}/checkpoint_{step}', step=step,
                     dtype=jnp.bfloat16, overwrite=True)
  run_dir.write_atomic(f'{out_dir}/config.json', json.dumps(config_to_dict(model_cfg)))
  if vocab_path:
    vocab_check.record_vocabulary(out_dir, vocab_path)
  return path


def load_exported(model_dir: str, dtype: Any = jnp.float32) -> tuple[T5Config, Params]:
  """(config with no dropout, float32 params) of an `export_params` dir: its config.json
  and its highest-step checkpoint (checkpoints.load_params on the parent directory)."""
  with open(os.path.join(model_dir, 'config.json')) as f:
    fields = json.load(f)
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
  config = T5Config(**dict(fields, dtype=jnp.dtype(dtype), dropout_rate=0.0))
  params = load_params(model_dir, dtype=jnp.float32, config=config)
  return config, jax.tree_util.tree_map(jnp.asarray, params)


def _synced_time(x: Any) -> float:
  jax.block_until_ready(x)
  return time.time()


# TrainConfig fields a resumed run may change: they stop, save, log or evaluate the run
# but do not change its parameters (`steps` does, through the cosine schedule).
_RUN_CONTROL = ('max_seconds', 'save_every', 'eval_every', 'log_every', 'num_val_examples',
                'keep', 'init_from')


def changed_settings(saved: Mapping[str, Any], cfg: TrainConfig) -> list[str]:
  """TrainConfig fields that differ from a workdir's saved `train` config and would change
  the resumed parameters (run-control fields and `steps` under rsqrt excepted)."""
  now = json.loads(json.dumps(dataclasses.asdict(cfg)))
  free = _RUN_CONTROL + (('steps',) if cfg.schedule == 'rsqrt' else ())
  return sorted(k for k in now if k not in free and k in saved and saved[k] != now[k])


def _clean_orphans(workdir: str) -> None:
  """Removes what a kill mid-save leaves: `checkpoint_N.tmp-*` dirs and `*.tmp-<pid>` files."""
  for path in glob.glob(os.path.join(glob.escape(workdir), '*.tmp-*')):
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)


def _truncate_log(workdir: str, step: int) -> None:
  """Drops log.jsonl records past `step` (logged after the last save, so redone on resume)
  and a last line cut by a kill, so a resumed run never duplicates a step's records."""
  path = f'{workdir}/log.jsonl'
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


def _start(workdir: str, model_cfg: T5Config, cfg: TrainConfig, tx, num_tasks: int,
           allow_changed_config: bool = False):
  """(params, opt_state, state, step): restored from the latest checkpoint, or fresh.

  Refuses (before config.json is touched) a resume whose model or whose hyperparameters
  differ from the saved config.json, unless `allow_changed_config`.
  """
  path, model = f'{workdir}/config.json', config_to_dict(model_cfg)
  resuming = latest_step(workdir)
  if os.path.isfile(path):
    with open(path) as f:
      saved = json.load(f)
    if saved['model'] != model:
      raise ValueError(f'{workdir} holds a different model than {model}')
    changed = changed_settings(saved.get('train', {}), cfg) if resuming else []
    if changed and not allow_changed_config:
      detail = ', '.join(f'{k}: {saved["train"][k]!r} -> {getattr(cfg, k)!r}'
                         for k in changed)
      raise ValueError(
          f'{workdir} was trained with other hyperparameters ({detail}); resuming at step '
          f'{resuming} would mix two runs. Use another --workdir, restore the old values, '
          'or pass --allow_changed_config (train(..., allow_changed_config=True)).')
  os.makedirs(workdir, exist_ok=True)
  _clean_orphans(workdir)
  _truncate_log(workdir, resuming or 0)
  run_dir.write_atomic(path, json.dumps({'model': model, 'train': dataclasses.asdict(cfg)}))
  dummy = jnp.ones((1, 4), jnp.int32)  # [batch, length]
  params = flax.core.unfreeze(Transformer(model_cfg).init(
      jax.random.PRNGKey(cfg.seed), dummy, dummy)['params'])
  opt_state = tx.init(params)
  state = {'cursors': np.zeros(num_tasks, np.int64), 'elapsed': 0.0, 'total_steps': 0}
  step = latest_step(workdir) or 0
  if step:
    params, opt_state, state = restore_checkpoint(workdir, step, opt_state, state)
  elif cfg.init_from:
    params = init_params_from(cfg.init_from, model_cfg)
    opt_state = tx.init(params)
  return params, opt_state, state, step


def init_params_from(path: str, model_cfg: T5Config) -> Params:
  """float32 params of checkpoint `path` (a checkpoint_<step> dir or its parent), which
  must match `model_cfg`'s tree and shapes (checkpoints.validate_params)."""
  try:
    loaded = load_params(path, dtype=jnp.float32, config=model_cfg)
  except ValueError as e:
    raise ValueError(f'init_from {path} does not match the model: {e}') from e
  return jax.tree_util.tree_map(jnp.asarray, loaded)


def distill_targets(model: Transformer, params: Params, inputs: np.ndarray, max_len: int,
                    batch_size: int = 512, progress: bool = False) -> np.ndarray:
  """The model's greedy outputs for `inputs` [N, in_len]: int32 [N, max_len], 0-padded.

  Sequence-level knowledge distillation (Kim & Rush, 2016): a draft trained on its
  target's own greedy outputs learns the target's mode, which is what raises alpha.
  Rows keep their EOS (1) when the target emitted one within max_len.
  """
  out = np.zeros((len(inputs), max_len), np.int32)  # [N, max_len]
  for s in tqdm.tqdm(range(0, len(inputs), batch_size), disable=not progress, desc='distill'):
    rows = inputs[s:s + batch_size]
    padded = np.pad(rows, ((0, batch_size - len(rows)), (0, 0)))  # One compiled shape.
    padded[len(rows):, 0] = 1  # Dummy rows: a lone EOS.
    tokens = api.generate((model, params), padded, max_decode_length=max_len).tokens
    out[s:s + len(rows)] = np.asarray(tokens)[:len(rows)]
  return out


def train(model_cfg: T5Config, data_dir: str, workdir: str, cfg: TrainConfig,
          progress: bool = False,
          allow_changed_config: bool = False) -> tuple[Params, dict[str, Any]]:
  """Trains (or resumes) until `cfg.steps` or `cfg.max_seconds`; returns (params, summary).

  A resume must use the saved hyperparameters (see `changed_settings`) unless
  `allow_changed_config`; orphan temporary files of a killed save are removed and
  log.jsonl keeps no record past the resumed step.

  AdamW + cosine (the default) decays fully within the budget; on demo_draft_s (CPU, batch 32,
  150 steps) it and Adafactor 1e-2 ended within 0.09 nats, AdamW 5e-3 lowest (val 6.95).
  """
  if cfg.steps is None and cfg.max_seconds is None:
    raise ValueError('Give steps, max_seconds, or both.')
  t0 = time.time()
  teacher_cfg, teacher_params = None, None
  if cfg.teacher:
    teacher_cfg, teacher_params = load_exported(cfg.teacher, dtype=model_cfg.dtype)
  train_step, eval_step, tx = make_steps(model_cfg, cfg.optimizer, cfg.weight_decay, cfg.z_loss,
                                         teacher_cfg, cfg.kd_weight if cfg.teacher else 0.0)
  mixture = Mixture(load_split(data_dir, 'train'), cfg.batch_size, cfg.seed, cfg.mixing_rates)
  val = validation_batches(load_split(data_dir, 'validation'), cfg.batch_size,
                           cfg.num_val_examples)
  params, opt_state, state, step = _start(workdir, model_cfg, cfg, tx, len(mixture.names),
                                          allow_changed_config)
  cursors, elapsed0, saved = state['cursors'], float(state['elapsed']), step
  total = cfg.steps if cfg.steps is not None else (int(state['total_steps']) or None)
  print(f'{workdir}: {num_params(params):,} params, devices {jax.devices()}, '
        f"{'resuming at' if step else 'starting from'} step {step}", flush=True)
  key = jax.random.key(cfg.seed, impl='rbg')  # Dropout bits: rbg compiles ~3x faster.
  log_file = open(f'{workdir}/log.jsonl', 'a')

  def log(record):
    record = {'step': step, 'elapsed': round(elapsed0 + time.time() - t0, 2), **record}
    log_file.write(json.dumps(record) + '\n')
    log_file.flush()
    return record

  def save():
    save_checkpoint(workdir, step, params, opt_state, {
        'cursors': cursors, 'elapsed': elapsed0 + time.time() - t0, 'total_steps': total or 0},
        cfg.keep)
    return step

  bar = tqdm.tqdm(total=total, initial=step, desc=os.path.basename(workdir.rstrip('/')),
                  disable=not progress)
  pending, window, calib, evaluated, shown, final = [], None, None, None, {}, {}
  while total is None or step < total:
    batch, cursors = mixture.batch(step, cursors)
    lr = np.float32(learning_rate(step, cfg, total))
    params, opt_state, metrics = train_step(params, opt_state, batch, lr, key, np.int32(step),
                                            teacher_params)
    step += 1
    if window is None:  # First step: wait out the compilation, then start timing.
      window = _synced_time(metrics)
      calib = (window, step)
    else:
      tokens = (batch['encoder_input_tokens'], batch['decoder_target_tokens'])
      pending.append((metrics, sum(x.size for x in tokens), sum((x > 0).sum() for x in tokens)))
    if total is None and step - calib[1] >= 20:  # Fit the cosine to the remaining budget.
      rate = (step - calib[1]) / (_synced_time(metrics) - calib[0])
      bar.total = total = step + int(0.9 * rate * (cfg.max_seconds - (time.time() - t0)))
    if step % cfg.log_every == 0 and pending:
      (m, padded, nonpad), secs = jax.device_get(list(zip(*pending))), time.time() - window
      shown['loss'] = sum(x['ce_sum'] for x in m) / max(sum(x['count'] for x in m), 1)
      log({'train_loss': float(shown['loss']), 'lr': float(lr),
           'tokens_per_s': round(sum(padded) / secs, 1),
           'nonpad_tokens_per_s': round(float(sum(nonpad)) / secs, 1)})
      pending, window = [], time.time()
    if step % cfg.eval_every == 0 or step % cfg.save_every == 0:
      paused = _synced_time(metrics)
      if step % cfg.eval_every == 0:
        final, evaluated = log(evaluate(params, eval_step, val)), step
        shown['val'] = final['val_loss']
      if step % cfg.save_every == 0:
        saved = save()
      window += time.time() - paused  # Keep evaluation and saving out of tokens/s.
    bar.update(1)
    bar.set_postfix({k: f'{v:.3f}' for k, v in shown.items()}, refresh=False)
    if cfg.max_seconds is not None and time.time() - t0 > cfg.max_seconds:
      break  # Checked after the step: every call makes progress.
  bar.close()
  if saved != step or not latest_step(workdir):
    save()
  if evaluated != step:
    final = evaluate(params, eval_step, val)
  summary = log({'event': 'end', **{k: v for k, v in final.items() if k.startswith('val_')},
                 'total_steps': total, 'stopped_by_time': total is None or step < total})
  log_file.close()
  return params, summary
