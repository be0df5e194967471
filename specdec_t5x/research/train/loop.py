"""One training loop for every trainer here, and the teacher-forced training of small T5
v1.1 models on a multitask mixture of token arrays that uses it.

`run` steps a `Trainer` (its compiled step, evaluation and log summary: the model's below,
the feature head's in feature_head.py) over a `Mixture` from a `train_state.Start`: NaN
losses and params stop it before anything is saved after them, it saves every
`save_every` steps and at the end, evaluates every `eval_every`, logs every `log_every`
and stops after `max_seconds`. A resumed run sees the same batches, dropout bits and
learning rates, so it ends with bitwise the parameters of a run never interrupted.

`train` runs (or resumes) one model until `steps` or `max_seconds`. Its parts:
  train_config     the model presets and the hyperparameters (TrainConfig);
  train_data       the npz token arrays, the deterministic mixture, validation batches;
  train_optim      AdamW (or T5's Adafactor) and the optax learning-rate schedule;
  train_objective  the loss (CE + z-loss, optional token-level KD), jitted steps, eval;
  train_state      the workdir: Orbax checkpoints, config.json, log.jsonl;
  distill          greedy decodes of a model as sequence-level distillation targets;
and integration/model_dir writes the final model directory (bf16 + config.json).

`steps=None` fits the cosine to `max_seconds` from the step rate measured just after
compiling (the warmup does not depend on the total).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import threading
import time
from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from specdec_t5x.algorithm.network import T5Config
from specdec_t5x.integration import model_dir
from specdec_t5x.research.train import state as train_state
from specdec_t5x.research.train.config import TrainConfig, num_params
from specdec_t5x.research.train.data import (Batch, Mixture, load_split, token_counts,
                                             validation_batches)
from specdec_t5x.research.train.objective import evaluate, make_steps
from specdec_t5x.research.train.optim import LearningRate

Params = Any
_CALIBRATION_STEPS = 20  # Steps timed before fitting the total to the time budget.
# Thread names of executor pools (asyncio.to_thread's default executor, ThreadPoolExecutor):
# their work items' errors end in futures, so a failed save leaves nothing for them to
# print; one may stay blocked on a future of Orbax's, and is not waited for.
_POOL_WORKERS = ('asyncio_', 'ThreadPoolExecutor-')


@jax.jit
def _all_finite(tree: Any) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def _synced_time(x: Any) -> float:
  jax.block_until_ready(x)
  return time.time()


class _Meter:
  """The steps of a log window: their metrics and tokens/s. The first step of a call
  (compilation) is not timed and not in a window, nor are the pauses for evaluation and
  saving."""

  def __init__(self):
    self.window: Optional[float] = None  # Start of the current window.
    self.first: Optional[tuple[float, int]] = None  # (time, step) after the first step.
    self.pending: list[tuple[Any, int, int]] = []  # (metrics, padded, non-pad tokens).

  def record(self, step: int, metrics: Any, batch: Batch) -> None:
    if self.window is None:
      self.window = _synced_time(metrics)
      self.first = (self.window, step)
    else:
      self.pending.append((metrics, *token_counts(batch)))

  def steps_per_second(self, step: int, metrics: Any) -> Optional[float]:
    """The step rate since the first step, once enough steps are timed."""
    if step - self.first[1] < _CALIBRATION_STEPS:
      return None
    return (step - self.first[1]) / (_synced_time(metrics) - self.first[0])

  @contextlib.contextmanager
  def paused(self, metrics: Any) -> Iterator[None]:
    start = _synced_time(metrics)
    yield
    self.window += time.time() - start

  def flush(self, summarize: Callable[[list[Any]], dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The window's `summarize`d metrics and token rates; starts a new window."""
    if not self.pending:
      return None
    metrics, padded, nonpad = zip(*self.pending)
    fields = summarize(list(metrics))  # Fetches them: the window's steps have run.
    secs = time.time() - self.window
    self.pending, self.window = [], time.time()
    return {**fields, 'tokens_per_s': round(sum(padded) / secs, 1),
            'nonpad_tokens_per_s': round(float(sum(nonpad)) / secs, 1)}


