"""Where a decode loop's time goes, from the paper's ideal to the real loop, as a ladder of
timed programs over the same calls (research/measure/loop_efficiency.py's rows), at the batch
of the encoder rows given.

Per loop iteration (one target call), in seconds:

  alone        gamma t_draft + t_verify, each call timed alone (timing.call_costs: a loop of
               identical calls whose tokens are fixed, so consecutive calls do not depend on
               each other's logits and XLA may overlap one call's tail with the next);
  chained      the same sum with every call's token taken from the argmax of the call before
               it, as in any decode (a call cannot start before the last one has finished);
  interleaved  one synthetic iteration: gamma chained draft calls, then the chained verify
               call over gamma + 1 tokens, in one loop (two models' weights and caches take
               turns, as in speculative decoding);
  loop         the real loop: its decode time less the per-sequence prefill, per target call.

Each step's excess over the one before is a loss of its own: chaining, interleaving two
models, and the loop's own work (the draft's 2-token re-feed, acceptance, sampling,
statistics, the sequence buffer). Autoregressive decoding has alone, chained and loop.

A feature head (feature_draft.py; api.reads_features) runs every rung too: its cache is
built from the target's encoder output, every target call of its rungs returns the target's
features (return_features, the head's feature_layers) as the loop's verify calls do, and
each head call is one token fed a feature: chained, the first call of an iteration reads
the target's features at the last verified position and each later one the head's own
prediction (as the loop's later calls do); alone, the fixed features of the call before.
The loop's first call of each step, the head's (gamma + 1)-token re-feed of the verify
window, is the loop's work here, as a token draft's 2-token re-feed is.
Timed like timing.call_costs (timing.per_call_seconds: n iterations against 0 of one compiled
program per rung, repeats interleaved across all rungs).
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import api, programs, sampling, timing
from specdec_t5x.algorithm.cpu import packing

ModelAndParams = Any
_PROGRAMS: 'collections.OrderedDict[tuple, Any]' = collections.OrderedDict()


def _program(target_module, draft_module, gamma: int, verify_tokens: int, chained: bool,
             cache_len: int, feature_layers: Optional[tuple] = None):
  """A jitted fn(target_vars, draft_vars, enc, n) running n synthetic iterations of
  `gamma` draft calls (none when draft_module is None) then one target call over
  `verify_tokens` tokens (none when 0); returns a float that depends on every call.
  `feature_layers` (not None: the rung of a feature head): the target's calls return its
  features, as a head's loop has them do."""
  key = programs.program_key(target_module, draft_module, gamma, verify_tokens, chained,
                             cache_len, feature_layers)
  return programs.memoized_program(_PROGRAMS, key, lambda: jax.jit(_synthetic_loop(
      target_module, draft_module, gamma, verify_tokens, chained, cache_len, feature_layers)))


