"""The decode variables: every packed layer of a network, made once per params tree.

On the CPU backend `generate` applies a network (network.Transformer, feature_draft.
FeatureDraft) with one more variable collection than its params: with the kernels enabled,
matmul.COLLECTION, each packed layer's PackedKernel in the format `plan` gives it
(modes.panel_format: float32 or bfloat16 storage for float32 arithmetic, pair panels for
bfloat16 arithmetic); with XLA's dot, for tied logits, layers.TRANSPOSED (the embedding
transposed once). Made once per params tree and cached while it lives (`decode_variables`).
"""

from __future__ import annotations

import collections
import functools
import logging
from typing import Any, Dict, Optional, Tuple
import weakref

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import checks, feature_draft, layers, network
from specdec_t5x.algorithm.cpu import f32, matmul, modes

Path = Tuple[str, ...]
_EMBEDDING = ('token_embedder', 'embedding')
# The layers computed in float32 whatever the network's dtype (T5X's logits; a feature
# head's predicted features), by their module's name; every other Dense has the dtype.
_FLOAT32_LAYERS = {'logits_dense': 'logits', 'feature_out': 'float32'}


def packed_weights(params) -> Dict[Path, jax.Array]:
  """{flat path: [K, N] float32 or bfloat16 weight} of every Dense kernel, and for tied
  logits the token embedding transposed (at the embedding's path)."""
  flat, packs = traverse_util.flatten_dict(params), (jnp.float32, jnp.bfloat16)
  weights = {path: w for path, w in flat.items()
             if path[-1] == 'kernel' and w.ndim == 2 and w.dtype in packs}
  embedding = flat.get(_EMBEDDING)
  tied = not any('logits_dense' in path for path in flat)  # else packed above
  if tied and embedding is not None and embedding.dtype in packs:
    weights[_EMBEDDING] = embedding.T
  return weights


def role(path: Path) -> str:
  """A packed weight's role (modes.ROLES): the tied embedding is the logits."""
  return 'logits' if path == _EMBEDDING else _FLOAT32_LAYERS.get(path[-2], 'dtype')


def _holds(weights) -> jax.Array:
  held = [f32.holds_in_bf16(w) for w in weights if w.dtype == jnp.float32]
  return jnp.all(jnp.stack(held)) if held else jnp.bool_(bool(weights))  # bfloat16: by dtype


def kernels_hold_in_bf16(params) -> jax.Array:
  """Scalar bool: bfloat16 holds every packed weight exactly (a model restored from a
  bfloat16 checkpoint), so storing them as bfloat16 loses nothing."""
  return _holds(list(packed_weights(params).values()))


_HOLDS = jax.jit(_holds)


def _exact(weights) -> bool:
  """bfloat16 holds `weights` exactly: bfloat16 ones by their dtype (known inside a trace
  too), float32 ones by their values (a tracer inside a trace: False there)."""
  if weights and all(w.dtype == jnp.bfloat16 for w in weights):
    return True
  held = _HOLDS(weights)
  return not checks.is_traced(held) and bool(held)


def plan(module, params, mode: Optional[str] = None) -> Dict[Path, Tuple[Optional[str], str]]:
  """{flat path of a packed weight: (format or None, why)} for `module` (its config's dtype)
  decoding in kernel `mode` with the kernels enabled: modes.panel_format per layer, told
  whether bfloat16 holds exactly every weight that float32 arithmetic would read."""
  dtype, weights = module.config.dtype, packed_weights(params)
  first = {p: modes.panel_format(mode, dtype, role(p), False)[0] for p in weights}
  f32_weights = [w for p, w in weights.items() if first[p] == modes.F32_PANELS]
  exact = bool(f32_weights) and modes.bf16_storage(mode) and _exact(f32_weights)
  return {p: modes.panel_format(mode, dtype, role(p), exact) for p in weights}


