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
"the token before BOS" without a special case (see decode/core.py).

Its building blocks are in layers.py, draft trees in trees/. Shapes use T5X's bracket
comments: `# [batch, length, emb]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from specdec_t5x.algorithm import rows
from specdec_t5x.algorithm.layers import (Attention, Dense, Embed, MlpBlock,
                                          RelativePositionBias, RMSNorm, kernel_init,
                                          decode_biases, empty_decode_cache, fused_features,
                                          mask_to_bias, pairwise)
# Re-exported: callers read the bucketing and its constants as network's.
from specdec_t5x.algorithm.layers import (MAX_DISTANCE, NEG_INF, NUM_BUCKETS,  # noqa: F401
                                          relative_position_bucket)


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
    """encoded [b, enc, emb] -> cross-attention keys [b, h, d, enc], values [b, h, enc, d]."""
    k, v = self.encoder_decoder_attention.project_kv(encoded)  # [b, enc, h, d]
    return k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)

  def extend(self, x, layer_cache, slots, self_bias, cross_bias):
    """Cached decode of k tokens. x [b, k, emb]; slots [b] physical slot of x[:, 0]. The
    self-attention cache holds keys as [b, h, d, slots] and values as [b, h, slots, d]."""
    y = self.pre_self_attention_layer_norm(x)
    q = self.self_attention.project_q(y)
    k_new, v_new = self.self_attention.project_kv(y)  # [b, k, h, d]
    (k_cache, v_cache), fits = rows.update_all(
        (layer_cache['k'], layer_cache['v']),
        (rows.store(k_new.transpose(0, 2, 3, 1), layer_cache['k']),
         rows.store(v_new.transpose(0, 2, 1, 3), layer_cache['v'])), slots, axes=(3, 2))
    y = self.self_attention.attend_cached(q, k_cache, v_cache, self_bias)
    x = x + y
    cross = lambda z: self.encoder_decoder_attention.attend_cached(
        self.encoder_decoder_attention.project_q(z), layer_cache['cross_k'],
        layer_cache['cross_v'], cross_bias)
    x = self._cross_and_mlp(x, cross, True)
    return x, dict(layer_cache, k=k_cache, v=v_cache), fits


_T5X_DECODE_UNSUPPORTED = (
    'specdec_t5x.network.Transformer does not implement T5X\'s one-token autoregressive cache '
    '(called with decode={decode}, prefill={prefill}). Decode with specdec_t5x.generate, or '
    'with the network\'s encode / init_cache / extend methods (a cache that takes k tokens per '
    'call at per-row positions); specdec_t5x.models.SpeculativeEncoderDecoderModel does this for T5X.')


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
    """[batch, enc_len] int -> [batch, enc_len, emb]; with `encoder_segment_ids` [batch,
    enc_len] (packed examples) tokens attend only within their segment."""
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

  def extend(self, cache, tokens, positions, return_features: bool = False, feature_layers=(),
             tree=None):
    """Append tokens [batch, k] at positions [batch].. -> (logits [b, k, vocab], cache), and
    with `return_features` also what a feature_draft head reads [b, k, F] float32: the final
    normalised output, then the residual stream after each layer in `feature_layers`
    (layers.fused_features). `tree`: parents [b, k], the tokens are a draft tree (trees/)."""
    return self.decoder.extend(cache, tokens, positions, return_features, feature_layers, tree)

  def features(self, encoder_input_tokens, decoder_input_tokens, decoder_target_tokens=None,
               feature_layers=()):
    """Teacher-forced -> (logits [b, len, vocab], features [b, len, F] float32 as
    `extend` returns them, the encoder output [b, enc_len, emb]): a head's training data."""
    encoded = self.encode(encoder_input_tokens)
    logits, features = self.decoder(encoded, encoder_input_tokens, decoder_input_tokens,
                                    decoder_target_tokens, return_features=True,
                                    feature_layers=feature_layers)
    return logits, features, encoded

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
    Returns logits [batch, dec_len, vocab] float32.
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
    mask = pairwise(valid, valid)  # [batch, len, len]
    if segment_ids is not None:
      mask = mask & pairwise(segment_ids, segment_ids, jnp.equal)
    bias = self.relpos_bias(pos, pos) + mask_to_bias(mask[:, None], self.config.dtype)
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
      self.logits_dense = Dense(cfg.vocab_size, jnp.float32, kernel_init(), ('embed', 'vocab'))

  def _logits(self, x, deterministic, return_features: bool = False, taps=()):
    """Decoder output [b, len, emb] -> float32 logits [b, len, vocab] (and, with
    `return_features`, layers.fused_features of the normalised output and the `taps`)."""
    x = self.dropout(self.decoder_norm(x), deterministic=deterministic)
    if self.config.logits_via_embedding:  # T5 v1.0: tied, scaled by 1/sqrt(emb_dim)
      logits = self.shared_embedding.attend(x) / jnp.sqrt(jnp.float32(x.shape[-1]))
    else:
      logits = self.logits_dense(x)
    return (logits, fused_features(x, taps)) if return_features else logits

  def __call__(self, encoded, encoder_tokens, decoder_input_tokens, decoder_target_tokens=None,
               encoder_segment_ids=None, decoder_segment_ids=None, deterministic: bool = True,
               return_features: bool = False, feature_layers=()):
    if encoder_segment_ids is not None and decoder_segment_ids is None:
      raise ValueError('encoder_segment_ids was given without decoder_segment_ids; packed '
                       'examples need both (cross attention stays within a segment).')
    length = decoder_input_tokens.shape[1]
    pos = jnp.arange(length)[None, :]
    mask = pairwise(pos, pos, jnp.greater_equal)  # [1, q, k] causal
    dec_valid = (decoder_target_tokens > 0) if decoder_target_tokens is not None else None
    if dec_valid is not None:
      mask = mask & pairwise(dec_valid, dec_valid)
    if decoder_segment_ids is not None:
      mask = mask & pairwise(decoder_segment_ids, decoder_segment_ids, jnp.equal)
    self_bias = self.relpos_bias(pos, pos) + mask_to_bias(mask[:, None], self.config.dtype)
    cross_mask = (encoder_tokens > 0)[:, None, :]  # [b, 1, enc]
    if dec_valid is not None:
      cross_mask = cross_mask & dec_valid[:, :, None]
    if encoder_segment_ids is not None:
      cross_mask = cross_mask & pairwise(decoder_segment_ids, encoder_segment_ids, jnp.equal)
    cross_bias = mask_to_bias(cross_mask[:, None], self.config.dtype)
    x = self.shared_embedding(decoder_input_tokens.astype(jnp.int32))
    x = self.dropout(x, deterministic=deterministic)
    taps = []
    for i, layer in enumerate(self.layers):
      x = layer(x, encoded, self_bias, cross_bias, deterministic)
      taps += [x] if i in feature_layers else []
    return self._logits(x, deterministic, return_features, taps)

  def init_cache(self, encoded, encoder_tokens, max_length: int):
    cfg = self.config
    return empty_decode_cache(self.layers, encoded, encoder_tokens, max_length,
                              cfg.num_heads, cfg.head_dim, cfg.dtype)

  def extend(self, cache, tokens, positions, return_features=False, feature_layers=(), tree=None):
    self_bias, cross_bias = decode_biases(self.relpos_bias, cache, positions, tokens.shape[1],
                                          self.config.dtype, tree)
    x = self.shared_embedding(tokens.astype(jnp.int32))
    new_layers, taps, fits = [], [], []
    for i, (layer, layer_cache) in enumerate(zip(self.layers, cache['layers'])):
      x, layer_cache, ok = layer.extend(x, layer_cache, positions + 1, self_bias, cross_bias)
      new_layers.append(layer_cache)
      fits.append(ok)
      taps += [x] if i in feature_layers else []
    out = self._logits(x, True, return_features, taps)
    cache = rows.note_writes(cache, new_layers, fits)
    return (out[0], cache, out[1]) if return_features else (out, cache)


# T5 v1.1 sizes (T5X's t5x/examples/t5/t5_1_1/*.gin): emb_dim, num_heads, layers (each stack), mlp_dim.
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
  return T5Config(**{**kwargs, **overrides})
