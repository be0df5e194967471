"""What every result row says of a timed decode: its median seconds, its speedup over the
base decode (AR) and whether its tokens equal the base's, from harness.interleaved's
timings of decoders whose outputs are lists of `api.generate` outputs (grid.Decoder).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from specdec_t5x.algorithm import stats as stats_lib


def row_totals(outs: Sequence[Any]) -> Tuple[np.ndarray, Dict[str, int]]:
  """-> (tokens [N, max_len] of every row of every output, the per-example statistics
  summed over the rows) of a grid.Decoder's outputs (batches of any size)."""
  tokens = np.concatenate([np.asarray(o.tokens) for o in outs])
  return tokens, {k: stats_lib.total(k, [np.sum(o.stats[k]) for o in outs])
                  for k in stats_lib.PER_EXAMPLE_STATS}


@dataclasses.dataclass(frozen=True)
class Timed:
  """One decode of an interleaved timing, set against the base decode (AR)."""
  name: str
  tokens: np.ndarray  # [N, max_len]: every row of its outputs.
  stats: Dict[str, Any]  # `totals` of its outputs.
  seconds: float  # Median seconds of a run.
  speedup_vs_ar: float  # The base's median seconds / its own.
  equal_to_ar: bool  # Its tokens are the base's, row for row.


def timed(timings: Any, base: str = 'AR',
          totals: Callable[[Sequence[Any]], Tuple[np.ndarray, Dict[str, Any]]] = row_totals
          ) -> List[Timed]:
  """Per name of harness.interleaved over grid.Decoder fns, in order: its tokens and
  statistics (`totals` of its outputs), its median seconds, its speedup over `base` and
  whether its tokens equal `base`'s: what every result row says of a timed decode."""
  med = timings.median
  base_tokens, _ = totals(timings.outputs[base])
  out = []
  for name, outs in timings.outputs.items():
    tokens, stats = totals(outs)
    out.append(Timed(name, tokens, stats, med[name], med[base] / med[name],
                     bool(np.array_equal(tokens, base_tokens))))
  return out
