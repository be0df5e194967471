"""The inference runner's batch loop (integration/infer.py drives it): this shard's
examples, one batch decoded into jsonl lines with its statistics, and the resumable
chunk files those lines go to.

Chunks: every `checkpoint_period` batches the lines go to a chunk file under
`tmp-{task}-{shard}-of-{n}/`, recorded in `progress.json` (both written with
run_dir.write_atomic); a rerun keeps every chunk the manifest records with its full line
count, and `assemble` concatenates them into the final file, atomically.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np

from specdec_t5x.algorithm import batching, stats
from specdec_t5x.integration import infer_output, run_dir, tasks

COUNTERS = stats.PER_EXAMPLE_STATS
BATCH_STATS = stats.BATCH_STATS
PER_BATCH = infer_output.PER_BATCH


class ChunkStore:
  """Chunk files and the `progress.json` manifest of one (task, shard) run."""

  def __init__(self, tmp_dir: str, output_fname: str, fingerprint: Mapping[str, Any]):
    self.tmp_dir, self.output_fname = tmp_dir, output_fname
    self.manifest_path = os.path.join(tmp_dir, 'progress.json')
    self.fingerprint = json.loads(json.dumps(fingerprint))
    os.makedirs(tmp_dir, exist_ok=True)
    self.chunks: Dict[str, Dict[str, Any]] = {}
    if os.path.exists(self.manifest_path):
      with open(self.manifest_path, encoding='utf-8') as f:
        manifest = json.load(f)
      run_dir.check_settings(manifest['fingerprint'], self.fingerprint, tmp_dir, 'an unfinished')
      self.chunks = {c: info for c, info in manifest['chunks'].items()
                     if self._lines(int(c)) == info['examples']}

  def path(self, chunk: int) -> str:
    return os.path.join(self.tmp_dir, f'{self.output_fname}-chunk{chunk:05}')

  def _lines(self, chunk: int) -> int:
    path = self.path(chunk)
    return sum(1 for _ in open(path, encoding='utf-8')) if os.path.exists(path) else -1

  def done(self, chunk: int) -> bool:
    return str(chunk) in self.chunks

  def write(self, chunk: int, lines: Sequence[str], info: Dict[str, Any]) -> None:
    run_dir.write_atomic(self.path(chunk), ''.join(line + '\n' for line in lines))
    self.chunks[str(chunk)] = dict(info, examples=len(lines))
    run_dir.write_atomic(self.manifest_path, json.dumps(
        {'fingerprint': self.fingerprint, 'chunks': self.chunks}, indent=1))

  def assemble(self, num_chunks: int, output_path: str) -> None:
    tmp = f'{output_path}.tmp-{os.getpid()}'
    with open(tmp, 'wb') as out:
      for chunk in range(num_chunks):
        with open(self.path(chunk), 'rb') as f:
          shutil.copyfileobj(f, out)
    os.replace(tmp, output_path)

  def total(self, num_chunks: int) -> Dict[str, Any]:
    """The statistics of chunks 0..num_chunks-1, summed (sum_chunks)."""
    return sum_chunks([self.chunks[str(c)] for c in range(num_chunks)])


def load_examples(task_name: str, dataset_cfg: Any, *, allow_truncation: bool,
                  num_examples: Optional[int], shard_id: int, num_shards: int) -> List[dict]:
  """This shard's examples as numpy dicts; inputs too long raise unless truncation is on."""
  try:
    examples = list(tasks.get_dataset(
        task_name, dataset_cfg.split, dataset_cfg.task_feature_lengths, num_examples,
        truncate=allow_truncation).as_numpy_iterator())
  except ValueError as e:
    if 'input tokens' not in str(e):
      raise
    raise ValueError(f'{e} To cut such inputs instead (as T5X does), leave '
                     '--gin.infer.allow_truncation at True.') from e
  if not examples[shard_id::num_shards]:
    raise ValueError(f'{task_name}:{dataset_cfg.split} has no examples for shard {shard_id}.')
  for index, example in enumerate(examples):  # Fail before decoding, not in json_line.
    for key, value in example.items():
      if key.endswith('_pretokenized') and isinstance(value, bytes):
        try:
          value.decode('utf-8')
        except UnicodeDecodeError as e:
          raise ValueError(f'{task_name}:{dataset_cfg.split} example {index} has invalid '
                           f'UTF-8 in {key!r} at byte {e.start}: {value[:80]!r}; fix or '
                           're-encode the source as UTF-8.') from None
  return examples[shard_id::num_shards]


