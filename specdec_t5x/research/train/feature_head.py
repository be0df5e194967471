"""Training a feature-reading draft head (algorithm/feature_draft.py) for a frozen target.

Data: token arrays as research/train/data.py reads them (the corpus, or the target's own
greedy outputs from scripts/build_data.py distill): they only give the contexts, the labels are
the target's distributions (EAGLE trains on fixed data too). Each step runs the target
teacher forced over a batch (its encoder output, its features (fused with the layers the
head reads, FeatureDraftConfig.feature_layers) and logits: no gradient) and the head's
`passes` self-fed passes over the same positions (pass j: the j-th draft call of a step).
Loss per pass and position: soft cross-entropy against the target's distribution
(EAGLE-3's objective; what alpha rewards at any temperature; over the head's reduced draft
vocabulary when it has one, the target's mass outside it being out of the head's reach) +
`feature_weight` x smooth-L1 between the head's predicted feature and the target's
(EAGLE-1's regression, which the fed-back features need).
Logged per pass: how often the head's argmax is the target's (greedy acceptance of the
j-th draft given the earlier ones were right).

It runs in research/train/loop.py's loop, as the models do: Orbax checkpoints of params,
optimizer state and data cursors in `workdir` (train_state), a run resumed at step s sees the
same batches as one never stopped; NaN losses stop the run before anything is saved after them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_t5x.algorithm import draft_vocab, feature_draft
from specdec_t5x.algorithm.network import T5Config, Transformer
from specdec_t5x.integration import model_dir
from specdec_t5x.research.measure import forcing
from specdec_t5x.research.train import loop, state as train_state
from specdec_t5x.research.train.config import TrainConfig
from specdec_t5x.research.train.data import Mixture, load_split, validation_batches
from specdec_t5x.research.train.optim import make_optimizer

Params = Any
BUCKET = 16  # batches are cut to their longest row, rounded up to this (fewer compiles)


def trim(batch: dict, max_target_len: Optional[int] = None) -> dict:
  """Drops the all-padding columns at the end of a batch (to a multiple of BUCKET), and
  the decoder positions past `max_target_len` (their context stays teacher forced)."""
  out = dict(batch)
  for keys in (('encoder_input_tokens',), ('decoder_input_tokens', 'decoder_target_tokens')):
    width = batch[keys[-1]].shape[1]
    if max_target_len and keys[0] != 'encoder_input_tokens':
      width = min(width, max_target_len)
    used = int(np.max(np.nonzero(np.any(batch[keys[-1]] > 0, axis=0))[0], initial=0)) + 1
    cut = min(width, -(-used // BUCKET) * BUCKET)
    for k in keys:
      out[k] = batch[k][:, :cut]
  return out


@functools.lru_cache(maxsize=4)
def make_steps(target_cfg: T5Config, head_cfg: feature_draft.FeatureDraftConfig, passes: int,
               feature_weight: float, weight_decay: float):
  """Jitted (train_step, eval_step, optimizer) for the head."""
  target, head = Transformer(target_cfg), feature_draft.FeatureDraft(head_cfg)
  tx = make_optimizer(TrainConfig(optimizer='adamw', weight_decay=weight_decay))

  def loss_fn(params, target_params, batch):
    enc, dec_in = batch['encoder_input_tokens'], batch['decoder_input_tokens']
    tgt = batch['decoder_target_tokens']
    logits_t, feats, before, encoded = jax.lax.stop_gradient(
        forcing.features(target, target_params, enc, dec_in, tgt, head_cfg.feature_layers))
    outs = head.apply({'params': params}, encoded, enc, dec_in, before, tgt, passes=passes)
    weights = (tgt > 0).astype(jnp.float32)
    count = jnp.maximum(weights.sum(), 1.0)
    p = jax.nn.softmax(logits_t)
    best = jnp.argmax(logits_t, -1)
    ids = jnp.asarray(head_cfg.draft_vocab, jnp.int32) if head_cfg.draft_vocab else None
    if ids is not None:
      p = p[..., ids]  # a reduced draft vocabulary: the target's mass on its ids
    total, metrics = 0.0, {'count': weights.sum()}
    for j, (logits, predicted) in enumerate(outs, 1):
      ce = -jnp.sum(p * jax.nn.log_softmax(logits), -1)
      reg = jnp.mean(optax.huber_loss(predicted, feats), -1)
      total += jnp.sum((ce + feature_weight * reg) * weights) / count
      metrics[f'ce_{j}'] = jnp.sum(ce * weights)
      guess = jnp.argmax(logits, -1)
      guess = guess if ids is None else ids[guess]
      metrics[f'agree_{j}'] = jnp.sum((guess == best) * weights)
    return total / passes, metrics

  def train_step(params, opt_state, target_params, batch, lr):
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, target_params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree_util.tree_map(lambda u: lr * u, updates)
    return optax.apply_updates(params, updates), opt_state, dict(metrics, loss=loss)

  def eval_step(params, target_params, batch):
    return loss_fn(params, target_params, batch)[1]

  return jax.jit(train_step, donate_argnums=(0, 1)), jax.jit(eval_step), tx


def commonest_ids(data_dir: str, size: int, vocab_size: int) -> tuple[int, ...]:
  """The `size` commonest token ids of the train split's targets (ties: lower id first),
  increasing: a reduced draft vocabulary (FeatureDraftConfig.draft_vocab)."""
  if not 0 < size <= vocab_size:
    raise ValueError(f'A draft vocabulary of {size} ids does not fit vocab_size {vocab_size}.')
  counts = np.zeros(vocab_size, np.int64)
  for task in load_split(data_dir, 'train', vocab_size).values():
    targets = task['targets']
    counts += np.bincount(targets[targets > 0].ravel(), minlength=vocab_size)
  order = np.argsort(-counts, kind='stable')[:size]
  return tuple(int(i) for i in np.sort(order))


def start_from(params: Params, head_cfg: feature_draft.FeatureDraftConfig,
               init_dir: str) -> Params:
  """`params` with every weight taken from the exported head in `init_dir` (same sizes);
  its output layer's columns are picked for `head_cfg`'s draft vocabulary. The head then
  computes what the old one did when `head_cfg` grows it: reading more target layers
  (feature_layers), the new input rows and predicted-feature columns start at zero; with
  more decoder layers (num_layers), the new ones follow the old ones, from `params` with
  the kernels that write into the residual stream zeroed (each starts as the identity)."""
  old_cfg, old = model_dir.load(init_dir)
  same = lambda c: dataclasses.replace(c, draft_vocab=(), feature_layers=(), num_layers=1,
                                       dtype=head_cfg.dtype)
  if not isinstance(old_cfg, feature_draft.FeatureDraftConfig) or same(old_cfg) != same(
      head_cfg) or old_cfg.feature_layers and old_cfg.feature_layers != head_cfg.feature_layers \
      or old_cfg.num_layers > head_cfg.num_layers:
    raise ValueError(f'{init_dir} holds {old_cfg}, not a head of these sizes ({head_cfg}).')
  float32 = lambda tree: jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), tree)
  old = float32(old)
  for i in range(old_cfg.num_layers, head_cfg.num_layers):
    layer = old[f'layers_{i}'] = float32(params[f'layers_{i}'])  # a copy: fresh nested dicts
    for block, name in (('self_attention', 'out'), ('encoder_decoder_attention', 'out'),
                        ('mlp', 'wo')):
      layer[block][name]['kernel'] = jnp.zeros_like(layer[block][name]['kernel'])
  extra = head_cfg.feature_dim - old_cfg.feature_dim  # 0, or the new layers' width
  old['feature_in'] = {'kernel': jnp.pad(old['feature_in']['kernel'], ((0, extra), (0, 0)))}
  old['feature_out'] = {'kernel': jnp.pad(old['feature_out']['kernel'], ((0, 0), (0, extra)))}
  kernel = old['logits_dense']['kernel']  # [emb, old output vocab]
  columns = draft_vocab.draft_vocabulary(old_cfg.draft_vocab or range(old_cfg.vocab_size),
                                        old_cfg.vocab_size).columns
  wanted = columns[list(head_cfg.draft_vocab or range(head_cfg.vocab_size))]
  missing = int(np.sum(wanted == kernel.shape[1]))  # the column of an id the old head lacks
  if missing:
    raise ValueError(f'{init_dir}\'s draft vocabulary lacks {missing} of the ids this head '
                     'covers.')
  out = dict(old, logits_dense=dict(old['logits_dense'], kernel=kernel[:, wanted]))
  if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(params):
    raise ValueError(f'{init_dir}\'s parameter tree is not this head\'s.')
  return out


def _rates(metrics: list, passes: int) -> dict:
  """Summed per-batch metrics -> per-token cross-entropy and agreement per pass."""
  total = jax.device_get(jax.tree_util.tree_map(lambda *x: sum(x), *metrics))
  n = max(float(total['count']), 1.0)
  out = {}
  for j in range(1, passes + 1):
    out[f'ce_{j}'] = round(float(total[f'ce_{j}']) / n, 4)
    out[f'agree_{j}'] = round(float(total[f'agree_{j}']) / n, 4)
  return out


def _window(metrics: list, passes: int) -> dict:
  """A log window's mean train loss and its per-pass rates."""
  loss = float(np.mean([float(m['loss']) for m in metrics]))
  return {'train_loss': round(loss, 4), **_rates(metrics, passes)}