def decode_kernels(params, formats: Optional[Dict[Path, Optional[str]]] = None) -> dict:
  """The COLLECTION variables: {layer path: PackedKernel} for each weight packed_weights
  lists, in its format (`formats`; None: float32 storage for every one; a weight whose
  format is None or absent is not packed). Pass them beside the params
  (`{'params': p, COLLECTION: decode_kernels(p)}`) to `encode`, `init_cache` and `extend`.
  The teacher-forced `__call__` (training, scoring, T5X) never gets them."""
  weights = packed_weights(params)
  formats = {p: modes.F32_PANELS for p in weights} if formats is None else formats
  return traverse_util.unflatten_dict({path: matmul.pack(w, formats[path])
                                       for path, w in weights.items() if formats.get(path)})


def transposed_embedding(params) -> dict:
  """The `layers.TRANSPOSED` variables for decoding with XLA's dot on CPU: the tied token
  embedding as float32 [emb, vocab] (Embed.attend then skips the transpose XLA:CPU would
  copy on every one-row call). Pass them beside the params, as decode_kernels'."""
  embedding = params['token_embedder']['embedding']
  return {'token_embedder': {'embedding': embedding.astype(jnp.float32).T}}


def collection(module, mode: Optional[str]) -> Optional[str]:
  """Which decode-only collection `module` gets on this backend in kernel `mode`:
  matmul.COLLECTION where the kernels are enabled, else layers.TRANSPOSED for tied logits,
  else None."""
  if (not isinstance(module, (network.Transformer, feature_draft.FeatureDraft))
      or jax.default_backend() != 'cpu'):
    return None
  if modes.enabled(mode):
    return matmul.COLLECTION
  tied = isinstance(module, network.Transformer) and module.config.logits_via_embedding
  return layers.TRANSPOSED if tied else None


_PACKED: 'collections.OrderedDict[Any, Tuple[list, Tuple[Any, dict]]]' = collections.OrderedDict()
_PACKED_KEEP = 4  # params trees whose decode collections (decode_variables) stay cached
_MAKE_PANELS = jax.jit(lambda params, formats: decode_kernels(params, dict(formats)),
                       static_argnums=1)
_MAKE_TRANSPOSED = jax.jit(transposed_embedding)


_PLACED: 'collections.OrderedDict[Any, Tuple[list, Any]]' = collections.OrderedDict()


def on_device(params):
  """`params` with its numpy leaves on the default device: placed once per params tree
  and cached while its leaves live (as the packed collections are), since numpy params
  (checkpoints.load_params returns them) would otherwise be copied to the device by every
  decode call (inside an outer trace they are staged into it, and not kept). Params without
  numpy leaves (device arrays, tracers) come back as they are.
  Like every cache here it knows a tree by its leaves' identity: give new arrays, not
  arrays changed in place."""
  leaves = jax.tree_util.tree_leaves(params)
  if not any(isinstance(x, np.ndarray) for x in leaves):
    return params
  key = tuple(id(x) for x in leaves)
  placed = _cached(_PLACED, key, leaves)
  if placed is None:
    placed = jax.device_put(params)  # inside an outer trace: staged into it, not kept
    if not any(checks.is_traced(x) for x in jax.tree_util.tree_leaves(placed)):
      _keep(_PLACED, key, leaves, placed)
  return placed


def _cached(cache, key, leaves) -> Any:
  """The value `cache` keeps for the params tree of these leaves (None: none kept, or one
  of another tree that reused their ids)."""
  hit = cache.get(key)
  if hit is None or any(ref() is not x for ref, x in zip(hit[0], leaves)):
    return None
  cache.move_to_end(key)
  return hit[1]


def _keep(cache, key, leaves, value) -> None:
  """Keeps `value` in `cache` while every leaf lives (not at all for leaves without weak
  references: made again each call); the least recently used beyond _PACKED_KEEP go."""
  try:
    refs = [weakref.ref(x, functools.partial(_drop, cache, key)) for x in leaves]
  except TypeError:
    return
  cache[key] = (refs, value)
  while len(cache) > _PACKED_KEEP:
    cache.popitem(last=False)