class _Log:
  """Appends records (with their step and the run's elapsed seconds) to log.jsonl."""

  def __init__(self, workdir: str, t0: float, elapsed: float):
    self.t0, self.elapsed = t0, elapsed
    self.file = open(os.path.join(workdir, 'log.jsonl'), 'a', encoding='utf-8')

  def seconds(self) -> float:
    return self.elapsed + time.time() - self.t0

  def write(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
    record = {'step': step, 'elapsed': round(self.seconds(), 2), **record}
    self.file.write(json.dumps(record) + '\n')
    self.file.flush()
    return record


@dataclasses.dataclass(frozen=True)
class Trainer:
  """What a kind of model brings to `run`: its compiled step, its evaluation and what its
  log records say of a window of steps."""
  # (params, opt_state, batch, lr, step) -> (params, opt_state, metrics); metrics['loss']
  # is the step's loss, checked finite.
  step: Callable[[Params, Any, Batch, np.float32, int], tuple[Params, Any, Any]]
  evaluate: Callable[[Params], dict[str, Any]]  # params -> the evaluation's log fields.
  # The metrics of a log window's steps -> its fields, 'train_loss' among them.
  summarize: Callable[[list[Any]], dict[str, Any]]


@dataclasses.dataclass
class _Run:
  """What the loop changes: the train state and the run's bookkeeping."""
  params: Params
  opt_state: Any
  cursors: np.ndarray  # [tasks]
  step: int
  total: Optional[int]  # None until fitted to the time budget.
  lr: LearningRate
  evaluated: Optional[tuple[int, dict[str, Any]]] = None  # (step, fields) evaluated last.

  def done(self) -> bool:
    return self.total is not None and self.step >= self.total


@dataclasses.dataclass
class _Loop:
  """The fixed parts of one call of `run`: settings, the trainer, data, outputs."""
  cfg: TrainConfig
  trainer: Trainer
  mixture: Mixture
  manager: Any  # orbax.checkpoint.CheckpointManager
  log: _Log
  bar: Any  # tqdm.tqdm
  t0: float  # When the call started (the time budget counts from here).
  meter: _Meter = dataclasses.field(default_factory=_Meter)
  shown: dict[str, float] = dataclasses.field(default_factory=dict)  # Bar postfix.
  unchecked: Optional[tuple[int, Any]] = None  # (step, loss) not yet checked finite.

  def step(self, run: _Run) -> None:
    """One optimizer step on the next batch, then its logging, evaluation and saving."""
    batch, run.cursors = self.mixture.batch(run.step, run.cursors)
    lr = run.lr(run.step)
    run.params, run.opt_state, metrics = self.trainer.step(
        run.params, run.opt_state, batch, lr, run.step)
    run.step += 1
    self.check_finite()  # The previous step's loss: computed by now, so no stall.
    self.unchecked = (run.step, metrics['loss'])
    self.meter.record(run.step, metrics, batch)
    if run.total is None:
      self.fit_total(run, metrics)
    if run.step % self.cfg.log_every == 0:
      self.log_window(run, lr)
    evaluating, saving = run.step % self.cfg.eval_every == 0, run.step % self.cfg.save_every == 0
    if evaluating or saving:
      with self.meter.paused(metrics):  # Keeps evaluation and saving out of tokens/s.
        if evaluating:
          self.evaluate(run)
        if saving:
          self.save(run)
    self.bar.update(1)
    self.bar.set_postfix({k: f'{v:.3f}' for k, v in self.shown.items()}, refresh=False)

  def out_of_time(self) -> bool:
    return self.cfg.max_seconds is not None and time.time() - self.t0 > self.cfg.max_seconds

  def fit_total(self, run: _Run, metrics: Any) -> None:
    """Sets the total steps from the measured rate: 90% of what the budget's rest allows."""
    rate = self.meter.steps_per_second(run.step, metrics)
    if rate is not None:
      run.total = run.step + int(0.9 * rate * (self.cfg.max_seconds - (time.time() - self.t0)))
      run.lr = LearningRate(self.cfg, run.total)
      self.bar.total = run.total

  def log_window(self, run: _Run, lr: np.float32) -> None:
    """Logs the train loss (and the trainer's other fields) and token rates of the steps
    timed since the last log, with the learning rate of the last one."""
    window = self.meter.flush(self.trainer.summarize)
    if window:
      self.shown['loss'] = window['train_loss']
      self.log.write(run.step, {'train_loss': window.pop('train_loss'), 'lr': float(lr),
                                **window})

  def evaluate(self, run: _Run) -> None:
    run.evaluated = (run.step, self.trainer.evaluate(run.params))
    self.log.write(run.step, run.evaluated[1])
    if 'val_loss' in run.evaluated[1]:
      self.shown['val'] = run.evaluated[1]['val_loss']

  def check_finite(self, params: Optional[Params] = None) -> None:
    """Raises FloatingPointError if the last unchecked loss (or `params`) is NaN/inf, so
    the run stops and nothing after the last good checkpoint is saved."""
    bad = None
    if self.unchecked is not None:
      step, loss = self.unchecked
      self.unchecked = None
      if not np.isfinite(float(loss)):
        bad = f'the training loss of step {step} is {float(loss)}'
    if bad is None and params is not None and not bool(_all_finite(params)):
      bad = 'the parameters are no longer finite'
    if bad is not None:
      last = self.manager.latest_step()
      raise FloatingPointError(
          f'Training stopped: {bad}. Nothing was saved after it: the last good checkpoint '
          f'is ' + (f'step {last} in {self.manager.directory}' if last else 'none (no step '
                    'was saved)') + '. Lower the learning rate, check the data, or resume '
          'from that checkpoint.')

  def save(self, run: _Run) -> None:
    """Saves the step, once its loss and params are known finite; a failed save (full
    disk, ...) ends in one error naming the step and the last good checkpoint."""
    self.check_finite(run.params)
    threads = set(threading.enumerate())
    try:
      train_state.save(self.manager, run.step, run.params, run.opt_state, run.cursors,
                       self.log.seconds(), run.total)
    except Exception as e:  # pylint: disable=broad-except
      for thread in set(threading.enumerate()) - threads:  # Orbax's writers: let them end
        if thread.name.startswith(_POOL_WORKERS):
          continue  # an executor's worker: its errors end in futures, never printed
        try:  # (and log) now, not at interpreter shutdown after this error.
          thread.join(timeout=60)
        except Exception:  # pylint: disable=broad-except
          pass  # Orbax's threads re-raise their error on join: the same failure.

      last = self.manager.latest_step()
      raise RuntimeError(
          f'Saving the checkpoint of step {run.step} in {self.manager.directory} failed '
          f'({type(e).__name__}: {e}); the tracebacks above are its writer threads. The last '
          'good checkpoint is ' + (f'step {last}' if last else 'none') + ': fix the cause '
          '(free disk space, permissions) and rerun to resume from it.') from None

  def finish(self, run: _Run) -> dict[str, Any]:
    """Saves and evaluates the last step (unless done already); logs the end record."""
    self.bar.close()
    if self.manager.latest_step() != run.step:
      self.save(run)
    self.check_finite()
    step, final = run.evaluated or (None, None)
    if step != run.step:
      final = self.trainer.evaluate(run.params)
    return self.log.write(run.step, {'event': 'end', **final, 'total_steps': run.total,
                                     'done': run.done()})


def run(trainer: Trainer, cfg: TrainConfig, begin: train_state.Start, mixture: Mixture,
        workdir: str, t0: float, desc: str, progress: bool = False) -> tuple[Params, dict]:
  """Trains from `begin` until `cfg.steps` (or, without them, a total fitted to
  `cfg.max_seconds`) or `cfg.max_seconds` from `t0`; returns (params, the end record of
  log.jsonl: the step, the last evaluation, 'total_steps' and 'done'). Closes
  `begin.manager`."""
  total = cfg.steps if cfg.steps is not None else begin.total_steps
  state = _Run(begin.params, begin.opt_state, begin.cursors, begin.step, total,
               LearningRate(cfg, total))
  bar = tqdm.tqdm(total=state.total, initial=state.step, disable=not progress, desc=desc)
  loop = _Loop(cfg, trainer, mixture, begin.manager, _Log(workdir, t0, begin.elapsed), bar, t0)
  try:
    while not state.done():
      loop.step(state)
      if loop.out_of_time():
        break  # Checked after the step: every call makes progress.
    end = loop.finish(state)
  finally:
    bar.close()
    loop.log.file.close()
    begin.manager.close()
  return state.params, end


def _window_loss(metrics: list[Any]) -> dict[str, float]:
  """A model's train loss over a log window: cross-entropy per target token."""
  metrics = jax.device_get(metrics)
  loss = sum(m['ce_sum'] for m in metrics) / max(sum(m['count'] for m in metrics), 1)
  return {'train_loss': float(loss)}


def train(model_cfg: T5Config, data_dir: str, workdir: str, cfg: TrainConfig,
          progress: bool = False,
          allow_changed_config: bool = False) -> tuple[Params, dict[str, Any]]:
  """Trains (or resumes) until `cfg.steps` or `cfg.max_seconds`; returns (params, summary).

  A resume must use the saved hyperparameters (see `changed_settings`) unless
  `allow_changed_config`; interrupted saves are removed and log.jsonl keeps no record past
  the resumed step.

  AdamW + cosine (the default) decays fully within the budget; on demo_draft_s (CPU, batch 32,
  150 steps) it and Adafactor 1e-2 ended within 0.09 nats, AdamW 5e-3 lowest (val 6.95).
  """
  if cfg.steps is None and cfg.max_seconds is None:
    raise ValueError('Give steps, max_seconds, or both.')
  t0 = time.time()
  teacher_cfg, teacher_params = None, None
  if cfg.teacher:
    teacher_cfg, teacher_params = model_dir.load(cfg.teacher, dtype=model_cfg.dtype)
  train_step, eval_step, tx = make_steps(model_cfg, cfg.optimizer, cfg.weight_decay, cfg.z_loss,
                                         teacher_cfg, cfg.kd_weight if cfg.teacher else 0.0)
  vocab = model_cfg.vocab_size  # Ids outside it are refused here, naming file and row.
  mixture = Mixture(load_split(data_dir, 'train', vocab), cfg.batch_size, cfg.seed,
                    cfg.mixing_rates)
  val = validation_batches(load_split(data_dir, 'validation', vocab), cfg.batch_size,
                           cfg.num_val_examples)
  begin = train_state.start(
      workdir, cfg.keep, train_state.model_config(model_cfg, cfg),
      functools.partial(train_state.check_config, workdir, model_cfg, cfg,
                        allow_changed_config=allow_changed_config),
      functools.partial(train_state.init_model, model_cfg, cfg), tx, len(mixture.names))
  print(f'{workdir}: {num_params(begin.params):,} params, devices {jax.devices()}, '
        f"{'resuming at' if begin.step else 'starting from'} step {begin.step}", flush=True)
  key = jax.random.key(cfg.seed, impl='rbg')  # Dropout bits: rbg compiles ~3x faster.
  step = lambda params, opt_state, batch, lr, i: train_step(
      params, opt_state, batch, lr, key, np.int32(i), teacher_params)
  trainer = Trainer(step, lambda params: evaluate(params, eval_step, val), _window_loss)
  return run(trainer, cfg, begin, mixture, workdir, t0,
             os.path.basename(workdir.rstrip('/')), progress)
