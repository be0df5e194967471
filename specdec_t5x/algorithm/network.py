"""T5 v1.0 / v1.1 encoder-decoder in Flax with a multi-token verification cache.

The parameter tree is identical to T5X's `t5x/examples/t5/network.py`, so T5X parameters
drop in unchanged, and every parameter carries the same logical axis names (`init` returns
T5X's `params_axes` collection, which T5X's partitioner reads). `__call__` takes T5X's module
call signature (segment ids and positions of packed examples, `enable_dropout`, `decode`), so
`t5x.models.EncoderDecoderModel` can initialise, train and score it. It applies T5X's
casts (LayerNorm, attention logits and softmax, float32 logits), so in bfloat16 as in
float32 its teacher-forced logits equal T5X's bit for bit (tests/test_network_t5x.py).
T5X's one-token decode cache (`decode=True`) is not implemented; decoding uses the methods
below. Beyond the teacher-forced forward pass it offers:

* `encode`: the encoder stack;
* `init_cache`: cross-attention keys/values of the encoder output, computed once per
  sequence, plus an empty self-attention cache;
* `extend`: append k >= 1 decoder tokens per call at per-row positions. Writes
  overwrite (T5X's own cache adds and keeps one scalar index), and causal masking and the
  relative-position bias come from each row's true positions, so rolling a row back is
  just passing a smaller position next time: stale slots lie beyond every query's
  position and are masked.

The self-attention cache has one extra leading slot for position -1 (physical slot =
position + 1). Keys at negative positions are always masked; it lets a caller write
"the token before BOS" without a special case (see decoding.py).

Shapes use T5X's bracket comments: `# [batch, length, emb]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np

NUM_BUCKETS = 32
MAX_DISTANCE = 128
NEG_INF = -1e10


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Global hyperparameters of the T5 Transformer (T5X's field names)."""
  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('relu',)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  # Attention logits and softmax in float32 even when `dtype` is bfloat16 (T5X's flag;
  # off in T5X's configs, so off here: bfloat16 logits equal T5X's bit for bit).
  float32_attention_logits: bool = False


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


def _kernel_init(scale: float = 1.0):
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
    self.query = Dense(inner, self.dtype, _kernel_init(1.0 / self.head_dim), qkv_axes)
    self.key = Dense(inner, self.dtype, _kernel_init(), qkv_axes)
    self.value = Dense(inner, self.dtype, _kernel_init(), qkv_axes)
    self.out = Dense(self.out_dim, self.dtype, _kernel_init(), ('joined_kv', 'embed'))
    self.dropout = nn.Dropout(self.dropout_rate)

  def _split(self, x):
    return x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim))  # [b, len, heads, d]

  def project_q(self, x):
    return self._split(self.query(x))

  def project_kv(self, x):
    return self._split(self.key(x)), self._split(self.value(x))

  def attend(self, q, k, v, bias, deterministic: bool = True):
    """q [b, q, h, d], k/v [b, k, h, d], bias [b or 1, h or 1, q, k] (mask folded in)."""
    if self.float32_logits:
      q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k)  # [b, h, q, k]
    logits = logits + bias.astype(logits.dtype)
    weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
    weights = self.dropout(weights, deterministic=deterministic)
    out = jnp.einsum('bhqk,bkhd->bqhd', weights, v)
    return self.out(out.reshape(out.shape[:2] + (self.num_heads * self.head_dim,)))

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
      y = _act(name)(Dense(self.mlp_dim, self.dtype, _kernel_init(), ('embed', 'mlp'),
                           name=dense_name)(x))
      h = y if h is None else h * y
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return Dense(x.shape[-1], self.dtype, _kernel_init(), ('mlp', 'embed'), name='wo')(h)


def _attention(cfg: T5Config, **kwargs) -> Attention:
  return Attention(cfg.num_heads, cfg.head_dim, cfg.emb_dim, cfg.dtype, cfg.dropout_rate,
                   cfg.float32_attention_logits, **kwargs)


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x, bias, deterministic: bool = True):
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    y = RMSNorm(cfg.dtype, name='pre_attention_layer_norm')(x)
    y = _attention(cfg, name='attention')(y, y, bias, deterministic)
    x = x + drop(y, deterministic=deterministic)
    y = RMSNorm(cfg.dtype, name='pre_mlp_layer_norm')(x)
    y = MlpBlock(cfg.mlp_dim, tuple(cfg.mlp_activations), cfg.dtype, cfg.dropout_rate,
                 name='mlp')(y, deterministic)
    return x + drop(y, deterministic=deterministic)


