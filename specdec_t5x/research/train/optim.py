"""Optimizer and learning-rate schedule of a training run, from optax.

The optimizer is the update direction at unit learning rate; the train step multiplies in
lr(step), which `LearningRate` evaluates on the host so that the schedule can change when
the total number of steps becomes known (fitted to a time budget) without recompiling.

Schedule: linear warmup to the peak over `warmup_steps` (lr(s) = peak * (s + 1) / warmup),
then either a cosine from the peak to `final_lr_fraction * peak` at the total (the peak
until the total is known) or T5's rsqrt decay peak * sqrt(warmup / (s + 1)).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_t5x.research.train.config import TrainConfig


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


def schedule(cfg: TrainConfig, total_steps: Optional[int]) -> optax.Schedule:
  """The optax schedule of `cfg` for a run of `total_steps` (None or 0: not yet known)."""
  peak, warm = cfg.learning_rate, max(cfg.warmup_steps, 1)
  if cfg.schedule == 'rsqrt':
    after = lambda count: peak * jnp.sqrt(warm / (count + warm + 1))
  elif cfg.schedule != 'cosine':
    raise ValueError(f'Unknown schedule {cfg.schedule!r} (cosine or rsqrt)')
  elif not total_steps:
    after = optax.constant_schedule(peak)
  else:
    after = optax.cosine_decay_schedule(peak, max(total_steps - warm, 1),
                                        alpha=cfg.final_lr_fraction)
  warmup = (optax.linear_schedule(peak / warm, peak, warm - 1) if warm > 1
            else optax.constant_schedule(peak))
  return optax.join_schedules([warmup, after], [warm])


class LearningRate:
  """lr(step) as float32 from `schedule`, evaluated in float64 on the host CPU.

  float64 makes the values those of the closed forms in the module docstring computed in
  Python floats (bitwise, after the cast to float32), and the CPU keeps the evaluation off
  the accelerator's queue.
  """

  def __init__(self, cfg: TrainConfig, total_steps: Optional[int]):
    self.total_steps = total_steps
    with jax.enable_x64(True):
      self._fn = jax.jit(schedule(cfg, total_steps))

  def __call__(self, step: int) -> np.float32:
    with jax.enable_x64(True), jax.default_device(jax.devices('cpu')[0]):
      return np.float32(self._fn(np.int64(step)))


def learning_rate(step: int, cfg: TrainConfig, total_steps: Optional[int]) -> float:
  """lr at `step` (see `LearningRate`; build one of those to evaluate many steps)."""
  return float(LearningRate(cfg, total_steps)(step))