def examples_sha256(examples: Sequence[Mapping[str, Any]]) -> str:
  """SHA-256 of the examples' features in order (names, dtypes, shapes, values): the
  identity of a run's inputs, so that a finished run is reused only for the same ones."""
  digest = hashlib.sha256()
  for example in examples:
    for key in sorted(example):
      value = example[key]
      if isinstance(value, bytes):
        header, data = 'bytes', value
      else:
        array = np.ascontiguousarray(value)
        header, data = f'{array.dtype.str}{array.shape}', array.tobytes()
      for part in (key.encode('utf-8'), header.encode('utf-8'), data):
        digest.update(len(part).to_bytes(8, 'little') + part)
    digest.update(b'\x00end')
  return digest.hexdigest()


def target_alone(model: Any) -> Any:
  """A copy of the T5X model that decodes with its target alone: a run's autoregressive
  baseline (no draft; the same settings without a draft tree, which a target alone does
  not verify)."""
  base = copy.copy(model)
  base.draft_module = None
  base.decode_config = model.decode_config.without_tree()
  return base


class BatchRunner:
  """Decodes one batch of examples into jsonl lines, adding its statistics to a chunk's."""

  def __init__(self, model: Any, params: Any, partitioner: Any, vocab: Any, input_len: int,
               max_len: int, rng: jax.Array):
    self.model, self.params, self.partitioner, self.vocab = model, params, partitioner, vocab
    self.input_len, self.max_len, self.rng = input_len, max_len, rng
    self.batches_run = 0
    self.shapes_run: set = set()

  def run(self, index: int, rows: Sequence[Mapping[str, Any]],
          info: Dict[str, Any]) -> List[str]:
    # Padded to the smallest length bucket that holds the batch (batching.py): the same
    # tokens as padding to input_len, with encoders run over fewer positions.
    enc = batching.pad_batch([ex['inputs'] for ex in rows], self.input_len)
    batch = {'encoder_input_tokens': enc,
             'decoder_input_tokens': np.zeros((len(rows), self.max_len), np.int32)}
    compiles = enc.shape not in self.shapes_run  # The first batch of a shape compiles.
    self.shapes_run.add(enc.shape)
    if self.partitioner is not None and jax.process_count() > 1:
      # Each host feeds only its rows of the global batch (padded alike: every host
      # knows the batch's lengths).
      start, stop = self.partitioner.host_rows(len(rows))
      batch = {k: self.partitioner.shard_host_rows(v[start:stop], len(rows), start)
               for k, v in batch.items()}
    elif self.partitioner is not None:
      batch = {k: self.partitioner.shard_batch(v) for k, v in batch.items()}
    tick = time.perf_counter()
    out = self.model.predict_batch_with_stats(self.params, batch,
                                              rng=jax.random.fold_in(self.rng, index))
    decodes, aux, batch_stats = multihost_utils.process_allgather(out, tiled=True)
    seconds = time.perf_counter() - tick
    counts = {k: stats.total(k, aux[k]) for k in COUNTERS}
    counts.update({k: batch_stats[k] for k in BATCH_STATS})
    counts['seconds'] = seconds
    if not compiles:
      counts.update(warm_seconds=seconds, warm_tokens=counts['generated_tokens'])
      info.setdefault(PER_BATCH, []).append([index, seconds])
    for k, v in counts.items():
      info[k] = np.add(info.get(k, 0), v).tolist()
    self.batches_run += 1
    return [infer_output.json_line(
        ex, infer_output.decode_text(self.vocab, decodes[r], self.model.eos_id),
        {k: stats.total(k, aux[k][r]) for k in COUNTERS}) for r, ex in enumerate(rows)]


def sum_chunks(infos: List[Dict[str, Any]]) -> Dict[str, Any]:
  """Chunk statistics summed key by key; the per-batch timings concatenated."""
  total: Dict[str, Any] = {}
  for info in infos:
    for k, v in info.items():
      if k == PER_BATCH:  # a list per batch: concatenated, not summed
        total[k] = total.get(k, []) + list(v)
        continue
      total[k] = (np.add(total[k], v) if k in total else np.asarray(v)).tolist()
  return total
