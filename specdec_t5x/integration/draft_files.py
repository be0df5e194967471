"""N-gram draft files: one .npz per draft, holding its params and `vocab_size`.

`scripts/build_ngram_drafts.py` writes them (unigram_<task>.npz, bigram_<task>.npz) from
corpus counts; `load_ngram` gives back the draft module and its params. The drafts
themselves (specdec_t5x.algorithm.drafts) know nothing of files.
"""

import io
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import drafts
from specdec_t5x.integration import run_dir


def save_ngram(path: str, params: Mapping[str, Any], vocab_size: int) -> None:
  """Writes n-gram draft params and `vocab_size` to `path` (.npz, compressed, atomically)."""
  buffer = io.BytesIO()
  np.savez_compressed(buffer, vocab_size=vocab_size, **params)
  run_dir.write_atomic(path, buffer.getvalue())


def load_ngram(path: str):
  """-> (module, params) of a draft saved by `save_ngram` (sparse bigram, bigram or unigram).

  Raises:
    FileNotFoundError: no file at `path`.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f'No n-gram draft at {path!r}.')
  with np.load(path) as data:
    params = {k: jnp.asarray(data[k]) for k in data.files if k != 'vocab_size'}
    vocab = int(data['vocab_size'])
  return drafts.ngram_draft(params, vocab)
