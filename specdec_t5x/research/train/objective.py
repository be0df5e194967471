"""The training objective: teacher-forced cross-entropy (+ z-loss, + optional token-level
knowledge distillation), the jitted train and eval steps built on it, and evaluation."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_t5x.algorithm.network import T5Config, Transformer
from specdec_t5x.research.train.config import TrainConfig
from specdec_t5x.research.train.data import Batch
from specdec_t5x.research.train.optim import make_optimizer

Params = Any


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


def evaluate(params: Params, eval_step: Callable[..., Any],
             batches: list[tuple[str, Batch]]) -> dict[str, float]:
  """Mean per-token cross-entropy per task ('val_loss_<task>') and overall ('val_loss')."""
  sums: dict[str, list] = {}
  for name, batch in batches:
    sums.setdefault(name, []).append(eval_step(params, batch))
  totals = {k: np.sum(jax.device_get(v), axis=0) for k, v in sums.items()}  # [2]: ce, n
  totals['val_loss'] = sum(totals.values())
  return {k if k == 'val_loss' else f'val_loss_{k}': float(ce / max(n, 1.0))
          for k, (ce, n) in totals.items()}
