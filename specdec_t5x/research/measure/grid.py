"""The one AR x drafts x gammas timing grid and the one call-cost measurement behind every
result that sets speculative decodes against autoregressive ones (speed.sweep,
loop_efficiency, speedup_ceiling, device_report).

`time_grid` builds a row decoder (`Decoder`) for AR and for every (draft, gamma) at one
temperature and times them all interleaved with harness.interleaved, the only timer;
`costs` times a target step, each draft's step and every verify call (timing.call_costs,
chained calls, interleaved rounds) and the prefill of the first batch; `call_seconds` the
calls of k positions of several models (cpu_cost_curve, device_report);
`prefill_per_sequence` the mean prefill over many rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import batching, theory, timing
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import batched
from specdec_t5x.research.results import harness

ModelAndParams = Tuple[Any, Any]


@dataclasses.dataclass
class Decoder:
  """A decode over a list of encoder rows, `batch` rows at a time (1: one at a time), each
  batch at its length bucket (batching.trim_batch), remembering the last run's stats
  (summed over the batches), its tokens per row, and `iterations`: the target calls of the
  loops (a batch's loop runs until its last row is done: its rows' most calls)."""
  target: ModelAndParams
  draft: Optional[ModelAndParams]
  enc: np.ndarray  # [N, L]
  max_len: int
  config: DecodeConfig = DecodeConfig(gamma=1)
  seed: int = 0
  eos_id: int = 1
  stats: Optional[stats_lib.DecodeStats] = None
  tokens: Optional[List[np.ndarray]] = None
  batch: int = 1
  iterations: Optional[int] = None

  def __post_init__(self):
    if len(self.enc) % self.batch:
      raise ValueError(f'{len(self.enc)} encoder rows do not split into batches of '
                       f'{self.batch}; pass a multiple of the batch.')
    # Each batch at its length bucket, cut once rather than inside the timed loop.
    self._batches = batched.split(self.enc, self.batch, fill=None)

  def __call__(self):
    outs = [out for _, out in batched.decode(
        self.target, self._batches, self.max_len, draft=self.draft, config=self.config,
        seed=self.seed, eos_id=self.eos_id, key_by='index')]
    timing.block(outs)
    self.stats = jax.tree_util.tree_map(lambda *xs: np.sum([np.asarray(x) for x in xs], axis=0),
                                        *[o.stats for o in outs])
    self.tokens = [row for o in outs for row in batched.outputs(o, self.batch)]
    self.iterations = sum(int(np.max(o.stats['target_calls'])) for o in outs)
    return outs

  @property
  def generated_tokens(self) -> float:
    return float(self.stats['generated_tokens'].sum())

  @property
  def tokens_per_target_call(self) -> float:
    return self.generated_tokens / float(self.stats['target_calls'].sum())


def key(draft: str, gamma: int) -> str:
  """The grid's name of a speculative decode (AR is 'ar')."""
  return f'{draft}_g{gamma}'


@dataclasses.dataclass
class Grid:
  """AR and every (draft, gamma) decode of one temperature, timed interleaved: `timings`
  holds harness.interleaved's per-repeat seconds under 'ar' and key(draft, gamma)."""
  ar: Decoder
  decoders: Dict[Tuple[str, int], Decoder]
  timings: harness.Timings

  @property
  def median(self) -> Dict[str, float]:
    return self.timings.median

  def speedup(self, draft: str, gamma: int) -> float:
    """Median AR seconds per generated token / the decode's (sampled outputs differ in
    length; greedy, the time ratio)."""
    dec, med = self.decoders[(draft, gamma)], self.median
    return (med['ar'] / self.ar.generated_tokens) / (med[key(draft, gamma)] / dec.generated_tokens)

  def rows(self) -> List[Dict[str, Any]]:
    """Per (draft, gamma): median seconds, tokens per target call, the speedup per
    generated token and its 95% interval (timing.paired_speedup over the repeats' pairs)."""
    out = []
    for (draft, gamma), dec in self.decoders.items():
      scale = dec.generated_tokens / self.ar.generated_tokens
      paired = timing.paired_speedup(self.timings.seconds['ar'],
                                     [s / scale for s in self.timings.seconds[key(draft, gamma)]])
      out.append({'draft': draft, 'gamma': gamma, 'seconds': self.median[key(draft, gamma)],
                  'tokens_per_target_call': dec.tokens_per_target_call,
                  'speedup': self.speedup(draft, gamma), 'speedup_ci95': paired['pooled_ci95']})
    return out


def time_grid(target: ModelAndParams, drafts: Dict[str, ModelAndParams], enc: np.ndarray,
              max_len: int, gammas: Sequence[int], config: DecodeConfig = DecodeConfig(),
              repeats: int = 3, batch: int = 1, seed: int = 0, eos_id: int = 1) -> Grid:
  """Times AR (`config` at gamma 1, no draft) and every draft at every gamma (`config` at
  that gamma) over the rows of `enc`, `batch` at a time, interleaved in one loop (drafts
  outer, gammas inner), after one compiling run each."""
  ar = Decoder(target, None, enc, max_len, config.replace(gamma=1), seed, eos_id, batch=batch)
  decs = {(name, g): Decoder(target, d, enc, max_len, config.replace(gamma=g), seed, eos_id,
                             batch=batch)
          for name, d in drafts.items() for g in gammas}
  fns = {'ar': ar, **{key(name, g): dec for (name, g), dec in decs.items()}}
  return Grid(ar, decs, harness.interleaved(fns, repeats))


