"""The statistics of one decode, typed, and their summary.

`DecodeStats` is what the decoding loops count and what `generate` returns as `.stats`:
one set of names from the loop to metrics.json. It is a pytree (flax.struct) and a
read-only Mapping, so `out.stats['target_calls']`, `dict(out.stats)` and
`out.stats.items()` work as on a dict.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping

import flax.struct
import jax
import numpy as np

# Per-row counters: summed over rows and batches they give a run's totals. beta_sum is a
# float (`total` sums each counter in its own type); the others count.
PER_EXAMPLE_STATS = ('target_calls', 'drafted_tokens', 'accepted_tokens', 'generated_tokens',
                     'beta_positions', 'beta_sum')
FLOAT_STATS = ('beta_sum',)
# Counted over a batch's rows (not per example): summed batch by batch into a run's.
BATCH_STATS = ('accepted_length_histogram', 'accepted_by_source')
# What proposed an accepted token (DecodeStats.accepted_by_source's entries, in order).
SOURCES = ('draft_chain', 'copy_branch', 'draft_siblings')


@flax.struct.dataclass
class DecodeStats(Mapping):
  """Counters of one decode. Shapes: b = batch, gamma = the static maximum draft length."""
  target_calls: jax.Array  # [b] int32: target calls while the row was decoding
  drafted_tokens: jax.Array  # [b] int32: draft tokens proposed to the row's verifier
  accepted_tokens: jax.Array  # [b] int32: draft tokens accepted
  generated_tokens: jax.Array  # [b] int32: tokens emitted (EOS included)
  # The paper's alpha = E[beta], beta = sum_x min(p(x), q(x)) of the target's p and the
  # draft's q after one prefix, is measured at the drafted positions whose prefix is the
  # output's (a chain: the accepted drafts and the first rejected one; a static tree: those
  # of its draft chain on the accepted path; a dynamic tree: the root), where q is the
  # draft's sampling distribution (at temperature 0: beta = [argmax q == argmax p]).
  beta_positions: jax.Array  # [b] int32: the positions beta was measured at
  beta_sum: jax.Array  # [b] float32: beta summed over them
  accepted_length_histogram: jax.Array  # [gamma + 1] int32: steps with 0..gamma accepted
  draft_length_histogram: jax.Array  # [gamma + 1] int32: steps with 0..gamma drafts verified
  nonfinite_target_logits: jax.Array  # [b] bool: a target call gave the row NaN/inf logits
  nonfinite_draft_logits: jax.Array  # [b] bool: a draft call gave the row NaN/inf logits
  # [b] bool: a model call's cache writes did not fit its cache and were dropped (a sizing
  # bug: every later token of the decode is suspect; generate raises)
  skipped_cache_writes: jax.Array
  # [3] int32: steps that verified >= 1 draft and ended with (0) the first draft rejected,
  # (1) a later draft rejected, (2) every draft accepted (the bonus token): the branches of
  # the acceptance rule, counted over rows
  step_outcomes: jax.Array
  # [3] int32: accepted draft tokens by what proposed them, counted over rows (SOURCES):
  # the draft's chain, a draft tree's copy branch, a draft tree's siblings
  accepted_by_source: jax.Array

  def __getitem__(self, key: str) -> jax.Array:
    if key not in _FIELDS:
      raise KeyError(key)
    return getattr(self, key)

  def __iter__(self) -> Iterator[str]:
    return iter(_FIELDS)

  def __len__(self) -> int:
    return len(_FIELDS)


_FIELDS = tuple(DecodeStats.__dataclass_fields__)


def total(key: str, values: Any):
  """A PER_EXAMPLE_STATS counter summed over `values` (rows, or totals already summed):
  a float for FLOAT_STATS, else an int."""
  value = np.sum(np.asarray(values))
  return float(value) if key in FLOAT_STATS else int(value)


def rates(stats: Mapping[str, Any]) -> Dict[str, Any]:
  """`summarize`'s alpha and acceptance_rate alone."""
  out = summarize(stats)
  return {'alpha': out['alpha'], 'acceptance_rate': out['acceptance_rate']}


def summarize(stats: Mapping[str, Any]) -> Dict[str, Any]:
  """Run totals of DecodeStats-named counters -> the speculative statistics.

  `stats`: a DecodeStats (per-row arrays are summed over rows) or totals already summed
  (scalars, as infer keeps them). Returns the counters (`total`), alpha = beta_sum /
  beta_positions (the paper's alpha: the draft/target pair's, whatever gamma),
  acceptance_rate = accepted / drafted tokens (which falls as gamma grows: drafts after a
  rejection are discarded) and mean_tokens_per_target_call = generated tokens / target
  calls (each None when its denominator is 0), the accepted_length_histogram as a list and
  accepted_by_source as {SOURCES[i]: count} (each None when absent).
  """
  out: Dict[str, Any] = {k: total(k, stats.get(k, 0)) for k in PER_EXAMPLE_STATS}
  out['alpha'] = (out['beta_sum'] / out['beta_positions'] if out['beta_positions'] else None)
  out['acceptance_rate'] = (out['accepted_tokens'] / out['drafted_tokens']
                            if out['drafted_tokens'] else None)
  out['mean_tokens_per_target_call'] = (out['generated_tokens'] / out['target_calls']
                                        if out['target_calls'] else None)
  histogram = stats.get('accepted_length_histogram')
  out['accepted_length_histogram'] = (None if histogram is None
                                      else np.asarray(histogram).tolist())
  by_source = stats.get('accepted_by_source')
  out['accepted_by_source'] = (None if by_source is None else
                               dict(zip(SOURCES, np.asarray(by_source).tolist())))
  return out
