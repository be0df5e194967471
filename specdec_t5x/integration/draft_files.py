"""N-gram draft files: one .npz per draft, holding its params and `vocab_size`.

`scripts/build_data.py ngram` writes them (unigram_<task>.npz, bigram_<task>.npz) from
corpus counts; `load_ngram` gives back the draft module and its params. The drafts
themselves (specdec_t5x.algorithm.drafts) know nothing of files.
"""

import io
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import drafts
from specdec_t5x.integration import run_dir, storage


def save_ngram(path: str, params: Mapping[str, Any], vocab_size: int) -> None:
  """Writes n-gram draft params and `vocab_size` to `path` (.npz, compressed, atomically)."""
  buffer = io.BytesIO()
  np.savez_compressed(buffer, vocab_size=vocab_size, **params)
  run_dir.write_atomic(path, buffer.getvalue())


def load_ngram(path: str):
  """-> (module, params) of a draft saved by `save_ngram` (sparse bigram, bigram or unigram),
  from a local path or a URL (gs://...).

  Raises:
    FileNotFoundError: no file at `path`.
  """
  if not storage.exists(path):
    raise FileNotFoundError(f'No n-gram draft at {path!r}.')
  source = io.BytesIO(storage.read_bytes(path)) if storage.is_url(path) else path
  with np.load(source) as data:
    params = {k: jnp.asarray(data[k]) for k in data.files if k != 'vocab_size'}
    vocab = int(data['vocab_size'])
  return drafts.ngram_draft(params, vocab)
