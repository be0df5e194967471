"""Greedy agreement of drafts with the target, by how sure the target is.

A greedy draft token is accepted when it is the target's argmax. Where the target puts
most of its mass on one token that argmax is easy to learn; where its distribution is flat
the argmax hangs on small logit differences between close candidates. `agreement_table`
teacher-forces the target over its own greedy outputs (the contexts greedy speculative
decoding verifies), buckets every position by the target's top-1 probability, and counts,
per bucket, how often each draft's argmax at that position (given the true prefix: the
first draft of a step) is the target's. It shows which part of the acceptance gap lies
where the target is unsure.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api
from specdec_t5x.algorithm.feature_draft import FeatureDraft
from specdec_t5x.research.measure import forcing

ModelAndParams = Tuple[Any, Any]
EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)  # top-1 probability buckets [lo, hi); the last is closed
POSITIONS = (0, 8, 16, 32)  # output position buckets [lo, next lo), the last one open


def draft_argmax(draft: ModelAndParams, target: ModelAndParams, enc: np.ndarray,
                 tokens: np.ndarray, forced: Optional[dict] = None) -> np.ndarray:
  """The draft's argmax [b, L] at every position of `tokens`, teacher forced (a feature
  head reads the target's features of the true prefix: the target's forcing.features
  pass over `tokens` with the head's feature_layers, taken from `forced` (keyed by them)
  or computed here and added to it)."""
  module, params = draft
  if isinstance(module, FeatureDraft):
    dec_in = forcing.shift_right(tokens)
    forced = {} if forced is None else forced
    layers = module.config.feature_layers
    if layers not in forced:
      forced[layers] = forcing.features(*target, enc, dec_in, tokens, layers)
    _, _, before, encoded = forced[layers]
    logits = module.apply({'params': params}, encoded, enc, dec_in, before, tokens)[0][0]
    best = jnp.argmax(logits, -1)
    ids = module.config.draft_vocab
    return np.asarray(jnp.asarray(ids, jnp.int32)[best] if ids else best)
  return np.asarray(jnp.argmax(forcing.logits(module, params, enc, tokens, tokens), -1))


def agreement_table(target: ModelAndParams, drafts: Dict[str, ModelAndParams],
                    enc: np.ndarray, max_len: int, edges: Sequence[float] = EDGES,
                    positions: Sequence[int] = POSITIONS) -> dict:
  """Per top-1 probability bucket: the share of positions, the target's mean top-1
  probability there, and each draft's argmax agreement; the same per output position
  bucket; plus every draft's overall agreement. Positions: the target's greedy output
  tokens up to and including EOS."""
  tokens = np.asarray(api.generate(target, enc, max_decode_length=max_len).tokens)
  forced = {(): forcing.features(*target, enc, forcing.shift_right(tokens),
                                 tokens)}  # for the table and every head
  probs = jax.nn.softmax(forced[()][0].astype(jnp.float32), -1)
  top1, best = np.asarray(jnp.max(probs, -1)), np.asarray(jnp.argmax(probs, -1))
  mask = tokens > 0
  # The decode's tokens are what the verifier compares with (teacher forcing sums in
  # another order, which may flip a near-tie: counted, not hidden).
  agree = {name: draft_argmax(d, target, enc, tokens, forced) == tokens
           for name, d in drafts.items()}
  p, n = top1[mask], int(mask.sum())
  rows = []
  for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
    inside = (p >= lo) & ((p < hi) if i < len(edges) - 2 else (p <= hi))
    rows.append({'top1_from': lo, 'top1_to': hi, 'share': float(inside.sum() / n),
                 'mean_top1': float(p[inside].mean()) if inside.any() else None,
                 'agreement': {k: float(a[mask][inside].mean()) if inside.any() else None
                               for k, a in agree.items()}})
  where = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)[mask]
  by_position = []
  for lo, hi in zip(positions, list(positions[1:]) + [tokens.shape[1]]):
    inside = (where >= lo) & (where < hi)
    by_position.append({'from': lo, 'to': hi, 'share': float(inside.sum() / n),
                        'agreement': {k: float(a[mask][inside].mean()) if inside.any() else None
                                      for k, a in agree.items()}})
  return {'positions': n, 'teacher_forced_argmax_differs': int((best != tokens)[mask].sum()),
          'by_position': by_position, 'mean_top1': float(p.mean()),
          'agreement': {k: float(a[mask].mean()) for k, a in agree.items()}, 'buckets': rows}


def _bucket_table(first: str, labelled: Sequence[Tuple[str, dict]], table: dict) -> list:
  """A Markdown table: one row per (label, bucket), then the overall agreement."""
  names = list(table['agreement'])
  lines = [f'| {first} | share of positions | ' + ' | '.join(f'{k} agreement' for k in names)
           + ' |', '|---|---:|' + '---:|' * len(names)]
  for label, r in labelled:
    cells = [f'{r["agreement"][k]:.2f}' if r['agreement'][k] is not None else '-'
             for k in names]
    lines.append(f'| {label} | {r["share"]:.2f} | ' + ' | '.join(cells) + ' |')
  return lines + ['| all | 1.00 | ' + ' | '.join(f'{table["agreement"][k]:.2f}' for k in names)
                  + ' |']


def markdown(table: dict, task: str) -> str:
  return '\n'.join(
      [f'### {task}: {table["positions"]} positions, mean top-1 probability '
       f'{table["mean_top1"]:.2f}', '']
      + _bucket_table('target top-1 probability', [
          (f'{r["top1_from"]:.1f}-{r["top1_to"]:.1f}', r) for r in table['buckets']], table)
      + [''] + _bucket_table('output position', [
          (f'{r["from"]}-{r["to"] - 1}', r) for r in table['by_position']], table))
