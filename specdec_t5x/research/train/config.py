"""What a training run is: the model presets and the hyperparameters (`TrainConfig`).

`changed_settings` says which hyperparameters a resumed run may not change without
mixing two runs (train_state refuses those unless told otherwise).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm.network import T5Config

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

  def __post_init__(self):
    """Every field against its rule, so a bad value fails here, naming itself, and not
    as a ZeroDivisionError or NaN steps into the run."""
    def refuse(name: str, rule: str) -> None:
      raise ValueError(f'TrainConfig.{name} must be {rule}, got {getattr(self, name)!r}.')

    def integer(name: str, low: int, optional: bool = False) -> None:
      value = getattr(self, name)
      if optional and value is None:
        return
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        refuse(name, f'an integer >= {low}' + (' or None' if optional else ''))

    def number(name: str, low: float, high: float = math.inf, optional: bool = False,
               low_open: bool = False) -> None:
      value = getattr(self, name)
      if optional and value is None:
        return
      ok = (isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
            and math.isfinite(value) and (value > low if low_open else value >= low)
            and value <= high)
      if not ok:
        refuse(name, f"a finite number {'>' if low_open else '>='} {low:g}"
               + (f' and <= {high:g}' if high != math.inf else '')
               + (' or None' if optional else ''))

    integer('steps', 0, optional=True)
    for name in ('batch_size', 'save_every', 'eval_every', 'log_every', 'num_val_examples'):
      integer(name, 1)
    integer('keep', 1, optional=True)
    integer('warmup_steps', 0)
    integer('seed', 0)
    if self.optimizer not in ('adamw', 'adafactor'):
      refuse('optimizer', "'adamw' or 'adafactor'")
    if self.schedule not in ('cosine', 'rsqrt'):
      refuse('schedule', "'cosine' or 'rsqrt'")
    number('learning_rate', 0.0, low_open=True)
    number('final_lr_fraction', 0.0, 1.0)
    number('weight_decay', 0.0)
    number('z_loss', 0.0)
    number('kd_weight', 0.0, 1.0)
    number('max_seconds', 0.0, optional=True)
    rates = self.mixing_rates
    if rates is not None and (not isinstance(rates, Mapping) or not all(
        isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in rates.values())
                              or not sum(rates.values()) > 0):
      refuse('mixing_rates', 'None or {task: finite rate >= 0}, not all 0')


# TrainConfig fields a resumed run may change: they stop, save, log or evaluate the run
# but do not change its parameters (`steps` does, through the cosine schedule).
RUN_CONTROL = ('max_seconds', 'save_every', 'eval_every', 'log_every', 'num_val_examples',
               'keep', 'init_from')


def changed_settings(saved: Mapping[str, Any], cfg: TrainConfig) -> list[str]:
  """TrainConfig fields that differ from a workdir's saved `train` config and would change
  the resumed parameters (run-control fields and `steps` under rsqrt excepted)."""
  now = json.loads(json.dumps(dataclasses.asdict(cfg)))
  free = RUN_CONTROL + (('steps',) if cfg.schedule == 'rsqrt' else ())
  return sorted(k for k in now if k not in free and k in saved and saved[k] != now[k])