class DecoderLayer(nn.Module):
  """Decoder layer with a teacher-forced path and a cached multi-token path."""
  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = RMSNorm(cfg.dtype)
    self.self_attention = _attention(cfg)
    self.pre_cross_attention_layer_norm = RMSNorm(cfg.dtype)
    self.encoder_decoder_attention = _attention(cfg)
    self.pre_mlp_layer_norm = RMSNorm(cfg.dtype)
    self.mlp = MlpBlock(cfg.mlp_dim, tuple(cfg.mlp_activations), cfg.dtype, cfg.dropout_rate)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def _cross_and_mlp(self, x, cross_q_fn, deterministic):
    y = cross_q_fn(self.pre_cross_attention_layer_norm(x))
    x = x + self.dropout(y, deterministic=deterministic)
    y = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(y, deterministic=deterministic)

  def __call__(self, x, encoded, self_bias, cross_bias, deterministic: bool = True):
    y = self.pre_self_attention_layer_norm(x)
    y = self.self_attention(y, y, self_bias, deterministic)
    x = x + self.dropout(y, deterministic=deterministic)
    cross = lambda z: self.encoder_decoder_attention(z, encoded, cross_bias, deterministic)
    return self._cross_and_mlp(x, cross, deterministic)

  def cross_kv(self, encoded):
    return self.encoder_decoder_attention.project_kv(encoded)

  def extend(self, x, layer_cache, slots, self_bias, cross_bias):
    """Cached decode of k tokens. x [b, k, emb]; slots [b] physical slot of x[:, 0]."""
    y = self.pre_self_attention_layer_norm(x)
    q = self.self_attention.project_q(y)
    k_new, v_new = self.self_attention.project_kv(y)  # [b, k, h, d]
    write = jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u.astype(c.dtype), (s, 0, 0)))
    k_cache = write(layer_cache['k'], k_new, slots)
    v_cache = write(layer_cache['v'], v_new, slots)
    y = self.self_attention.attend(q, k_cache, v_cache, self_bias)
    x = x + y
    cross = lambda z: self.encoder_decoder_attention.attend(
        self.encoder_decoder_attention.project_q(z), layer_cache['cross_k'],
        layer_cache['cross_v'], cross_bias)
    x = self._cross_and_mlp(x, cross, True)
    return x, dict(layer_cache, k=k_cache, v=v_cache)


def _mask_to_bias(mask, dtype):
  """Boolean mask -> additive bias (0 or NEG_INF) in `dtype`, as T5X builds it."""
  return jnp.where(mask, 0.0, NEG_INF).astype(dtype)