def train_head(target_dir: str, data_dir: str, workdir: str,
               head_cfg: feature_draft.FeatureDraftConfig, cfg: TrainConfig, *,
               passes: int = 3, feature_weight: float = 1.0, max_target_len: Optional[int] = None,
               init_from: Optional[str] = None, progress: bool = False) -> tuple[Params, dict]:
  """Trains (or resumes) the head in `workdir` until `cfg.steps` (or `cfg.max_seconds`
  per call); returns (params, the end record of log.jsonl). `max_target_len`: train on
  the first decoder positions only (the vocabulary-sized work per position dominates a
  step on CPU; validation sees every position). `init_from`: an exported head's model dir
  to start from (`start_from`) instead of the target-initialised random head."""
  if cfg.steps is None:
    raise ValueError('train_head needs TrainConfig.steps (the cosine schedule spans them).')
  if passes < 1:
    raise ValueError(f'passes must be >= 1, got {passes}.')
  t0 = time.time()
  target_cfg, target_params = model_dir.load(target_dir)
  feature_draft.check_fits(head_cfg, target_cfg)
  train_step, eval_step, tx = make_steps(target_cfg, head_cfg, passes, feature_weight,
                                         cfg.weight_decay)
  mixture = Mixture(load_split(data_dir, 'train', target_cfg.vocab_size), cfg.batch_size,
                    cfg.seed, cfg.mixing_rates)
  val = validation_batches(load_split(data_dir, 'validation', target_cfg.vocab_size),
                           cfg.batch_size, cfg.num_val_examples)
  settings = {'head': dataclasses.asdict(head_cfg) | {'dtype': jnp.dtype(head_cfg.dtype).name},
              'target': os.path.abspath(target_dir), 'passes': passes,
              'feature_weight': feature_weight, 'max_target_len': max_target_len,
              'init_from': init_from and os.path.abspath(init_from),
              'train': dataclasses.asdict(cfg)}

  def check(saved, resuming):
    if not (resuming and saved):
      return
    changed = [k for k in ('head', 'passes', 'feature_weight', 'max_target_len', 'init_from')
               if saved.get(k) != json.loads(json.dumps(settings[k]))]
    changed += [k for k in ('steps', 'batch_size', 'learning_rate', 'warmup_steps', 'seed')
                if saved['train'].get(k) != settings['train'][k]]
    if changed:
      raise ValueError(f'{workdir} holds a run with other settings ({changed}); use another '
                       'workdir.')

  def init(resuming):
    params = feature_draft.init_params(head_cfg, jax.random.PRNGKey(cfg.seed), target_params)
    return start_from(params, head_cfg, init_from) if init_from and not resuming else params

  begin = train_state.start(workdir, cfg.keep, settings, check, init, tx, len(mixture.names))
  trainer = loop.Trainer(
      lambda params, opt_state, batch, lr, _: train_step(
          params, opt_state, target_params, trim(batch, max_target_len), lr),
      lambda params: {'val': _rates([eval_step(params, target_params, trim(b))
                                     for _, b in val], passes)},
      functools.partial(_window, passes=passes))
  return loop.run(trainer, cfg, begin, mixture, workdir, t0, 'feature head', progress)


def export(params: Params, head_cfg: feature_draft.FeatureDraftConfig, out_dir: str, step: int,
           vocab_path: Optional[str] = None) -> str:
  """The head as a model directory (bfloat16 T5X checkpoint + config.json with its kind)."""
  return model_dir.save(params, out_dir, head_cfg, step, vocab_path)
