"""Training data: token arrays per task, a deterministic multitask mixture, held-out batches.

Data: `{data_dir}/{task}_{split}.npz`, int32 `inputs` [N, in_len] and `targets` [N, tgt_len]
(0-padded, EOS 1 included). Batches mix tasks example by example (proportional to size by
default, as T5's mixtures), each task read in seeded epoch permutations, so batch `s` is a
function of (seed, s, per-task cursors) and a resumed run sees the same batches.
"""

from __future__ import annotations

import glob
import os
from typing import Mapping, Optional

import numpy as np

Batch = dict[str, np.ndarray]
Tasks = Mapping[str, Mapping[str, np.ndarray]]


def load_split(data_dir: str, split: str,
               vocab_size: Optional[int] = None) -> dict[str, dict[str, np.ndarray]]:
  """{task: {'inputs', 'targets'}} from every `{task}_{split}.npz` in `data_dir`.

  Refuses (ValueError naming the file, array and row) arrays that are missing, not 2-D
  integers, of other row counts, or hold a token id outside [0, vocab_size) (only < 0
  without a vocab_size): the embedding lookup would clamp them or train to NaN.
  """
  files = sorted(glob.glob(os.path.join(glob.escape(data_dir), f'*_{split}.npz')))
  if not files:
    raise FileNotFoundError(f'No *_{split}.npz files in {data_dir}')
  tasks = {}
  for f in files:
    with np.load(f) as z:
      arrays = {k: _checked(f, z, k, vocab_size) for k in ('inputs', 'targets')}
    if len(arrays['inputs']) != len(arrays['targets']):
      raise ValueError(f'{f}: inputs has {len(arrays["inputs"])} rows, targets '
                       f'{len(arrays["targets"])}; they must pair up row by row.')
    tasks[os.path.basename(f)[:-len(f'_{split}.npz')]] = arrays
  return tasks


def _checked(path: str, npz, key: str, vocab_size: Optional[int]) -> np.ndarray:
  """npz[key] as int32 [rows, length] token ids, or a ValueError naming what is wrong."""
  if key not in npz:
    raise ValueError(f'{path} has no {key!r} array (found {sorted(npz.keys())}).')
  array = npz[key]
  if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
    raise ValueError(f'{path}: {key} must be a 2-D integer array [rows, length] of token '
                     f'ids, got {array.dtype} {array.shape}.')
  bad = array < 0
  if vocab_size is not None:
    bad |= array >= vocab_size
  if bad.any():
    row, col = (int(i) for i in np.argwhere(bad)[0])
    limit = vocab_size if vocab_size is not None else 'vocab_size'
    raise ValueError(f'{path}: {key} row {row} (column {col}) holds token id '
                     f'{int(array[row, col])}, outside the vocabulary [0, {limit}) '
                     f'({int(bad.any(axis=1).sum())} rows affected). Tokenize with the '
                     "model's vocabulary or set vocab_size to cover it.")
  return array.astype(np.int32)


def make_batch(inputs: np.ndarray, targets: np.ndarray) -> Batch:
  """T5X feature dict; decoder inputs are the targets shifted right behind BOS 0."""
  dec_in = np.zeros_like(targets)  # [batch, tgt_len]
  dec_in[:, 1:] = targets[:, :-1]
  return {'encoder_input_tokens': inputs, 'decoder_input_tokens': dec_in,
          'decoder_target_tokens': targets}


class Mixture:
  """Deterministic multitask batches: `batch(step, cursors) -> (batch, new cursors)`.

  Each example picks a task with probability `rates`; task t then yields its next example
  of a seeded per-epoch permutation. `cursors[t]` counts task t's examples consumed.
  """

  def __init__(self, tasks: Tasks, batch_size: int, seed: int = 0,
               rates: Optional[Mapping[str, float]] = None):
    self.names = sorted(tasks)
    self.tasks, self.batch_size, self.seed = tasks, batch_size, seed
    if rates is not None and set(rates) - set(self.names):
      raise ValueError(f'Mixing rates for unknown tasks: {set(rates) - set(self.names)}')
    raw = np.array([len(tasks[n]['inputs']) if rates is None else rates.get(n, 0.0)
                    for n in self.names], np.float64)
    self.rates = raw / raw.sum()  # [tasks]
    self._perm = {}

  def _permutation(self, t: int, epoch: int) -> np.ndarray:
    if self._perm.get(t, (None,))[0] != epoch:
      n = len(self.tasks[self.names[t]]['inputs'])
      self._perm[t] = (epoch, np.random.default_rng([self.seed, t, epoch]).permutation(n))
    return self._perm[t][1]

  def batch(self, step: int, cursors: np.ndarray) -> tuple[Batch, np.ndarray]:
    rng = np.random.default_rng([self.seed, 1 << 20, step])
    which = rng.choice(len(self.names), size=self.batch_size, p=self.rates)  # [batch]
    inputs, targets = (np.zeros((self.batch_size, self.tasks[self.names[0]][k].shape[1]),
                                np.int32) for k in ('inputs', 'targets'))  # [batch, len]
    cursors = np.array(cursors, np.int64)
    for t, name in enumerate(self.names):
      rows = np.flatnonzero(which == t)
      n = len(self.tasks[name]['inputs'])
      idx = np.array([self._permutation(t, p // n)[p % n]
                      for p in range(cursors[t], cursors[t] + len(rows))], np.int64)
      inputs[rows] = self.tasks[name]['inputs'][idx]
      targets[rows] = self.tasks[name]['targets'][idx]
      cursors[t] += len(rows)
    return make_batch(inputs, targets), cursors


def validation_batches(tasks: Tasks, batch_size: int, num_examples: int,
                       seed: int = 1234) -> list[tuple[str, Batch]]:
  """Fixed held-out batches per task (a seeded subset), padded with all-zero rows."""
  out = []
  for name in sorted(tasks):
    inp, tgt = tasks[name]['inputs'], tasks[name]['targets']
    idx = np.sort(np.random.default_rng(seed).permutation(len(inp))[:num_examples])
    for s in range(0, len(idx), batch_size):
      rows = idx[s:s + batch_size]
      pad = ((0, batch_size - len(rows)), (0, 0))
      out.append((name, make_batch(np.pad(inp[rows], pad), np.pad(tgt[rows], pad))))
  return out


def token_counts(batch: Batch) -> tuple[int, int]:
  """(padded, non-pad) tokens of a batch's encoder inputs and decoder targets."""
  tokens = (batch['encoder_input_tokens'], batch['decoder_target_tokens'])
  return sum(x.size for x in tokens), int(sum((x > 0).sum() for x in tokens))
