"""The T5 building blocks of network.py: dense, RMS norm, attention, MLP, embedding, bias.

Each keeps T5X's parameter names, shapes and logical axis names (t5x/examples/t5/layers.py)
and T5X's dtype casts, so a tree of these modules is T5X's tree and computes T5X's values
bit for bit. Attention exposes its projections (`project_q`, `project_kv`) and `attend`
separately, so the decoder can run its multi-token cache over them (network.DecoderLayer).
Dense and Embed.attend use the CPU kernels' packed matmul when the variables carry a
packed entry for them (decode only: cpu.packing.decode_variables), through cpu.matmul.apply,
which reads the entry's format; otherwise they are T5X's computation. Embed.attend also
takes the table already transposed (collection TRANSPOSED, decode only:
cpu.packing.transposed_embedding) for XLA's dot on CPU.

Shapes use T5X's bracket comments: `# [batch, length, emb]`.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import rows
from specdec_t5x.algorithm.cpu import attention as cpu_attention, matmul, modes
from specdec_t5x.algorithm.rows import SKIPPED
from specdec_t5x.algorithm.trees import structure as tree_lib

NUM_BUCKETS = 32  # T5's relative-position buckets ...
MAX_DISTANCE = 128  # ... log-spaced up to this distance.
NEG_INF = -1e10  # Additive bias of a masked attention logit.
# The collection holding the token embedding transposed, [emb, vocab] float32, for tied
# logits on XLA:CPU: there a one-row product with `embedding.T` gets the table transposed
# and copied on every call (inside the decode loop: a vocabulary-sized copy per step).
TRANSPOSED = 'transposed'
# The most queries a cached attention call on XLA:CPU attends one at a time (attend_cached);
# a verify window is gamma + 1 queries, and the paper's best gammas are 3-7.
PER_QUERY_MAX = 16


def _per_query(num_queries: int) -> bool:
  """attend_cached attends one query at a time (XLA:CPU, 2..PER_QUERY_MAX queries)."""
  return 1 < num_queries <= PER_QUERY_MAX and modes.cpu_forms()


def _attention_kernel(num_queries: int, *arrays) -> bool:
  """attend_cached runs cpu.attention.cached_attention (the row kernels' CPU forms, float32
  operands, 1..PER_QUERY_MAX queries)."""
  return (num_queries <= PER_QUERY_MAX and all(a.dtype == jnp.float32 for a in arrays)
          and modes.row_kernel())


def _xla_cached_context(q, k_t, v, bias):
  """attend_cached's context [b, q, h, d] in XLA's ops (float32, no dropout)."""
  weights = jax.nn.softmax(jnp.einsum('bqhd,bhdk->bhqk', q, k_t) + bias, axis=-1)
  return jnp.einsum('bhqk,bhkd->bqhd', weights, v)


@jax.custom_vjp
def _kernel_cached_context(q, k_t, v, bias):
  """cpu.attention.cached_attention, differentiable: its gradient is that of the same
  attention in XLA's ops (training a feature head runs its cached attention)."""
  return cpu_attention.cached_attention(q, k_t, v, bias)


def _kernel_context_fwd(q, k_t, v, bias):
  return cpu_attention.cached_attention(q, k_t, v, bias), (q, k_t, v, bias)


def _kernel_context_bwd(operands, grad):
  return jax.vjp(_xla_cached_context, *operands)[1](grad)


_kernel_cached_context.defvjp(_kernel_context_fwd, _kernel_context_bwd)


def _act(name: str):
  if name == 'linear':
    return lambda x: x
  if name == 'gelu':
    return nn.gelu  # tanh approximation, as T5X and HF's "gelu_new"
  return getattr(nn, name)


def _param(module: nn.Module, name: str, init, shape, axes: Sequence[str]):
  """A float32 parameter of `module` that also records its logical axis names.

  The names go to the `params_axes` collection as `<name>_axes` (flax's partitioning
  metadata), which T5X's partitioner maps to mesh axes.
  """
  if len(axes) != len(shape):
    raise ValueError(f'Parameter {name!r} of shape {shape} needs {len(shape)} logical axis '
                     f'names, got {tuple(axes)}.')
  return nn_partitioning.param_with_axes(name, init, shape, jnp.float32, axes=tuple(axes),
                                         module=module)


