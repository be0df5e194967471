"""Sequence-level distillation data: a model's greedy outputs as the new targets.

Sequence-level knowledge distillation (Kim & Rush, 2016): a draft trained on its target's
own greedy outputs learns the target's mode, which is what raises alpha.
scripts/distill_data.py writes such a corpus; scripts/train.py --init_from trains on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tqdm

from specdec_t5x.algorithm import api
from specdec_t5x.algorithm.network import Transformer


def distill_targets(model: Transformer, params: Any, inputs: np.ndarray, max_len: int,
                    batch_size: int = 512, progress: bool = False) -> np.ndarray:
  """The model's greedy outputs for `inputs` [N, in_len]: int32 [N, max_len], 0-padded.

  Rows keep their EOS (1) when the model emitted one within max_len. Every batch has
  `batch_size` rows (the last padded with dummy rows), so one shape is compiled.
  """
  out = np.zeros((len(inputs), max_len), np.int32)  # [N, max_len]
  for s in tqdm.tqdm(range(0, len(inputs), batch_size), disable=not progress, desc='distill'):
    rows = inputs[s:s + batch_size]
    padded = np.pad(rows, ((0, batch_size - len(rows)), (0, 0)))  # [batch_size, in_len]
    padded[len(rows):, 0] = 1  # Dummy rows: a lone EOS.
    tokens = api.generate((model, params), padded, max_decode_length=max_len).tokens
    out[s:s + len(rows)] = np.asarray(tokens)[:len(rows)]
  return out
