"""A draft head that reads the target: feature-level drafting for T5 (after EAGLE).

Feature-level drafting (EAGLE-1/2/3, Li et al. 2024-2025) drafts with a small head fed the
target's own top-layer features rather than with a separate model that sees only tokens.
For an encoder-decoder target the head also cross-attends to the target's encoder output,
so it has no encoder of its own and nothing to prefill.

At decoder position t the head's input is its embedding of the token at t (the token the
target emitted from position t - 1) plus a projection of the target's feature at t - 1
(`Transformer.extend(..., return_features=True)`: the decoder's final normalised hidden
state, zeros before position 0; with `feature_layers` also the residual stream after
those decoder layers, concatenated: EAGLE-3's fusion of low, middle and high layers). Its
decoder layers (cached self-attention over earlier head positions, cross-attention to the
target's encoder output, gated MLP) end in two
outputs: logits over the vocabulary or a reduced draft vocabulary (its own `logits_dense`,
float32) and a predicted target feature (`feature_out`). Past the last verified token the
head feeds its predicted feature back (EAGLE-1's feature feedback); training runs several
such self-fed passes with the attention pattern of decoding (`__call__`'s `passes`,
EAGLE-3's training-time test).

The loops (decode/) call `extend(cache, tokens, positions, features, pick)`: the first
call of each step re-feeds a row's whole last verify window with the target's real
features (the accepted ones are the row's new context; the others are rewritten before
they are read) and returns only position `pick` (the row's next token); later calls feed
one drafted token and the head's own predicted feature.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, List, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import draft_vocab, rows
from specdec_t5x.algorithm.layers import (Attention, Dense, Embed, MlpBlock,
                                          RelativePositionBias, RMSNorm, decode_biases,
                                          empty_decode_cache, kernel_init, mask_to_bias)



@dataclasses.dataclass(frozen=True)
class FeatureDraftConfig:
  """The head's sizes; `vocab_size` and `target_emb_dim` are the target's."""
  vocab_size: int
  target_emb_dim: int
  emb_dim: int = 128
  num_heads: int = 2
  head_dim: int = 64
  mlp_dim: int = 512
  num_layers: int = 1
  mlp_activations: Sequence[str] = ('gelu', 'linear')
  dtype: Any = jnp.float32
  # A reduced draft vocabulary (EAGLE-3): the ids the head's logits cover, in increasing
  # order (e.g. the commonest target tokens of the training data); every other id gets
  # probability 0 (never drafted). Empty: the whole vocabulary.
  draft_vocab: Tuple[int, ...] = ()
  # Target decoder layers (0-based, increasing) whose outputs the head reads besides the
  # final normalised features (layers.fused_features). Empty: the final features only.
  feature_layers: Tuple[int, ...] = ()

  def __post_init__(self):
    for name in ('vocab_size', 'target_emb_dim', 'emb_dim', 'num_heads', 'head_dim',
                 'mlp_dim', 'num_layers'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'FeatureDraftConfig.{name} must be an integer >= 1, got {value!r}.')
    ids = self.draft_vocab
    if not isinstance(ids, tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids) or (ids and (
            ids[0] < 0 or ids[-1] >= self.vocab_size or any(a >= b for a, b in zip(ids, ids[1:])))):
      raise ValueError('FeatureDraftConfig.draft_vocab must be a tuple of increasing token ids '
                       f'in [0, vocab_size={self.vocab_size}) (empty: the whole vocabulary), '
                       f'got {str(ids)[:80]}.')
    layers = self.feature_layers
    if not isinstance(layers, tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers) or any(
            a >= b for a, b in zip(layers, layers[1:])):
      raise ValueError('FeatureDraftConfig.feature_layers must be a tuple of increasing '
                       f'decoder layer indices >= 0, got {layers!r}.')

  @property
  def output_vocab_size(self) -> int:
    """How many logits the head computes (len(draft_vocab), or the whole vocabulary)."""
    return len(self.draft_vocab) or self.vocab_size

  @property
  def feature_dim(self) -> int:
    """The width of the target features the head reads (and predicts)."""
    return self.target_emb_dim * (1 + len(self.feature_layers))


class HeadLayer(nn.Module):
  """Self-attention (cached or over several passes' keys), cross-attention, MLP."""
  config: FeatureDraftConfig

  def setup(self):
    cfg = self.config
    attention = lambda: Attention(cfg.num_heads, cfg.head_dim, cfg.emb_dim, cfg.dtype)
    self.pre_self_attention_layer_norm = RMSNorm(cfg.dtype)
    self.self_attention = attention()
    self.pre_cross_attention_layer_norm = RMSNorm(cfg.dtype)
    self.encoder_decoder_attention = attention()
    self.pre_mlp_layer_norm = RMSNorm(cfg.dtype)
    self.mlp = MlpBlock(cfg.mlp_dim, tuple(cfg.mlp_activations), cfg.dtype)

  def qkv(self, x):
    """x [b, k, emb] -> q, k, v [b, k, heads, head_dim]."""
    y = self.pre_self_attention_layer_norm(x)
    return (self.self_attention.project_q(y),) + self.self_attention.project_kv(y)

  def cross_kv(self, encoded):
    """The target's encoder output [b, enc, E] -> cache layouts [b, h, d, enc], [b, h, enc, d]."""
    k, v = self.encoder_decoder_attention.project_kv(encoded)
    return k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)

  def finish(self, x, attended, cross_k, cross_v, cross_bias):
    """Residual of the self-attention output, then cross-attention and MLP blocks."""
    x = x + attended
    att = self.encoder_decoder_attention
    y = self.pre_cross_attention_layer_norm(x)
    x = x + att.attend_cached(att.project_q(y), cross_k, cross_v, cross_bias)
    return x + self.mlp(self.pre_mlp_layer_norm(x))


