"""Random parameters for a model that has no checkpoint (smoke tests, a runner's
`fallback_init_rng`, the cost curve's T5 v1.1 sizes)."""

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import api, feature_draft


def init_params(module: Any, rng: jax.Array, dtype: Optional[Any] = None) -> Any:
  """Random parameters of a Transformer-like module, cast to `dtype` when given. The cast
  is part of the compiled init, so that a large model's float32 values are never all held
  beside their cast (T5 v1.1 XL in bfloat16 fits 24 GiB so). Flax's own init, as T5X draws
  a model without a checkpoint; timing.random_params draws other values, which results use.
  """
  if api.reads_features(module):
    return _cast(feature_draft.init_params(module.config, rng), dtype)
  return _jitted_init(module, dtype)(rng, *[jnp.ones((1, 4), jnp.int32)] * 3)


def _cast(params: Any, dtype: Optional[Any]) -> Any:
  if dtype is None:
    return params
  return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), params)


@functools.lru_cache(maxsize=8)  # our modules hash by their configuration: one compile each
def _jitted_init(module: Any, dtype: Optional[Any]):
  return jax.jit(lambda rng, *args: _cast(module.init(rng, *args)['params'], dtype))
