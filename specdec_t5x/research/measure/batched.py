"""Rows run a batch at a time: the one way the measurements and the distillation split a
list of encoder rows into batches, fill up the last one, decode them and take back the
real rows.

Filling the last batch up to the full size keeps one shape, so one compile; its filler
rows (copies of its first row, or lone EOS rows that finish at once) are decoded and
dropped. Each batch may be cut to the length bucket of its real rows
(`batching.trim_batch`: fewer encoder positions, the same tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator, List, Optional, Tuple

import jax
import numpy as np

from specdec_t5x.algorithm import api, batching
from specdec_t5x.algorithm.config import DecodeConfig

ModelAndParams = Tuple[Any, Any]
FILLS = (None, 'first', 'eos')


@dataclasses.dataclass(frozen=True)
class Batch:
  """One batch of a split: its place, its rows and how many of them are real."""
  index: int  # Its place among the batches.
  start: int  # The row of the whole that is its first row.
  rows: np.ndarray  # [size, L] int32: the real rows, then the filler rows.
  n: int  # Real rows: rows[:n].


def split(enc: np.ndarray, size: int, fill: Optional[str] = 'first', trim: bool = True,
          eos_id: int = 1) -> List[Batch]:
  """enc [N, L] in batches of `size` rows, each cut to its bucket when `trim` (before the
  filling). `fill`: how a short last batch is filled up to `size` rows: 'first' (copies of
  its first row), 'eos' (rows holding only `eos_id`), or None (left short)."""
  if fill not in FILLS:
    raise ValueError(f'fill must be one of {FILLS}, got {fill!r}.')
  out = []
  for index, start in enumerate(range(0, len(enc), size)):
    rows = enc[start:start + size]
    rows = batching.trim_batch(rows) if trim else np.asarray(rows)
    n = len(rows)
    if fill == 'first' and n < size:
      rows = np.concatenate([rows, np.repeat(rows[:1], size - n, 0)])
    elif fill == 'eos' and n < size:
      rows = np.pad(rows, ((0, size - n), (0, 0)))
      rows[n:, 0] = eos_id
    out.append(Batch(index, start, rows, n))
  return out


def decode(target: ModelAndParams, batches: Iterable[Batch], max_len: int, *,
           draft: Optional[ModelAndParams] = None, config: DecodeConfig = DecodeConfig(),
           seed: int = 0, eos_id: int = 1,
           key_by: str = 'start') -> Iterator[Tuple[Batch, api.GenerateOutput]]:
  """Yields (batch, its `api.generate` output) for each batch, in order; the rng of a batch
  is PRNGKey(seed + its `start` row), or of seed + its `index` with key_by='index'."""
  if key_by not in ('start', 'index'):
    raise ValueError(f"key_by must be 'start' or 'index', got {key_by!r}.")
  for b in batches:
    offset = b.start if key_by == 'start' else b.index
    yield b, api.generate(target, b.rows, draft=draft, config=config,
                          max_decode_length=max_len, rng=jax.random.PRNGKey(seed + offset),
                          eos_id=eos_id)


def outputs(out: api.GenerateOutput, n: int) -> List[np.ndarray]:
  """The first `n` rows' tokens of a decode, each cut after its generated tokens."""
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.stats['generated_tokens'])
  return [tokens[r, :int(lengths[r])] for r in range(n)]
