"""Names and shapes of T5X's T5 parameter tree, shared by every checkpoint format.

The tree is T5X's (t5x/examples/t5/network.py, identical in specdec_t5x.algorithm.network):
nested dicts keyed by module names, kernels stored 2-D as [in, out]. `expected_shapes`
describes it for any object with T5Config's fields, so a checkpoint (T5X native, Orbax or
converted from Hugging Face) can be checked against a config before anything runs.
"""

from typing import Any, Mapping

import jax
import numpy as np
from flax import traverse_util

from specdec_t5x.algorithm import feature_draft
from specdec_t5x.algorithm.layers import NUM_BUCKETS

Path = tuple[str, ...]
Params = dict[str, Any]

# Per stack: (attention module, its pre-layer-norm), in the order of the layer's sub-layers.
ATTENTION_BLOCKS = {
    'encoder': (('attention', 'pre_attention_layer_norm'),),
    'decoder': (('self_attention', 'pre_self_attention_layer_norm'),
                ('encoder_decoder_attention', 'pre_cross_attention_layer_norm')),
}
PROJECTIONS = ('query', 'key', 'value', 'out')


def mlp_in_names(config: Any) -> tuple[str, ...]:
  """T5X's MlpBlock names: 'wi' for one activation, 'wi_0', 'wi_1', ... for gated."""
  n = len(tuple(config.mlp_activations))
  return ('wi',) if n == 1 else tuple(f'wi_{i}' for i in range(n))


def num_layers(config: Any, stack: str) -> int:
  """Number of layers of `stack` ('encoder' or 'decoder')."""
  return config.num_encoder_layers if stack == 'encoder' else config.num_decoder_layers


def expected_shapes(config: Any) -> dict[Path, tuple[int, ...]]:
  """Parameter path -> shape of T5X's T5 tree, for any object with T5Config's fields (or
  of a feature draft head's tree, for a FeatureDraftConfig)."""
  if isinstance(config, feature_draft.FeatureDraftConfig):
    shapes = jax.eval_shape(lambda: feature_draft.init_params(config, jax.random.PRNGKey(0)))
    return {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(shapes).items()}
  emb, mlp, heads = config.emb_dim, config.mlp_dim, config.num_heads
  inner = heads * config.head_dim
  shapes = {('token_embedder', 'embedding'): (config.vocab_size, emb)}  # [vocab, emb]
  for stack, blocks in ATTENTION_BLOCKS.items():
    shapes[(stack, 'relpos_bias', 'rel_embedding')] = (heads, NUM_BUCKETS)  # [heads, buckets]
    for i in range(num_layers(config, stack)):
      layer = (stack, f'layers_{i}')
      for name, norm in blocks:
        shapes[layer + (norm, 'scale')] = (emb,)
        for proj in PROJECTIONS:  # [emb, heads * head_dim]; out: [heads * head_dim, emb]
          shapes[layer + (name, proj, 'kernel')] = (inner, emb) if proj == 'out' else (emb, inner)
      shapes[layer + ('pre_mlp_layer_norm', 'scale')] = (emb,)
      for wi in mlp_in_names(config):
        shapes[layer + ('mlp', wi, 'kernel')] = (emb, mlp)  # [emb, mlp]
      shapes[layer + ('mlp', 'wo', 'kernel')] = (mlp, emb)  # [mlp, emb]
    shapes[(stack, f'{stack}_norm', 'scale')] = (emb,)
  if not config.logits_via_embedding:
    shapes[('decoder', 'logits_dense', 'kernel')] = (emb, config.vocab_size)  # [emb, vocab]
  return shapes


def validate_params(params: Mapping[str, Any], config: Any) -> None:
  """Raises ValueError naming the first parameter whose presence or shape differs."""
  want = expected_shapes(config)
  got = {k: tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(params).items()}
  for key in sorted(set(want) | set(got)):
    if want.get(key) != got.get(key):
      raise ValueError(
          f"Parameter '{'/'.join(key)}': checkpoint has shape {got.get(key)}, config "
          f'expects {want.get(key)} (None = absent).')
