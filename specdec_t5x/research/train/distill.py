"""Sequence-level distillation data: a model's greedy outputs as the new targets.

Sequence-level knowledge distillation (Kim & Rush, 2016): a draft trained on its target's
own greedy outputs learns the target's mode, which is what raises alpha.
scripts/build_data.py distill writes such a corpus; scripts/train.py --init_from trains on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tqdm

from specdec_t5x.algorithm.network import Transformer
from specdec_t5x.research.measure import batched


def distill_targets(model: Transformer, params: Any, inputs: np.ndarray, max_len: int,
                    batch_size: int = 512, progress: bool = False) -> np.ndarray:
  """The model's greedy outputs for `inputs` [N, in_len]: int32 [N, max_len], 0-padded.

  Rows keep their EOS (1) when the model emitted one within max_len. Every batch has
  `batch_size` rows (the last padded with dummy rows), so one shape is compiled.
  """
  out = np.zeros((len(inputs), max_len), np.int32)  # [N, max_len]
  batches = batched.split(inputs, batch_size, fill='eos', trim=False)  # Dummy rows: a lone EOS.
  for b, decoded in tqdm.tqdm(batched.decode((model, params), batches, max_len),
                              total=len(batches), disable=not progress, desc='distill'):
    out[b.start:b.start + b.n] = np.asarray(decoded.tokens)[:b.n]
  return out
