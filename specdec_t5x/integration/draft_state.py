"""The draft's weights as part of T5X's state: restored, partitioned and passed like the
target's, never baked into the compiled program.

Under `python -m t5x.infer` the model's traced `predict_batch_with_aux` would otherwise
close over draft params it loaded itself: jit embeds them in the program as constants
(the whole draft, replicated; for a T5-large draft ~1.5 GB of bfloat16 in one HLO module).
Instead:

* `SpeculativeEncoderDecoderModel.get_initial_variables` adds the draft's params as the
  variable collection `draft`, with their logical axes as `draft_axes`. T5X keeps every
  non-params collection in `TrainState.flax_mutables`, partitions it by those axes (the
  draft splits over the model axis like the target) and passes it to the infer step as a
  sharded argument (`t5x.utils.get_infer_fn`), where the model decodes with it.
* `restore_draft`, one of `RestoreCheckpointConfig.state_transformation_fns`
  (configs/runs/infer.gin), fills that collection from the draft's T5X checkpoint (local
  or gs://) while T5X restores the target's, so T5X reads, casts and shards both alike.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import feature_draft, network
from specdec_t5x.integration import checkpoints

COLLECTION = 'draft'  # T5X state: flax_mutables['draft'] (axes: flax_mutables_axes)


def module_for(config: Any) -> Any:
  """The draft module a gin DRAFT_CONFIG names: a feature head for a FeatureDraftConfig,
  else a T5 network."""
  if isinstance(config, feature_draft.FeatureDraftConfig):
    return feature_draft.FeatureDraft(config)
  return network.Transformer(config)


def carries_draft(draft_module: Any) -> bool:
  """Whether a draft's weights travel in T5X's state: drafts that are T5 networks or
  feature-reading heads (feature_draft.py)."""
  return isinstance(draft_module, (network.Transformer, feature_draft.FeatureDraft))


def initial_variables(draft_module: Any, rng: jax.Array,
                      params: Optional[Any] = None) -> Dict[str, Any]:
  """{'draft': params, 'draft_axes': their logical axes} for T5X's initial variables.

  Random params (T5X only takes their shapes, or uses them with `fallback_init_rng`),
  or `params` when the model was given its draft's weights.
  """
  if isinstance(draft_module, feature_draft.FeatureDraft):
    variables = feature_draft.init_variables(draft_module.config, rng)
  else:
    dummy = jnp.ones((1, 4), jnp.int32)
    variables = draft_module.init(rng, dummy, dummy, dummy)
  return {COLLECTION: variables['params'] if params is None else params,
          f'{COLLECTION}_axes': variables['params_axes']}


def params_from(flax_mutables: Optional[Mapping[str, Any]]) -> Optional[Any]:
  """The draft params T5X passed to the infer step in `flax_mutables`, if any."""
  if not flax_mutables or COLLECTION not in flax_mutables:
    return None
  return flax_mutables[COLLECTION]


def restore_draft(ckpt_state: Mapping[str, Any], target_state: Mapping[str, Any],
                  is_resuming: bool = False, *, checkpoint: Optional[str],
                  config: Any = None, dtype: Optional[str] = None) -> Dict[str, Any]:
  """A T5X `RestoreStateTransformationFn`: the target checkpoint's state dict plus the
  draft's params from `checkpoint`, where T5X's state has a draft (else unchanged).

  Bind `checkpoint`, `config` (the draft's T5Config or FeatureDraftConfig, to check the tree) and `dtype` in
  gin; T5X calls it with the checkpoint's and the model's state dicts.
  """
  del is_resuming
  mutables = dict(target_state.get('flax_mutables') or {})
  if COLLECTION not in mutables:
    return dict(ckpt_state)
  if checkpoint is None:
    raise ValueError('The model has a draft network but DRAFT_CHECKPOINT is None: set it '
                     "(--gin.DRAFT_CHECKPOINT=\"'/path/to/checkpoint_N'\") or drop the draft "
                     '(--gin.DRAFT_CONFIG=None).')
  params = checkpoints.load_params(checkpoint, dtype=None if dtype is None else jnp.dtype(dtype),
                                   config=config)
  params = jax.tree_util.tree_map(np.asarray, flax.core.unfreeze(params))
  out = dict(ckpt_state)
  out['flax_mutables'] = dict(out.get('flax_mutables') or {}, **{COLLECTION: params})
  return out
