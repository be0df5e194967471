"""Model directories: a trained model as a T5X checkpoint plus the config that builds it.

Layout (what scripts/train.py --final_export writes and checkpoints/demo/<model>/ holds):

  <model_dir>/config.json            T5Config fields (dtype by name), `T5Config(**fields)`;
                                     a feature draft head's: FeatureDraftConfig's + "kind"
  <model_dir>/checkpoint_<step>/     T5X native params (bfloat16 storage)
  <model_dir>/vocabulary.json        optional: the SentencePiece model (see vocab_check)

`save` writes one (locally), `load` reads one back (config without dropout, float32 params)
from a local path or a URL T5X reads (gs://...); training, evaluation and distillation all
go through these two functions.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.feature_draft import FeatureDraftConfig
from specdec_t5x.algorithm.network import T5Config
from specdec_t5x.integration import run_dir, storage, vocab_check
from specdec_t5x.integration.checkpoints import load_params, save_params

CONFIG = 'config.json'
FEATURE_DRAFT = 'feature_draft'  # config.json's "kind" of a feature-reading draft head
Params = Any


def config_to_dict(config: Any) -> dict[str, Any]:
  """JSON-able T5Config (or FeatureDraftConfig, recorded with "kind": "feature_draft")
  fields, dtype by name; `config_from_dict` rebuilds it."""
  fields = dataclasses.asdict(config)
  fields['dtype'] = jnp.dtype(config.dtype).name
  fields['mlp_activations'] = list(config.mlp_activations)
  if isinstance(config, FeatureDraftConfig):
    fields['kind'] = FEATURE_DRAFT
  return fields


def config_from_dict(fields: Mapping[str, Any], **overrides: Any) -> Any:
  """The config of `config_to_dict` output (lists become tuples), with those `overrides`
  that are its fields."""
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
  cls = FeatureDraftConfig if fields.pop('kind', None) == FEATURE_DRAFT else T5Config
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{**fields, **{k: v for k, v in overrides.items() if k in names}})


def save(params: Params, out_dir: str, config: T5Config, step: int,
         vocab_path: Optional[str] = None) -> str:
  """Writes `params` in bfloat16 as `out_dir/checkpoint_<step>` and `out_dir/config.json`.

  Args:
    params: the float params tree (device or host arrays).
    out_dir: the model directory (created if missing; an existing step is overwritten).
    config: the model's T5Config, recorded as config.json.
    step: the training step, naming the checkpoint.
    vocab_path: the SentencePiece model the data was tokenized with; recorded as
      vocabulary.json (vocab_check.record_vocabulary) when given.

  Returns:
    The checkpoint directory written.
  """
  path = save_params(jax.device_get(params), f'{out_dir}/checkpoint_{step}', step=step,
                     dtype=jnp.bfloat16, overwrite=True)
  run_dir.write_atomic(os.path.join(out_dir, CONFIG), json.dumps(config_to_dict(config)))
  if vocab_path:
    vocab_check.record_vocabulary(out_dir, vocab_path)
  return path


def load_config(model_dir: str, dtype: Any = jnp.float32) -> T5Config:
  """The config.json of `model_dir` (a local path or a URL, gs://...) with compute `dtype`
  and no dropout (for inference)."""
  fields = json.loads(storage.read_text(storage.join(model_dir, CONFIG)))
  return config_from_dict(fields, dtype=jnp.dtype(dtype), dropout_rate=0.0)


def load(model_dir: str, dtype: Any = jnp.float32) -> tuple[T5Config, Params]:
  """(config, float32 params) of a model directory: its config.json (see `load_config`)
  and its highest-step checkpoint, checked against that config."""
  config = load_config(model_dir, dtype)
  params = load_params(model_dir, dtype=jnp.float32, config=config)
  return config, jax.tree_util.tree_map(jnp.asarray, params)


def draft_vocab(model_dir: str) -> tuple[int, ...]:
  """The reduced draft vocabulary of the feature head in `model_dir` (() for none): gin
  files bind FeatureDraftConfig.draft_vocab = @model_dir.draft_vocab() with its path, so
  the ids live in the head's config.json alone."""
  config = load_config(model_dir)
  if not isinstance(config, FeatureDraftConfig):
    raise ValueError(f'{model_dir} holds a {type(config).__name__}, not a feature draft head.')
  return config.draft_vocab