class FeatureDraft(nn.Module):
  """The head. `__call__` is the teacher-forced training pass; `init_cache` / `extend` decode.
  F = config.feature_dim, the width of the target features it reads."""
  config: FeatureDraftConfig
  reads_target_features: ClassVar[bool] = True  # the loops feed it the target's features

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, dtype=cfg.dtype)
    self.feature_in = Dense(cfg.emb_dim, cfg.dtype, kernel_init(), ('embed', 'mlp'))
    self.relpos_bias = RelativePositionBias(cfg.num_heads, False, cfg.dtype)
    self.layers = [HeadLayer(cfg) for _ in range(cfg.num_layers)]
    self.final_norm = RMSNorm(cfg.dtype)
    self.logits_dense = Dense(cfg.output_vocab_size, jnp.float32, kernel_init(), ('embed', 'vocab'))
    self.feature_out = Dense(cfg.feature_dim, jnp.float32, kernel_init(), ('mlp', 'embed'))

  def _inputs(self, tokens, features):
    """tokens [b, k], the target's features at the previous positions [b, k, F] -> [b, k, emb]."""
    x = self.token_embedder(tokens.astype(jnp.int32))
    return x + self.feature_in(features.astype(self.config.dtype)).astype(x.dtype)

  def _outputs(self, x):
    """[b, k, emb] -> (logits [b, k, output_vocab_size] float32, predicted features
    [b, k, F] float32)."""
    h = self.final_norm(x)
    return self.logits_dense(h), self.feature_out(h)

  def __call__(self, encoded, encoder_tokens, decoder_input_tokens, features,
               decoder_target_tokens=None, passes: int = 1):
    """Teacher-forced passes -> [(logits [b, L, output_vocab_size], predicted features
    [b, L, F])] per pass.

    encoded [b, enc, E]: the target's encoder output; features [b, L, F]: the target's
    features at t - 1 for each position t (zeros at 0). Pass 1 reads them; pass j > 1
    reads pass j - 1's predictions at t - 1, and its query at t attends as the j-th draft
    call does at decode time: pass 1's keys up to t - j + 1, then pass i's key at
    t - (j - i) for i = 2..j (the positions drafted before it in the same step).
    """
    b, length = decoder_input_tokens.shape
    pos = jnp.arange(length)
    valid = (jnp.ones((b, length), bool) if decoder_target_tokens is None
             else decoder_target_tokens > 0)
    both = valid[:, :, None] & valid[:, None, :]  # [b, q, k]
    relpos = self.relpos_bias(pos[None], pos[None])  # [1, h, q, k]
    dtype = self.config.dtype
    cross_bias = mask_to_bias((encoder_tokens > 0)[:, None, None, :], dtype)
    cross = [layer.cross_kv(encoded) for layer in self.layers]
    keys: List[List[Tuple[Any, Any]]] = [[] for _ in self.layers]
    outputs, fed = [], features
    for j in range(1, passes + 1):
      blocks = [pos[None, :] <= pos[:, None] - (j - 1)]  # pass 1's keys: s <= t - j + 1
      blocks += [pos[None, :] == pos[:, None] - (j - i) for i in range(2, j + 1)]
      bias = jnp.concatenate([mask_to_bias((m[None] & both)[:, None], dtype) + relpos
                              for m in blocks], axis=-1)  # [b, h, q, j * L]
      x = self._inputs(decoder_input_tokens, fed)
      for layer, (ck, cv), layer_keys in zip(self.layers, cross, keys):
        q, k, v = layer.qkv(x)
        layer_keys.append((k, v))
        k_all = jnp.concatenate([kv[0] for kv in layer_keys], axis=1)
        v_all = jnp.concatenate([kv[1] for kv in layer_keys], axis=1)
        x = layer.finish(x, layer.self_attention.attend(q, k_all, v_all, bias), ck, cv,
                         cross_bias)
      logits, predicted = self._outputs(x)
      outputs.append((logits, predicted))
      fed = jnp.pad(predicted[:, :-1], ((0, 0), (1, 0), (0, 0)))  # t reads t - 1's prediction
    return outputs

  def init_cache(self, encoded, encoder_tokens, max_length: int):
    """Cache for positions 0..max_length-1 (slot 0: position -1), from the target's
    encoder output `encoded` [b, enc, E]."""
    cfg = self.config
    return empty_decode_cache(self.layers, encoded, encoder_tokens, max_length,
                              cfg.num_heads, cfg.head_dim, cfg.dtype)

  def extend(self, cache, tokens, positions, features, pick: Optional[jax.Array] = None,
             tree=None):
    """tokens [b, k] at positions [b].., the target's (or the head's predicted) features
    at the positions before them [b, k, F] -> (logits, cache, predicted features): at every
    position ([b, k, V'], [b, k, F]) or, with `pick` [b], at row r's position pick[r] only
    ([b, 1, V'], [b, 1, F]). V' = config.output_vocab_size: with a reduced draft
    vocabulary the logits are over its ids (`vocabulary()` maps them; the loop drafts
    over them and gives every other id probability 0). With `tree` (parents [b, k],
    trees/structure.py) the tokens are a draft tree's nodes, each at its depth's position
    seeing the prefix and its ancestors, and each node's features are its parent's (the
    head's dynamic tree: decode/dynamic_tree.py)."""
    self_bias, cross_bias = decode_biases(self.relpos_bias, cache, positions, tokens.shape[1],
                                          self.config.dtype, tree)
    x = self._inputs(tokens, features)
    new_layers, fits = [], []
    for layer, layer_cache in zip(self.layers, cache['layers']):
      q, k_new, v_new = layer.qkv(x)
      (k_cache, v_cache), ok = rows.update_all(
          (layer_cache['k'], layer_cache['v']),
          (rows.store(k_new.transpose(0, 2, 3, 1), layer_cache['k']),
           rows.store(v_new.transpose(0, 2, 1, 3), layer_cache['v'])), positions + 1,
          axes=(3, 2))
      attended = layer.self_attention.attend_cached(q, k_cache, v_cache, self_bias)
      x = layer.finish(x, attended, layer_cache['cross_k'], layer_cache['cross_v'], cross_bias)
      new_layers.append(dict(layer_cache, k=k_cache, v=v_cache))
      fits.append(ok)
    if pick is not None:
      x = rows.window(x, pick, 1)
    logits, predicted = self._outputs(x)
    return logits, rows.note_writes(cache, new_layers, fits), predicted


