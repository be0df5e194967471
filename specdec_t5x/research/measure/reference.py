"""A straightforward T5X-style single-token greedy decode loop, as a reference.

Written independently of network.py's cache, straight from the parameter tree, the way
T5X's decode path works: one token per call, one scalar cache index for the whole batch,
cache writes by one-hot addition, and the encoder-decoder keys/values re-projected from
the encoder output at every step. It serves two purposes:

* speed: our `generate(draft=None)` must be at least as fast (research/measure/decode_costs.py);
* correctness: its greedy tokens must equal ours (tests/test_reference.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.network import NEG_INF, T5Config, Transformer, relative_position_bucket


def _rms(x, scale):
  x32 = x.astype(jnp.float32)
  return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * scale


def _heads(x, cfg):
  return x.reshape(x.shape[:-1] + (cfg.num_heads, cfg.head_dim))


def _mlp(p, x, cfg):
  acts = {'gelu': jax.nn.gelu, 'relu': jax.nn.relu, 'linear': lambda z: z}
  if len(cfg.mlp_activations) == 1:
    h = acts[cfg.mlp_activations[0]](x @ p['wi']['kernel'])
  else:
    h = 1.0
    for i, name in enumerate(cfg.mlp_activations):
      h = h * acts[name](x @ p[f'wi_{i}']['kernel'])
  return h @ p['wo']['kernel']


def _attend(p, q_in, k, v, bias, cfg):
  """q_in [b, 1, emb]; k, v [b, len, h, d]; bias [b or 1, h, 1, len]."""
  q = _heads(q_in @ p['query']['kernel'], cfg)
  w = jax.nn.softmax(jnp.einsum('bqhd,bkhd->bhqk', q, k) + bias, axis=-1)
  out = jnp.einsum('bhqk,bkhd->bqhd', w, v)
  return out.reshape(out.shape[:2] + (-1,)) @ p['out']['kernel']


def greedy_decode(config: T5Config, params, encoder_input_tokens, max_len: int, eos_id: int = 1):
  """Greedy tokens [batch, max_len] (zeros after EOS), one target call per token."""
  cfg = config
  encoded = Transformer(cfg).apply({'params': params}, encoder_input_tokens, method='encode')
  dec = params['decoder']
  emb = params['token_embedder']['embedding']
  b = encoder_input_tokens.shape[0]
  cross_bias = jnp.where(encoder_input_tokens > 0, 0.0, NEG_INF)[:, None, None, :]
  pos = jnp.arange(max_len)
  full_bias = jnp.take(dec['relpos_bias']['rel_embedding'],
                       relative_position_bucket(pos[None, :] - pos[:, None], False), axis=1)
  shape = (b, max_len, cfg.num_heads, cfg.head_dim)
  init_cache = [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(cfg.num_decoder_layers)]

  def step(carry):
    i, last, out, done, cache = carry
    x = emb[last][:, None, :]  # [b, 1, emb]
    one_hot = jax.nn.one_hot(i, max_len)[None, :, None, None]
    bias = jax.lax.dynamic_slice_in_dim(full_bias, i, 1, axis=1)[None]  # [1, h, 1, len]
    bias = bias + jnp.where(pos <= i, 0.0, NEG_INF)[None, None, None, :]
    new_cache = []
    for l, (ck, cv) in enumerate(cache):
      p = dec[f'layers_{l}']
      y = _rms(x, p['pre_self_attention_layer_norm']['scale'])
      ck = ck + one_hot * _heads(y @ p['self_attention']['key']['kernel'], cfg)
      cv = cv + one_hot * _heads(y @ p['self_attention']['value']['kernel'], cfg)
      x = x + _attend(p['self_attention'], y, ck, cv, bias, cfg)
      y = _rms(x, p['pre_cross_attention_layer_norm']['scale'])
      pc = p['encoder_decoder_attention']
      ek = _heads(encoded @ pc['key']['kernel'], cfg)  # re-projected every step, as T5X
      ev = _heads(encoded @ pc['value']['kernel'], cfg)
      x = x + _attend(pc, y, ek, ev, cross_bias, cfg)
      x = x + _mlp(p['mlp'], _rms(x, p['pre_mlp_layer_norm']['scale']), cfg)
      new_cache.append((ck, cv))
    x = _rms(x, dec['decoder_norm']['scale'])[:, 0]
    if cfg.logits_via_embedding:
      logits = x @ emb.T / jnp.sqrt(x.shape[-1])
    else:
      logits = x @ dec['logits_dense']['kernel']
    token = jnp.where(done, 0, jnp.argmax(logits, -1).astype(jnp.int32))
    out = out.at[:, i].set(token)
    return i + 1, token, out, done | (token == eos_id), new_cache

  carry = (jnp.int32(0), jnp.zeros((b,), jnp.int32), jnp.zeros((b, max_len), jnp.int32),
           jnp.zeros((b,), bool), init_cache)
  carry = jax.lax.while_loop(lambda c: (c[0] < max_len) & ~jnp.all(c[3]), step, carry)
  return carry[2]
