"""Which SentencePiece model a checkpoint was trained with, and checking a task against it.

A model's token ids mean nothing without its vocabulary, and T5X checkpoints do not
record it, so a task registered with another SentencePiece model decodes to fluent-looking
nonsense (BLEU 0) with no error. A model directory may therefore hold `vocabulary.json`
(written by `record_vocabulary`, e.g. `scripts/train.py --vocab`):

  {"sentencepiece_model": "demo_spm.model", "sha256": "<of the .model file>",
   "extra_ids": 0}

`check_checkpoints_vocabulary` looks for it in a checkpoint directory and its parent and
compares the task vocabulary's file (by content hash, so copies and moves are fine) and
extra ids. Without a record nothing more than the size check of
`models.check_task_vocabulary` can be done. Checkpoints, records and SentencePiece models
may be local or remote (gs://...): remote ones are read as T5X reads them (storage.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from specdec_t5x.integration import run_dir, storage

RECORD = 'vocabulary.json'


@functools.lru_cache(maxsize=32)
def _sha256(path: str, mtime: float, size: int) -> str:
  del mtime, size  # Cache keys only.
  return hashlib.sha256(storage.read_bytes(path)).hexdigest()


def file_sha256(path: str) -> str:
  """sha256 of a local or remote file's content (cached while its time and size hold)."""
  path = storage.resolve(path)
  return _sha256(path, *storage.stat(path))


def spm_identity(vocab: Any) -> Tuple[Optional[str], int]:
  """(absolute local path or remote URL of the SentencePiece model, extra ids) of a vocab."""
  path = getattr(vocab, 'sentencepiece_model_file', None)
  if path:
    path = storage.resolve(path)
  return path, int(getattr(vocab, 'extra_ids', 0) or 0)


def same_sentencepiece(a: Any, b: Any) -> bool:
  """Whether two seqio SentencePiece vocabularies are the same model: the same path and
  extra ids, or files (local or remote) with the same content (sha256)."""
  (path_a, extra_a), (path_b, extra_b) = spm_identity(a), spm_identity(b)
  if extra_a != extra_b:
    return False
  if path_a == path_b:
    return True
  return bool(path_a and path_b and storage.isfile(path_a) and storage.isfile(path_b)
              and file_sha256(path_a) == file_sha256(path_b))


def record_vocabulary(model_dir: str, spm_path: str, extra_ids: int = 0) -> str:
  """Writes `model_dir/vocabulary.json` for the SentencePiece model at `spm_path`."""
  record = {'sentencepiece_model': os.path.basename(spm_path),
            'sha256': file_sha256(spm_path), 'extra_ids': int(extra_ids)}
  path = os.path.join(model_dir, RECORD)
  run_dir.write_atomic(path, json.dumps(record, indent=1))
  return path


def find_record(checkpoint: Optional[str]) -> Optional[Dict[str, Any]]:
  """The vocabulary record of a checkpoint (in its directory or its parent), or None."""
  if not checkpoint:
    return None
  here = storage.resolve(checkpoint)
  here = here if storage.isdir(here) else storage.dirname(here)
  for directory in dict.fromkeys((here, storage.dirname(here))):
    path = storage.join(directory, RECORD)
    if storage.isfile(path):
      return dict(json.loads(storage.read_text(path)), record=path)
  return None


def check_checkpoints_vocabulary(vocab: Any, checkpoints: Mapping[str, Optional[str]]) -> None:
  """Raises ValueError if a checkpoint's recorded vocabulary is not the task's `vocab`.

  Args:
    vocab: the task's seqio.SentencePieceVocabulary.
    checkpoints: {gin macro naming it: checkpoint path or None}.
  """
  spm = getattr(vocab, 'sentencepiece_model_file', None)
  extra = int(getattr(vocab, 'extra_ids', 0) or 0)
  for macro, checkpoint in checkpoints.items():
    record = find_record(checkpoint)
    if record is None or not spm or not storage.isfile(spm):
      continue
    if file_sha256(spm) != record.get('sha256') or extra != record.get('extra_ids', 0):
      raise ValueError(
          f'The task vocabulary ({spm}, extra_ids={extra}) is not the one {macro} '
          f'{checkpoint} was trained with ({record.get("sentencepiece_model")}, '
          f'extra_ids={record.get("extra_ids", 0)}, sha256 {record.get("sha256", "")[:12]}..., '
          f'per {record["record"]}). Register the task with that model '
          '(--gin.infer.task_vocab_path; VOCAB_PATH when VOCABULARY is set).')
