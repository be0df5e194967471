"""T5X's `predict_batch_with_aux` conventions, for the speculative model (models.py).

What t5x/models.py and t5x/decoding.temperature_sample do around the decoding itself:
`num_decodes` k decodes each input k times as rows [in0, in0, in1, in1, ...]
(T5X's flat_batch_beam_expand; every row has its own random stream, so samples differ);
the k decodes of an input are sorted by increasing score (the sequence's log-probability
under the sampling distribution, T5X's default `rescale_log_probs`: 0 when greedy) and,
without `return_all_decodes`, the last (best) one is returned; `prompt_with_targets`
takes the decoder prompt from `decoder_input_tokens` with its EOS removed.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import sampling as sampling_lib


def decode_rng(rng: Optional[jax.Array],
               decoder_params: Optional[Mapping[str, Any]]) -> Optional[jax.Array]:
  """The decode's key: `rng` or `decoder_params['decode_rng']`; both given raises, as in
  T5X. The speculative model takes no other decoder_params (its settings are the
  DecodeConfig), so any other key raises too rather than being ignored."""
  params = dict(decoder_params or {})
  given = params.pop('decode_rng', None)
  if params:
    raise ValueError(f'decoder_params {sorted(params)} are not used by the speculative '
                     "model: it takes only 'decode_rng'; set the decode settings in its "
                     'DecodeConfig (gin: config.DecodeConfig.NAME).')
  if rng is not None and given is not None:
    raise ValueError("Got RNG both from the `rng` argument and decoder_params['decode_rng']; "
                     'specify one or the other (as T5X does).')
  return given if given is not None else rng


def expand(x: jax.Array, num_decodes: int) -> jax.Array:
  """[batch, ...] -> [batch * num_decodes, ...], each row repeated in place (T5X's order)."""
  if int(num_decodes) != num_decodes or num_decodes < 1:
    raise ValueError(f'num_decodes must be an integer >= 1, got {num_decodes!r}.')
  return x if num_decodes == 1 else jnp.repeat(x, int(num_decodes), axis=0)


def decoder_prompt(decoder_input_tokens: Any, eos_id: int, max_len: int) -> jax.Array:
  """T5X's `prompt_with_targets`: decoder_input_tokens [batch, max_len] (BOS 0 first) ->
  the prompt [batch, max_len - 1] that the decode continues, EOS replaced by padding.

  As in T5X, a row's prompt is its leading non-zero tokens (BOS, prompt, then padding)."""
  tokens = jnp.asarray(decoder_input_tokens, jnp.int32)
  if tokens.ndim != 2 or tokens.shape[1] != max_len:
    raise ValueError(f'prompt_with_targets needs decoder_input_tokens [batch, {max_len}], got '
                     f'shape {tuple(tokens.shape)}.')
  tokens = tokens[:, 1:]
  return jnp.where(tokens == eos_id, 0, tokens)


def log_probs(module: Any, params: Any, enc: jax.Array, tokens: jax.Array,
              generated: jax.Array, prompt: Optional[jax.Array],
              sampling: sampling_lib.SamplingConfig) -> jax.Array:
  """T5X's score of each decode [rows]: the sum, over the tokens the decode generated (not
  the prompt), of log p under the target's sampling distribution (temperature, top-k,
  top-p), from one teacher-forced pass of the target. 0 when greedy, as in T5X."""
  if sampling.greedy:
    return jnp.zeros(tokens.shape[:1], jnp.float32)
  start = jnp.zeros_like(generated) if prompt is None else jnp.sum(prompt != 0, axis=1)
  return _log_probs(module, params, enc, tokens, start, start + generated, sampling)


@functools.partial(jax.jit, static_argnames=('module', 'sampling'))
def _log_probs(module, params, enc, tokens, start, end, sampling):
  """tokens [rows, len] -> [rows]: sum of log p(tokens[t]) over start <= t < end."""
  decoder_input = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))  # BOS 0, shifted right
  # All-ones targets: a sampled 0 inside a decode is a token here, not padding.
  logits = module.apply({'params': params}, enc, decoder_input, jnp.ones_like(tokens))
  logp = jnp.log(sampling_lib.standardize(logits, sampling))  # [rows, len, V]
  token_logp = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
  position = jnp.arange(tokens.shape[1])[None, :]
  counted = (position >= start[:, None]) & (position < end[:, None])
  return jnp.sum(jnp.where(counted, token_logp, 0.0), axis=1)


def t5x_order(tokens: jax.Array, aux: Mapping[str, jax.Array], num_decodes: int,
              return_all_decodes: bool) -> Tuple[jax.Array, Dict[str, jax.Array]]:
  """Rows [batch * k, len] and aux {name: [batch * k]} (with 'scores') -> T5X's outputs:
  [batch, k, len] and {name: [batch, k]} sorted by increasing score (stable, as T5X's
  argsort), or the last (best) decode of each input, [batch, len] and {name: [batch]}."""
  rows, length = tokens.shape
  batch = rows // num_decodes
  decodes = tokens.reshape(batch, num_decodes, length)
  aux = {k: jnp.reshape(v, (batch, num_decodes)) for k, v in aux.items()}
  order = jnp.argsort(aux['scores'], axis=1)  # [batch, k]
  decodes = jnp.take_along_axis(decodes, order[..., None], axis=1)
  aux = {k: jnp.take_along_axis(v, order, axis=1) for k, v in aux.items()}
  if return_all_decodes:
    return decodes, aux
  return decodes[:, -1], {k: v[:, -1] for k, v in aux.items()}
