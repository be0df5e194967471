"""Length buckets: pad a batch of encoder inputs only as far as it needs.

Every jitted decode compiles once per input shape. Padding every batch to the task's
feature length (128 for the demo) keeps one shape but makes both encoders (and every
cross-attention) run over all 128 positions when a sentence has 30 tokens. Instead each
batch is padded to the smallest bucket that holds its longest row: a power of two, at
least `MIN_BUCKET`, at most the feature length. That is a handful of shapes, each
compiled once and cached by jit, e.g. 16, 32, 64 and 128 for a feature length of 128.

Padding is masked everywhere (encoder self-attention and cross-attention; pad id 0), so
a bucketed batch decodes to the same tokens as the same batch padded to the full length
(tests/test_batching.py checks greedy and sampled, autoregressive and speculative).

Only the encoder side is bucketed. The decoder's self-attention cache is sized from the
decode length (max_decode_length + gamma + 1 slots): the output length is unknown before
decoding, and a smaller cache would cut outputs short, so that size is already the least
that is exact.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

MIN_BUCKET = 16


def bucket_length(n: int, max_len: Optional[int] = None, min_len: int = MIN_BUCKET) -> int:
  """The smallest power of two >= max(n, min_len), capped at `max_len`.

  Args:
    n: the longest row of the batch, in tokens (padding excluded).
    max_len: the task's feature length, the largest bucket (None: no cap). A cap that
      is not a power of two is itself the last bucket.
    min_len: the smallest bucket (a power of two), so short batches share one shape.

  Returns:
    The padded length of the batch.
  """
  if n < 0:
    raise ValueError(f'Row length must be >= 0, got {n}.')
  if min_len < 1 or min_len & (min_len - 1):
    raise ValueError(f'min_len must be a power of two >= 1, got {min_len}.')
  if max_len is not None and n > max_len:
    raise ValueError(f'A row of {n} tokens does not fit the feature length {max_len}; '
                     'truncate inputs first (infer: allow_truncation=True).')
  length = max(min_len, 1 << max(n - 1, 0).bit_length())
  return length if max_len is None else min(length, int(max_len))


def pad_batch(rows: Sequence[Sequence[int]], max_len: Optional[int] = None,
              min_len: int = MIN_BUCKET) -> np.ndarray:
  """Rows of token ids -> [len(rows), bucket] int32, zero-padded on the right.

  `bucket` = bucket_length(longest row, max_len, min_len); rows longer than `max_len`
  raise (cut them first).
  """
  if not len(rows):
    raise ValueError('pad_batch needs at least one row.')
  longest = max(len(r) for r in rows)
  out = np.zeros((len(rows), bucket_length(longest, max_len, min_len)), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def trim_batch(tokens: np.ndarray, min_len: int = MIN_BUCKET) -> np.ndarray:
  """A right-padded [batch, length] array cut to the bucket of its longest row.

  Only columns that are padding (0) in every row are dropped, so the result is the
  same batch padded less: pad_batch of the rows with max_len = length.
  """
  tokens = np.asarray(tokens)
  if tokens.ndim != 2:
    raise ValueError(f'trim_batch takes a [batch, length] array, got shape {tokens.shape}.')
  used = np.flatnonzero(np.any(tokens != 0, axis=0))
  longest = int(used[-1]) + 1 if used.size else 0
  return tokens[:, :bucket_length(longest, tokens.shape[1], min_len)]
