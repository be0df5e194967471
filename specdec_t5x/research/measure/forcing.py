"""Teacher forcing: a model run once over known output tokens, each position seeing the
true prefix (BOS and the outputs before it: `shift_right`).

The one path for every measurement that reads a model on given outputs (alpha, agreement,
tree ranks, our network against T5X's) and for the feature head's training data (the
target's features). Whether a caller jits is the caller's: jitted and eager runs of the
same network may round differently. Shapes use bracket comments; `V` is the vocabulary.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

Params = Any


def shift_right(tokens) -> jax.Array:
  """Teacher forcing's decoder inputs [b, L] for outputs `tokens` [b, L]: BOS (0), then each
  output one position later (the last one dropped), as `Transformer.__call__` takes them."""
  return jnp.pad(jnp.asarray(tokens)[:, :-1], ((0, 0), (1, 0)))


def logits(module: Any, params: Params, enc: jax.Array, outputs: jax.Array,
           targets: Optional[jax.Array] = None) -> jax.Array:
  """`module`'s teacher-forced logits [b, L, V] over `outputs` [b, L] (a T5 network or an
  n-gram draft). `targets` (usually `outputs`, or None) marks the padding: positions whose
  target is 0 attend to nothing and are attended by nothing."""
  return module.apply({'params': params}, enc, shift_right(outputs), targets)


jitted_logits = jax.jit(logits, static_argnums=0)


def features(target: Any, target_params: Params, enc: jax.Array, dec_in: jax.Array,
             tgt: Optional[jax.Array] = None, feature_layers: tuple = ()):
  """The target run teacher forced over decoder inputs `dec_in` [b, L] -> (logits
  [b, L, V], features [b, L, F] (fused with `feature_layers`' outputs:
  FeatureDraftConfig's), the features before each position (a feature head's input there;
  zeros before BOS), encoder output). `tgt` (the outputs, or None) only marks the padding."""
  out, feats, encoded = target.apply({'params': target_params}, enc, dec_in, tgt,
                                     feature_layers, method='features')
  return out, feats, jnp.pad(feats[:, :-1], ((0, 0), (1, 0), (0, 0))), encoded
