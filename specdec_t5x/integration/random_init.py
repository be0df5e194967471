"""Random parameters for a model that has no checkpoint (smoke tests, a runner's
`fallback_init_rng`)."""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import api, feature_draft


def init_params(module: Any, rng: jax.Array) -> Any:
  """Random parameters of a Transformer-like module (smoke tests, `fallback_init_rng`)."""
  if api.reads_features(module):
    return feature_draft.init_params(module.config, rng)
  return _jitted_init(module)(rng, *[jnp.ones((1, 4), jnp.int32)] * 3)['params']


@functools.lru_cache(maxsize=8)  # our modules hash by their configuration: one compile each
def _jitted_init(module: Any):
  return jax.jit(module.init)