def _synthetic_loop(target_module, draft_module, gamma: int, verify_tokens: int,
                    chained: bool, cache_len: int, feature_layers: Optional[tuple] = None):
  """_program's function, before jit."""
  stride = max(gamma, 1)
  head = draft_module is not None and api.reads_features(draft_module)
  verify_extra = () if feature_layers is None else (True, feature_layers)

  def run(target_vars, draft_vars, enc, n):
    b = enc.shape[0]
    encoded = target_module.apply(target_vars, enc, method='encode')
    t_cache = target_module.apply(target_vars, encoded, enc, cache_len, method='init_cache')
    d_cache = None
    if draft_module is not None:  # a head cross-attends to the target's encoder output
      d_enc = encoded if head else draft_module.apply(draft_vars, enc, method='encode')
      d_cache = draft_module.apply(draft_vars, d_enc, enc, cache_len, method='init_cache')
    width = draft_module.config.feature_dim if head else 1  # [b, 1, F]: fed to a head

    def body(i, carry):
      t_cache, d_cache, token, feats, acc = carry
      fed = feats
      for j in range(gamma if draft_module is not None else 0):
        out = draft_module.apply(
            draft_vars, d_cache, token, jnp.full((b,), i * stride + j, jnp.int32),
            *((fed,) if head else ()), method='extend')
        logits, d_cache = out[:2]
        acc = acc + jnp.sum(logits[:, -1, 0])  # every row's: none is dead code
        if chained:
          token = sampling.argmax(logits[:, -1])[:, None]
          fed = out[2] if head else fed  # later calls: the head's own predicted feature
      if head:  # the predictions count (none is dead code); chained, they feed the next
        acc = acc + jnp.sum(out[2][:, -1, 0]).astype(jnp.float32)
        feats = fed.astype(jnp.float32) if chained else feats
      if verify_tokens:
        out = target_module.apply(
            target_vars, t_cache, jnp.tile(token, (1, verify_tokens)),
            jnp.full((b,), i * stride, jnp.int32), *verify_extra, method='extend')
        logits, t_cache = out[:2]
        acc = acc + jnp.sum(logits[:, -1, 0])  # every row's: none is dead code
        if feature_layers is not None:
          last = out[2][:, -1:].astype(jnp.float32)  # the target's features, as verified
          acc = acc + jnp.sum(last[:, 0, 0])
          if chained and head:
            feats = last[..., :width]
        if chained:
          token = sampling.argmax(logits[:, -1])[:, None]
      return t_cache, d_cache, token, feats, acc

    init = (t_cache, d_cache, jnp.full((b, 1), 3, jnp.int32),
            jnp.zeros((b, 1, width), jnp.float32), jnp.float32(0.0))
    return jax.lax.fori_loop(0, n, body, init)[4]
  return run


def rungs(target: ModelAndParams, draft: Optional[ModelAndParams], enc, gamma: int,
          num_calls: int = 16, repeats: int = 5, cache_len: int = 0) -> Dict[str, float]:
  """Seconds per iteration of the synthetic rungs for one (draft, gamma), enc [b, L]:
  {'alone', 'chained', 'interleaved'} (speculative), or {'alone', 'chained'} with draft
  None (autoregressive: one target call per iteration). `cache_len` as the decode's
  (max_len + gamma + 1); grown to hold num_calls iterations when smaller."""
  enc = jnp.asarray(enc, jnp.int32)
  verify = gamma + 1 if draft is not None else 1
  cache_len = max(cache_len, num_calls * max(gamma, 1) + verify + 2)
  t_vars = packing.decode_variables(*target)
  d_vars = None if draft is None else packing.decode_variables(*draft)
  progs = {}
  # A head's rungs: the target's calls return its features (none without a head).
  layers = draft[0].config.feature_layers if draft is not None and api.reads_features(
      draft[0]) else None
  for chained in (False, True):
    name = 'chained' if chained else 'alone'
    progs[f'{name}_verify'] = (_program(target[0], None, 0, verify, chained, cache_len,
                                        layers), None)
    if draft is not None:
      progs[f'{name}_draft'] = (_program(target[0], draft[0], 1, 0, chained, cache_len,
                                         layers), d_vars)
  if draft is not None:
    progs['interleaved'] = (_program(target[0], draft[0], gamma, verify, True, cache_len,
                                     layers), d_vars)
  runs = {name: functools.partial(fn, t_vars, dv, enc) for name, (fn, dv) in progs.items()}
  per = {name: max(seconds, 0.0)
         for name, seconds in timing.per_call_seconds(runs, num_calls, repeats).items()}
  out = {}
  for name in ('alone', 'chained'):
    out[name] = per[f'{name}_verify'] + (gamma * per[f'{name}_draft'] if draft is not None else 0)
  if draft is not None:
    out['interleaved'] = per['interleaved']
  return out


def loop_seconds(decode_seconds: float, prefill_seconds: float, target_calls: float) -> float:
  """The real loop's seconds per iteration: a decode's time less its prefill, per call."""
  return (decode_seconds - prefill_seconds) / max(target_calls, 1.0)
