"""Stock T5X greedy decoding on our parameters: the baseline the paper measured against.

T5X's own `EncoderDecoderModel.predict_batch` with its own network
(`t5x.examples.t5.network.Transformer`) and its `decoding.temperature_sample` at
temperature 0, applied to the same parameter tree as ours (network.py keeps T5X's names
and shapes). Used for speed (research/measure/decode_costs.py, scripts/device_report.py)
and for token equality with our AR decoding (tests/test_t5x_reference.py).

T5X is not on PyPI; `available()` says whether it is importable, and the other functions
raise ImportError with what to do when it is not.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import network


def available() -> bool:
  """Whether T5X (google-research/t5x) is importable here."""
  return importlib.util.find_spec('t5x') is not None


def _require_t5x():
  if not available():
    raise ImportError('T5X is not installed; install google-research/t5x (see docs/t5x.md) '
                      'to compare with stock T5X decoding.')


def t5x_config(config: network.T5Config) -> Any:
  """T5X's `t5x.examples.t5.network.T5Config` with the values of our `config`.

  Raises ValueError when our config sets a field T5X's network lacks to a non-default
  value (the two networks would then compute different functions).
  """
  _require_t5x()
  from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top
  theirs = {f.name for f in dataclasses.fields(t5x_network.T5Config)}
  kwargs, extra = {}, []
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    if f.name in theirs:
      kwargs[f.name] = value
    elif f.default is dataclasses.MISSING or value != f.default:
      extra.append(f'{f.name}={value!r}')
  if extra:
    raise ValueError(f'T5X\'s T5Config has no field for {", ".join(extra)}; stock T5X cannot '
                     'run this network. Compare with T5X only at default values of those.')
  return t5x_network.T5Config(**kwargs)


def greedy_decoder(config: network.T5Config, max_decode_length: int,
                   eos_id: int = 1) -> Callable[[Any, jax.Array], jax.Array]:
  """A jitted fn(params, encoder_input_tokens [batch, enc_len]) -> tokens [batch, max_decode_length].

  Stock T5X end to end: `t5x.models.EncoderDecoderModel(...).predict_batch` with
  `decode_fn = t5x.decoding.temperature_sample` at temperature 0, T5X's network built
  from `config` (t5x_config). `params` is our (= T5X's) parameter tree. Output as ours:
  no BOS, zeros after the first EOS. `eos_id=-1` never stops early (for timing).
  """
  _require_t5x()
  import seqio  # pylint: disable=g-import-not-at-top
  from t5x import decoding  # pylint: disable=g-import-not-at-top
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top
  if int(max_decode_length) != max_decode_length or max_decode_length < 1:
    raise ValueError(f'max_decode_length must be an integer >= 1, got {max_decode_length}.')
  # predict_batch reads EOS from the output vocabulary; ids pass through unchanged.
  vocab = seqio.PassThroughVocabulary(config.vocab_size, eos_id=eos_id)
  model = t5x_models.EncoderDecoderModel(
      module=t5x_network.Transformer(t5x_config(config)), input_vocabulary=vocab,
      output_vocabulary=vocab, optimizer_def=None,
      decode_fn=functools.partial(decoding.temperature_sample, temperature=0.0))

  def decode(params, encoder_input_tokens):
    batch = {'encoder_input_tokens': encoder_input_tokens,
             'decoder_input_tokens': jnp.zeros(
                 (encoder_input_tokens.shape[0], int(max_decode_length)), jnp.int32)}
    return model.predict_batch(params, batch)
  return jax.jit(decode)