class Dense(nn.Module):
  """A bias-free dense layer whose kernel is stored 2-D as [in, out], as in T5X."""
  features: int
  dtype: Any = jnp.float32
  kernel_init: Any = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
  kernel_axes: Sequence[str] = ('embed', 'mlp')  # logical names of [in, out]

  @nn.compact
  def __call__(self, x):
    kernel = _param(self, 'kernel', self.kernel_init, (x.shape[-1], self.features),
                    self.kernel_axes)
    if self.has_variable(matmul.COLLECTION, 'kernel'):  # its format says how (decode only)
      return matmul.apply(x, self.get_variable(matmul.COLLECTION, 'kernel'), self.features,
                          self.dtype)
    return jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))


class RMSNorm(nn.Module):
  """T5 layer norm: no mean subtraction, no bias.

  Normalised in float32, then cast to `dtype` before the scale multiplies (in `dtype`),
  as T5X does: in bfloat16 that is two roundings, and T5X's logits depend on them.
  """
  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x):
    scale = _param(self, 'scale', nn.initializers.ones, (x.shape[-1],), ('embed',))
    x = x.astype(jnp.float32)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.epsilon)
    return y.astype(self.dtype) * scale.astype(self.dtype)


def relative_position_bucket(relative_position, bidirectional: bool,
                             num_buckets: int = NUM_BUCKETS, max_distance: int = MAX_DISTANCE):
  """T5's bucketing of (key position - query position), as in T5X (numpy or jnp)."""
  xp = jnp if isinstance(relative_position, jax.Array) else np
  n = -relative_position
  ret = 0
  if bidirectional:
    num_buckets //= 2
    ret = (n < 0).astype(np.int32) * num_buckets
    n = xp.abs(n)
  else:
    n = xp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  scale = (num_buckets - max_exact) / np.log(max_distance / max_exact)
  large = max_exact + (xp.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
                       * scale).astype(np.int32)
  large = xp.minimum(large, num_buckets - 1)
  return ret + xp.where(is_small, n, large)


class RelativePositionBias(nn.Module):
  """One bias table per stack, shared by its layers: `rel_embedding [heads, buckets]`."""
  num_heads: int
  bidirectional: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, query_pos, key_pos):
    """query_pos [batch, q], key_pos [batch or 1, k] -> bias [batch, heads, q, k]."""
    table = _param(self, 'rel_embedding', nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform'),
                   (self.num_heads, NUM_BUCKETS), ('heads', 'relpos_buckets'))
    buckets = relative_position_bucket(key_pos[:, None, :] - query_pos[:, :, None],
                                       self.bidirectional)  # [batch, q, k]
    bias = jnp.take(table, buckets, axis=1)  # [heads, batch, q, k]
    return jnp.transpose(bias, (1, 0, 2, 3)).astype(self.dtype)


def kernel_init(scale: float = 1.0):
  """T5X's kernel initialiser: truncated normal, variance `scale` / fan_in."""
  return nn.initializers.variance_scaling(scale, 'fan_in', 'truncated_normal')