def decode_variables(module, params, mode: Optional[str] = None) -> dict:
  """The variables the decode path applies `module` with: {'params': params} (numpy leaves
  placed on the device once: `on_device`), plus, for a
  network.Transformer or feature head on the CPU backend, one more collection made once
  per params tree, cached while it lives and freed with it (`collection`): its packed
  layers in the formats `plan` gives them (kernel `mode`: DecodeConfig.cpu_kernels; None:
  the default mode), or for XLA's dot and tied logits the embedding transposed.

  Only concrete values are cached. Called inside an outer trace (generate under jit/pjit,
  as T5X's infer calls the model), the collection is staged into that trace even for
  concrete params, and its values must not outlive it: they are made per call there (with
  float32 storage for float32 weights: a traced weight's values cannot be checked).

  Params spread over more than one device (`devices_holding`) get neither: packing would
  gather every weight onto each device and each would compute the whole model, so XLA's
  dot (which GSPMD partitions) is used on the params as they are, with one log line.
  """
  kind = collection(module, mode)
  if kind is None:
    return {'params': on_device(params)}
  dtype = jnp.dtype(module.config.dtype)
  policy = (kind == matmul.COLLECTION and modes.bf16_storage(mode),
            kind == matmul.COLLECTION and modes.pair_arithmetic(mode, dtype))
  given = jax.tree_util.tree_leaves(params)
  key = (kind, type(module), dtype) + policy + tuple(id(x) for x in given)
  hit = _cached(_PACKED, key, given)
  if hit is not None:  # the same leaves: placed, on one device, packed before
    placed, made = hit
    return {'params': params if placed is None else placed, kind: made}
  given_params, params = params, on_device(params)
  variables = {'params': params}
  spread = devices_holding(jax.tree_util.tree_leaves(params))
  if spread > 1:
    if kind == matmul.COLLECTION:
      _log_sharded(spread)
    return variables
  if kind == matmul.COLLECTION:
    formats = tuple((p, f) for p, (f, _) in plan(module, params, mode).items() if f)
    made = _MAKE_PANELS(params, formats)
  else:
    made = _MAKE_TRANSPOSED(params)
  if not any(checks.is_traced(x) for x in jax.tree_util.tree_leaves((made, params))):
    # An entry goes when its params do (its panels are a second copy of the weights), so it
    # keeps a placed copy (numpy leaves), never the given leaves themselves. Inside a trace
    # nothing is kept.
    _keep(_PACKED, key, given, (None if params is given_params else params, made))
  return dict(variables, **{kind: made})


def cached_collections() -> list:
  """The decode collections cached now (one per params tree), least recently used first."""
  return [made for _, (_, made) in _PACKED.values()]


def _drop(cache, key, _dead_ref) -> None:
  """Drops a cache entry whose params tree lost a leaf (a weak reference's callback; the
  cache is bound in, so this also runs while the interpreter shuts down)."""
  cache.pop(key, None)


def devices_holding(leaves) -> int:
  """How many devices params may be spread over: for concrete leaves, the largest device
  set of a jax.Array's sharding (numpy leaves: 1). Inside a trace the shardings of a
  partitioned program cannot be seen (pjit's in_shardings leave no trace on the tracers),
  so traced params count as spread over every device of the job (`jax.device_count()`):
  on a one-device host they are packed as before; on a multi-device one XLA's dot is kept.
  """
  most = 1
  for x in leaves:
    if checks.is_traced(x):
      return max(most, jax.device_count())
    sharding = getattr(x, 'sharding', None)
    if sharding is not None:
      most = max(most, len(sharding.device_set))
  return most


@functools.lru_cache(maxsize=None)
def _log_sharded(devices: int) -> None:
  logging.warning('specdec_t5x: params are (or may be) spread over %d devices; the packed '
                  'CPU matmul would gather every weight onto each of them, so decoding '
                  'uses XLA dot.', devices)