def check_fits(config: FeatureDraftConfig, target_config: Any) -> None:
  """Raises unless the head reads features of the target whose T5Config is given."""
  if config.vocab_size != target_config.vocab_size or (
      config.target_emb_dim != target_config.emb_dim):
    raise ValueError(f'The feature draft reads a target of vocab_size {config.vocab_size} and '
                     f'emb_dim {config.target_emb_dim} (target_emb_dim), but this target has '
                     f'{target_config.vocab_size} and {target_config.emb_dim}: it was trained '
                     'for another target.')
  if config.feature_layers and config.feature_layers[-1] >= target_config.num_decoder_layers:
    raise ValueError(f'The feature draft reads decoder layers {config.feature_layers} '
                     f'(feature_layers), but the target has '
                     f'{target_config.num_decoder_layers} decoder layers.')


def vocabulary(config: FeatureDraftConfig) -> Optional[draft_vocab.DraftVocabulary]:
  """The ids of the head's logits columns for the decoding loop (None: the whole vocabulary)."""
  if not config.draft_vocab:
    return None
  return draft_vocab.draft_vocabulary(config.draft_vocab, config.vocab_size)


def init_variables(config: FeatureDraftConfig, rng: jax.Array) -> Any:
  """The head's random variables: 'params' and their logical axes, 'params_axes'."""
  b, length, enc = 1, 4, 3
  return jax.jit(FeatureDraft(config).init)(
      rng, jnp.zeros((b, enc, config.target_emb_dim)), jnp.ones((b, enc), jnp.int32),
      jnp.ones((b, length), jnp.int32), jnp.zeros((b, length, config.feature_dim)))


def init_params(config: FeatureDraftConfig, rng: jax.Array, target_params: Any = None) -> Any:
  """Random head params; with the target's (tied-embedding T5) params, the embedding and
  the output layer start from the target's, seen through the head's projections: the
  embedding is the target's projected by `feature_in` (so token and feature inputs share a
  space), and `logits_dense` is `feature_out` followed by the target's tied output layer."""
  params = init_variables(config, rng)['params']
  embedding = None if target_params is None else target_params.get('token_embedder', {}).get(
      'embedding')
  if embedding is None:
    return params
  embedding = jnp.asarray(embedding, jnp.float32)  # [V, E]
  if embedding.shape != (config.vocab_size, config.target_emb_dim):
    raise ValueError(f'The target embedding is {embedding.shape}; the head expects '
                     f'[{config.vocab_size}, {config.target_emb_dim}].')
  params = jax.tree_util.tree_map(lambda x: x, params)  # a mutable copy
  e = config.target_emb_dim  # the final features come first in the fused ones
  w_in = params['feature_in']['kernel'][:e]  # [E, emb]
  params['token_embedder']['embedding'] = embedding @ w_in
  w_out = params['feature_out']['kernel'][:, :e]  # [emb, E]
  if config.draft_vocab:
    embedding = embedding[jnp.asarray(config.draft_vocab)]
  params['logits_dense']['kernel'] = (w_out @ embedding.T) / jnp.sqrt(
      jnp.float32(config.target_emb_dim))
  return params