def _pairwise(query, key, fn=jnp.logical_and):
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

    In float32 whatever `dtype` is, as T5X's tied logits (`attend_dtype=float32`).
    """
    return jnp.dot(query.astype(jnp.float32), self.embedding.astype(jnp.float32).T)


_T5X_DECODE_UNSUPPORTED = (
    'specdec_t5x.network.Transformer does not implement T5X\'s one-token autoregressive cache '
    '(called with decode={decode}, prefill={prefill}). Decode with specdec_t5x.generate, or '
    'with the network\'s encode / init_cache / extend methods (a cache that takes k tokens per '
    'call at per-row positions); specdec_t5x.models.EncoderDecoderModel does this for T5X.')


def _check_not_t5x_decode(decode, prefill):
  if decode or prefill:
    raise NotImplementedError(_T5X_DECODE_UNSUPPORTED.format(decode=decode, prefill=prefill))


class Transformer(nn.Module):
  """T5 encoder-decoder; `apply` gives teacher-forced logits [batch, length, vocab]."""
  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, dtype=cfg.dtype)
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self, encoder_input_tokens, encoder_segment_ids=None, enable_dropout: bool = False):
    """[batch, enc_len] int -> [batch, enc_len, emb].

    `encoder_segment_ids` [batch, enc_len] (packed examples): tokens attend only within
    their segment.
    """
    return self.encoder(encoder_input_tokens, encoder_segment_ids,
                        deterministic=not enable_dropout)

  def decode(self, encoded, encoder_input_tokens, decoder_input_tokens,
             decoder_target_tokens=None, encoder_segment_ids=None, decoder_segment_ids=None,
             decoder_positions=None, enable_dropout: bool = False, decode: bool = False,
             max_decode_length=None, prefill: bool = False, prefill_lengths=None):
    """Teacher-forced decoder: -> logits [batch, dec_len, vocab] (float32).

    T5X's `decode` signature. `decoder_target_tokens` masks padding (tokens <= 0) when
    given. `decoder_positions` is accepted and unused, as in T5X's T5: the relative
    position bias depends only on index differences, which equal position differences
    within a packed segment, and attention never crosses segments. `decode=True` /
    `prefill=True` (T5X's cache) raise NotImplementedError; `max_decode_length` and
    `prefill_lengths` only matter with them.
    """
    del decoder_positions, max_decode_length, prefill_lengths  # See the docstring.
    _check_not_t5x_decode(decode, prefill)
    return self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                        decoder_target_tokens, encoder_segment_ids, decoder_segment_ids,
                        deterministic=not enable_dropout)

  def init_cache(self, encoded, encoder_input_tokens, max_length: int):
    """Decode cache for up to `max_length` positions (0..max_length-1) per row."""
    return self.decoder.init_cache(encoded, encoder_input_tokens, max_length)

  def extend(self, cache, tokens, positions):
    """Append tokens [batch, k] at positions [batch].. -> (logits [b, k, vocab], cache)."""
    return self.decoder.extend(cache, tokens, positions)

  def __call__(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens=None,
               encoder_segment_ids=None, decoder_segment_ids=None, encoder_positions=None,
               decoder_positions=None, *, enable_dropout: bool = False, decode: bool = False,
               max_decode_length=None, prefill: bool = False, prefill_lengths=None):
    """Teacher-forced logits [batch, dec_len, vocab] (float32); T5X's module signature.

    Args:
      encoder_input_tokens: [batch, enc_len] int, 0 = padding.
      decoder_input_tokens: [batch, dec_len] int, the targets shifted right.
      decoder_target_tokens: [batch, dec_len] int or None; when given, decoder positions
        whose target is 0 attend to nothing and are attended by nothing.
      encoder_segment_ids: [batch, enc_len] or None: packed-example ids; encoder tokens
        attend within their segment, and decoder tokens attend to encoder tokens of their
        own segment (needs `decoder_segment_ids`).
      decoder_segment_ids: [batch, dec_len] or None: causal self-attention within segment.
      encoder_positions: accepted and unused, as in T5X's T5 (relative attention; see
        `decode`).
      decoder_positions: likewise.
      enable_dropout: dropout on (training) or off. The default is off, unlike T5X's
        network; T5X's model classes always pass it.
      decode: T5X's one-token cache; True raises NotImplementedError (use
        specdec_t5x.generate, or encode / init_cache / extend).
      max_decode_length: only meaningful with `decode`.
      prefill: T5X's cache prefill; True raises NotImplementedError.
      prefill_lengths: only meaningful with `prefill`.

    Returns:
      logits [batch, dec_len, vocab] float32.
    """
    del encoder_positions  # See the docstring.
    _check_not_t5x_decode(decode, prefill)
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens,
                       decoder_target_tokens, encoder_segment_ids, decoder_segment_ids,
                       decoder_positions, enable_dropout=enable_dropout,
                       max_decode_length=max_decode_length, prefill_lengths=prefill_lengths)


class Encoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBias(cfg.num_heads, True, cfg.dtype)
    self.layers = [EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)]
    self.encoder_norm = RMSNorm(cfg.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

  def __call__(self, tokens, segment_ids=None, deterministic: bool = True):
    length = tokens.shape[1]
    pos = jnp.arange(length)[None, :]
    valid = tokens > 0
    mask = _pairwise(valid, valid)  # [batch, len, len]
    if segment_ids is not None:
      mask = mask & _pairwise(segment_ids, segment_ids, jnp.equal)
    bias = self.relpos_bias(pos, pos) + _mask_to_bias(mask[:, None], self.config.dtype)
    x = self.dropout(self.shared_embedding(tokens.astype(jnp.int32)), deterministic=deterministic)
    for layer in self.layers:
      x = layer(x, bias, deterministic)
    return self.dropout(self.encoder_norm(x), deterministic=deterministic)


class Decoder(nn.Module):
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBias(cfg.num_heads, False, cfg.dtype)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = RMSNorm(cfg.dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
    if not cfg.logits_via_embedding:
      # float32 whatever cfg.dtype is, as in T5X ("for stability").
      self.logits_dense = Dense(cfg.vocab_size, jnp.float32, _kernel_init(), ('embed', 'vocab'))

  def _logits(self, x, deterministic):
    """Decoder output [b, len, emb] -> float32 logits [b, len, vocab]."""
    x = self.dropout(self.decoder_norm(x), deterministic=deterministic)
    if self.config.logits_via_embedding:  # T5 v1.0: tied, scaled by 1/sqrt(emb_dim)
      return self.shared_embedding.attend(x) / jnp.sqrt(jnp.float32(x.shape[-1]))
    return self.logits_dense(x)

  def __call__(self, encoded, encoder_tokens, decoder_input_tokens, decoder_target_tokens=None,
               encoder_segment_ids=None, decoder_segment_ids=None, deterministic: bool = True):
    if encoder_segment_ids is not None and decoder_segment_ids is None:
      raise ValueError('encoder_segment_ids was given without decoder_segment_ids; packed '
                       'examples need both (cross attention stays within a segment).')
    length = decoder_input_tokens.shape[1]
    pos = jnp.arange(length)[None, :]
    mask = _pairwise(pos, pos, jnp.greater_equal)  # [1, q, k] causal
    dec_valid = (decoder_target_tokens > 0) if decoder_target_tokens is not None else None
    if dec_valid is not None:
      mask = mask & _pairwise(dec_valid, dec_valid)
    if decoder_segment_ids is not None:
      mask = mask & _pairwise(decoder_segment_ids, decoder_segment_ids, jnp.equal)
    self_bias = self.relpos_bias(pos, pos) + _mask_to_bias(mask[:, None], self.config.dtype)
    cross_mask = (encoder_tokens > 0)[:, None, :]  # [b, 1, enc]
    if dec_valid is not None:
      cross_mask = cross_mask & dec_valid[:, :, None]
    if encoder_segment_ids is not None:
      cross_mask = cross_mask & _pairwise(decoder_segment_ids, encoder_segment_ids, jnp.equal)
    cross_bias = _mask_to_bias(cross_mask[:, None], self.config.dtype)
    x = self.shared_embedding(decoder_input_tokens.astype(jnp.int32))
    x = self.dropout(x, deterministic=deterministic)
    for layer in self.layers:
      x = layer(x, encoded, self_bias, cross_bias, deterministic)
    return self._logits(x, deterministic)

  def init_cache(self, encoded, encoder_tokens, max_length: int):
    cfg = self.config
    b = encoded.shape[0]
    # Slot 0 holds position -1 (always masked); slots 1.. hold positions 0..max_length-1.
    shape = (b, max_length + 1, cfg.num_heads, cfg.head_dim)
    layers = []
    for layer in self.layers:
      ck, cv = layer.cross_kv(encoded)
      layers.append({'k': jnp.zeros(shape, cfg.dtype), 'v': jnp.zeros(shape, cfg.dtype),
                     'cross_k': ck, 'cross_v': cv})
    return {'layers': layers, 'encoder_mask': encoder_tokens > 0}

  def extend(self, cache, tokens, positions):
    k = tokens.shape[1]
    num_slots = cache['layers'][0]['k'].shape[1]
    q_pos = positions[:, None] + jnp.arange(k)[None, :]  # [b, k]
    key_pos = jnp.arange(num_slots)[None, :] - 1  # [1, slots]
    mask = (key_pos[:, None, :] >= 0) & (key_pos[:, None, :] <= q_pos[:, :, None])  # [b, k, slots]
    dtype = self.config.dtype
    self_bias = self.relpos_bias(q_pos, key_pos) + _mask_to_bias(mask[:, None], dtype)
    cross_bias = _mask_to_bias(cache['encoder_mask'][:, None, None, :], dtype)
    x = self.shared_embedding(tokens.astype(jnp.int32))
    new_layers = []
    for layer, layer_cache in zip(self.layers, cache['layers']):
      x, layer_cache = layer.extend(x, layer_cache, positions + 1, self_bias, cross_bias)
      new_layers.append(layer_cache)
    return self._logits(x, True), dict(cache, layers=new_layers)


# T5 v1.1 sizes (shared/DESIGN.md): emb_dim, num_heads, layers (each stack), mlp_dim.
T5_1_1_SIZES = {
    'small': (512, 6, 8, 1024), 'base': (768, 12, 12, 2048), 'large': (1024, 16, 24, 2816),
    'xl': (2048, 32, 24, 5120), 'xxl': (4096, 64, 24, 10240),
}


def t5_1_1_config(size: str, **overrides) -> T5Config:
  """T5 v1.1 config of a named size (vocab 32128, head_dim 64, gated-GELU, no dropout)."""
  if size not in T5_1_1_SIZES:
    raise ValueError(f'Unknown T5 v1.1 size {size!r}; choose from {sorted(T5_1_1_SIZES)}.')
  emb, heads, layers, mlp = T5_1_1_SIZES[size]
  kwargs = dict(vocab_size=32128, emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
                num_decoder_layers=layers, head_dim=64, mlp_dim=mlp,
                mlp_activations=('gelu', 'linear'), dropout_rate=0.0, logits_via_embedding=False)
  kwargs.update(overrides)
  return T5Config(**kwargs)