class Attention(nn.Module):
  """Multi-head dot-product attention without 1/sqrt(d) scaling (folded into init).

  Attention logits, bias addition and softmax run in `dtype` unless `float32_logits`
  (T5X's casts: with bfloat16 and the flag off, as in T5X's configs, they are bfloat16).
  """
  num_heads: int
  head_dim: int
  out_dim: int
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  float32_logits: bool = False

  def setup(self):
    inner = self.num_heads * self.head_dim
    # T5X folds the 1/sqrt(head_dim) query scaling into the query initialiser.
    qkv_axes = ('embed', 'joined_kv')
    self.query = Dense(inner, self.dtype, kernel_init(1.0 / self.head_dim), qkv_axes)
    self.key = Dense(inner, self.dtype, kernel_init(), qkv_axes)
    self.value = Dense(inner, self.dtype, kernel_init(), qkv_axes)
    self.out = Dense(self.out_dim, self.dtype, kernel_init(), ('joined_kv', 'embed'))
    self.dropout = nn.Dropout(self.dropout_rate)

  def _split(self, x):
    return x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim))  # [b, len, heads, d]

  def project_q(self, x):
    return self._split(self.query(x))

  def project_kv(self, x):
    return self._split(self.key(x)), self._split(self.value(x))

  def _context(self, q, k, v, bias, logits_eq: str, out_eq: str, deterministic: bool):
    """The two attention products for keys/values in either layout -> [b, q, h, d]."""
    if self.float32_logits:
      q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    logits = jnp.einsum(logits_eq, q, k)  # [b, h, q, k]
    logits = logits + bias.astype(logits.dtype)
    weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
    weights = self.dropout(weights, deterministic=deterministic)
    return jnp.einsum(out_eq, weights, v)  # [b, q, h, d]

  def _out(self, context):
    return self.out(context.reshape(context.shape[:2] + (self.num_heads * self.head_dim,)))

  def attend(self, q, k, v, bias, deterministic: bool = True):
    """q [b, q, h, d], k/v [b, k, h, d], bias [b or 1, h or 1, q, k] (mask folded in)."""
    return self._out(self._context(q, k, v, bias, 'bqhd,bkhd->bhqk', 'bhqk,bkhd->bqhd',
                                   deterministic))

  def attend_cached(self, q, k_t, v, bias):
    """`attend` over keys/values stored in the decode cache's layouts: q [b, q, h, d],
    k_t [b, h, d, k], v [b, h, k, d], so that neither needs a transpose on each call.

    On XLA:CPU a call of 2..PER_QUERY_MAX queries (a verify window, a draft's catch-up)
    attends one query at a time: there each one-query product is the matrix-vector dot of
    a one-token call, while a product over a few queries runs as a general matrix product
    of a high fixed cost (10-20 us each; attending per query makes a 4-token verify of the
    demo target 13-20% cheaper). Each query is then computed as a one-token call computes it.
    With the row kernels on (float32, 1..PER_QUERY_MAX queries) one
    cpu.attention.cached_attention call does it all per attention block, in place of ~6
    small XLA:CPU instructions per query, each of a fixed cost; for a bfloat16 network in
    kernel mode 'packed_bf16', cpu.attention.cached_attention_bf16, with T5X's bfloat16
    casts (cpu.modes.pair_attention). k_t and
    v may be a cache's uint16 bits of 16-bit floats (rows.storage_dtype).
    """
    num = q.shape[1]
    if num <= PER_QUERY_MAX and modes.pair_attention(q.dtype):  # bits or bfloat16
      return self._out(cpu_attention.cached_attention_bf16(q, k_t, v, bias, self.float32_logits)
                       .astype(self.dtype))
    k_t, v = rows.load(k_t, self.dtype), rows.load(v, self.dtype)  # a cache's 16-bit bits

    def context(q, bias):
      return self._context(q, k_t, v, bias, 'bqhd,bhdk->bhqk', 'bhqk,bhkd->bqhd', True)
    if _attention_kernel(num, q, k_t, v):
      return self._out(_kernel_cached_context(q, k_t, v, bias.astype(jnp.float32))
                       .astype(self.dtype))
    if not _per_query(num):
      return self._out(context(q, bias))
    per_row = bias.shape[2] > 1  # else one bias row serves every query
    return self._out(jnp.concatenate(
        [context(q[:, i:i + 1], bias[:, :, i:i + 1] if per_row else bias) for i in range(num)],
        axis=1))

  def __call__(self, inputs_q, inputs_kv, bias, deterministic: bool = True):
    k, v = self.project_kv(inputs_kv)
    return self.attend(self.project_q(inputs_q), k, v, bias, deterministic)


class MlpBlock(nn.Module):
  """Gated (v1.1: gelu * linear) or plain (v1.0: relu) feed-forward block."""
  mlp_dim: int
  activations: Sequence[str]
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    h = None
    for i, name in enumerate(self.activations):
      dense_name = 'wi' if len(self.activations) == 1 else f'wi_{i}'
      y = _act(name)(Dense(self.mlp_dim, self.dtype, kernel_init(), ('embed', 'mlp'),
                           name=dense_name)(x))
      h = y if h is None else h * y
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return Dense(x.shape[-1], self.dtype, kernel_init(), ('mlp', 'embed'), name='wo')(h)


def mask_to_bias(mask, dtype):
  """Boolean mask -> additive bias (0 or NEG_INF) in `dtype`, as T5X builds it."""
  return jnp.where(mask, 0.0, NEG_INF).astype(dtype)


def empty_decode_cache(layers, encoded, encoder_tokens, max_length: int, num_heads: int,
                       head_dim: int, dtype):
  """The decode cache of a decoder whose `layers` each have `cross_kv(encoded)`: per layer
  self-attention keys [b, h, d, slots] (stored transposed) and values [b, h, slots, d],
  zero, and the cross-attention keys/values; plus the encoder mask. Slot 0 holds position
  -1 (always masked); slots 1.. hold positions 0..max_length-1."""
  b, slots = encoded.shape[0], max_length + 1
  cache_layers = []
  for layer in layers:
    ck, cv = layer.cross_kv(encoded)
    stored = rows.storage_dtype(dtype)  # 16-bit floats as their bits on CPU (rows.py)
    cache_layers.append({'k': jnp.zeros((b, num_heads, head_dim, slots), stored),
                         'v': jnp.zeros((b, num_heads, slots, head_dim), stored),
                         'cross_k': ck, 'cross_v': cv})
  return {'layers': cache_layers, 'encoder_mask': encoder_tokens > 0,
          SKIPPED: jnp.zeros((), bool)}