def costs(target: ModelAndParams, drafts_: Dict[str, ModelAndParams], enc: np.ndarray,
          gammas: Sequence[int], num_calls: int = 32, repeats: int = 7,
          max_len: int = 0, batch: int = 1,
          extra: Optional[Dict[str, Tuple[Any, Any, int]]] = None) -> Dict[str, float]:
  """Seconds per call (timing.call_costs): t_target_step, t_draft_step_{name},
  t_verify_{g+1}; and per sequence (timing.prefill_cost): t_prefill_target,
  t_prefill_draft_{name}; each call over the first `batch` rows of `enc` (a batch's call,
  prefill per batch).

  With `max_len`, caches have the decode's own size (max_len + max gamma + 1). The call
  costs' repeats are interleaved. `extra` (name -> (module, params, tokens per call)):
  more calls timed alike in a second interleaved round after the prefills (a draft's
  2-token catch-up, a head's first call), under their own names.
  """
  enc = jnp.asarray(batching.trim_batch(enc[:batch]))
  cache_len = max_len + max(gammas) + 1 if max_len else 0
  specs = {'t_target_step': (*target, 1)}
  specs.update({f't_draft_step_{name}': (*draft, 1) for name, draft in drafts_.items()})
  specs.update({f't_verify_{g + 1}': (*target, g + 1) for g in gammas})
  out = timing.call_costs(specs, enc, num_calls, repeats, cache_len)
  out['t_prefill_target'] = timing.prefill_cost(*target, enc, max(cache_len, 2), repeats)
  for name, draft in drafts_.items():
    out[f't_prefill_draft_{name}'] = timing.prefill_cost(*draft, enc, max(cache_len, 2),
                                                         repeats)
  if extra:
    out.update(timing.call_costs(extra, enc, num_calls, repeats, cache_len))
  return out


def call_seconds(models: Dict[str, Tuple[Any, Any, Sequence[int]]], enc, num_calls: int,
                 repeats: int, cache_len: int, prefill: bool = True) -> Dict[str, Dict[str, Any]]:
  """Per name of (module, params, ks): 'call_s' {k: seconds of one cached call over k
  positions} (timing.call_costs, every model's calls interleaved in the same rounds) and,
  with `prefill`, 'prefill_s' (timing.prefill_cost at `cache_len`)."""
  specs = {f'{name}/{k}': (module, params, k) for name, (module, params, ks) in models.items()
           for k in ks}
  calls = timing.call_costs(specs, enc, num_calls, repeats, cache_len)
  out = {}
  for name, (module, params, ks) in models.items():
    out[name] = {'call_s': {k: calls[f'{name}/{k}'] for k in ks}}
    if prefill:
      out[name]['prefill_s'] = timing.prefill_cost(module, params, enc, cache_len, repeats)
  return out


def prefill_per_sequence(model: ModelAndParams, rows: Sequence[np.ndarray], cache_len: int,
                         repeats: int = 5) -> float:
  """Mean prefill seconds (timing.prefill_cost) over `rows` (each a batch at its length
  bucket), timed once per distinct shape."""
  by_shape: Dict[Tuple[int, ...], float] = {}
  for r in rows:
    if r.shape not in by_shape:
      by_shape[r.shape] = timing.prefill_cost(*model, r, cache_len, repeats)
  return float(np.mean([by_shape[r.shape] for r in rows]))


def ideal_end_to_end(num_sequences: int, ar_calls: float, spec_calls: float, gamma: int,
                     cost: Dict[str, float], draft: str, refeed: bool = False) -> float:
  """AR time / speculative time predicted from call costs alone, per-sequence prefill
  (encoder + cache) included (theory.end_to_end_speedup at a step of g t_d + t_v).

  The paper's ideal (theory.ideal_speedup) leaves out the prefill, which both methods pay
  once per sequence; at batch 1 on a CPU it is a sizeable share of short decodes.
  `refeed`: the draft calls as the loop makes them, the first of each step the 2-token
  catch-up (cost['t_draft_refeed_{draft}']; the last draft of a fully accepted block was
  never fed) instead of g one-token calls.
  """
  pre_t, pre_d = cost['t_prefill_target'], cost[f't_prefill_draft_{draft}']
  t_t, t_d = cost['t_target_step'], cost[f't_draft_step_{draft}']
  t_v = cost[f't_verify_{gamma + 1}']
  drafting = gamma * t_d
  if refeed:
    drafting = cost[f't_draft_refeed_{draft}'] + (gamma - 1) * t_d
  return theory.end_to_end_speedup(num_sequences, ar_calls, spec_calls, t_t, drafting + t_v,
                                   pre_t, pre_d)