def decode_biases(relpos_bias, cache, positions, k: int, dtype, tree=None):
  """The attention biases of a cached call over k tokens from `positions` [b] (a cache of
  empty_decode_cache's layout): self-attention [b, h, k, slots] (relative positions, and
  causality over the slots, slot 0 masked) and cross-attention [b, 1, 1, enc]. With `tree`
  (parents [b, k], trees/structure.py) the tokens are a draft tree's nodes: each at its depth's
  position, seeing the committed prefix and its ancestors (trees.structure.attention_layout)."""
  num_slots = cache['layers'][0]['v'].shape[2]
  if tree is not None:
    if np.shape(tree) != (positions.shape[0], k):
      raise ValueError(f'A tree call over [batch, k] = {(positions.shape[0], k)} tokens takes '
                       f'parents of that shape, got {np.shape(tree)}.')
    q_pos, key_pos, mask = tree_lib.attention_layout(tree, positions, num_slots)
  else:
    q_pos = positions[:, None] + jnp.arange(k)[None, :]  # [b, k]
    key_pos = jnp.arange(num_slots)[None, :] - 1  # [1, slots]
    # [b, k, slots]
    mask = (key_pos[:, None, :] >= 0) & (key_pos[:, None, :] <= q_pos[:, :, None])
  self_bias = relpos_bias(q_pos, key_pos) + mask_to_bias(mask[:, None], dtype)
  return self_bias, mask_to_bias(cache['encoder_mask'][:, None, None, :], dtype)


def fused_features(final, taps):
  """What a feature draft reads from the target: the decoder's final normalised output
  [b, k, E], then the residual stream after each tapped layer, RMS-normalised without a
  scale (EAGLE-3's fusion of low, middle and high layers) -> [b, k, E * (1 + len(taps))]
  float32 (just `final` with no taps)."""
  parts = [final.astype(jnp.float32)]
  for tap in taps:
    tap = tap.astype(jnp.float32)
    parts.append(tap * jax.lax.rsqrt(jnp.mean(tap * tap, axis=-1, keepdims=True) + 1e-6))
  return jnp.concatenate(parts, axis=-1) if taps else parts[0]


def pairwise(query, key, fn=jnp.logical_and):
  """[batch, q], [batch, k] -> [batch, q, k]: fn of every (query, key) pair."""
  return fn(query[:, :, None], key[:, None, :])


class Embed(nn.Module):
  """The shared token embedding `embedding [vocab, emb]` (input tokens and tied logits)."""
  num_embeddings: int
  features: int
  dtype: Any = jnp.float32
  embedding_init: Any = nn.initializers.normal(stddev=1.0)

  def setup(self):
    self.embedding = _param(self, 'embedding', self.embedding_init,
                            (self.num_embeddings, self.features), ('vocab', 'embed'))

  def __call__(self, tokens):
    """[...] int -> [..., emb]."""
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f'Embed takes integer token ids, got dtype {tokens.dtype}.')
    return jnp.take(self.embedding.astype(self.dtype), tokens, axis=0)

  def attend(self, query):
    """[..., emb] -> [..., vocab] float32: dot products with every embedding.

    In float32 whatever `dtype` is, as T5X's tied logits (`attend_dtype=float32`). With
    decode variables (cpu.packing.decode_variables), the packed transposed table; with the
    TRANSPOSED collection (cpu.packing.transposed_embedding), the same product on the table
    transposed once outside the decode loop.
    """
    if self.has_variable(matmul.COLLECTION, 'embedding'):
      return matmul.apply(query, self.get_variable(matmul.COLLECTION, 'embedding'),
                          self.num_embeddings, jnp.float32)
    if self.has_variable(TRANSPOSED, 'embedding'):
      return jnp.dot(query.astype(jnp.float32), self.get_variable(TRANSPOSED, 'embedding'))
    return jnp.dot(query.astype(jnp.float32), self.embedding.astype(jnp.float32).T)
