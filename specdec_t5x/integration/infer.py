r"""Gin-configured inference runner mirroring `t5x.infer`, with speculative decoding.

  python -m specdec_t5x.infer --gin_file=configs/spec_t5_small_xxl.gin \
    --gin.TARGET_CHECKPOINT="'/ckpt/t5_1_1_xxl/checkpoint_1000000'" \
    --gin.DRAFT_CHECKPOINT="'/ckpt/t5_1_1_small/checkpoint_1000000'" \
    --gin.INFER_OUTPUT_DIR="'/tmp/spec_ende'" [--gin.GAMMA=5]

Gin files bind `infer_script.infer` (`import __main__ as infer_script`, as T5X's). Writes
to `output_dir`: `config.gin`; `{task}-{mode}.jsonl-00000-of-00001`, one JSON object per
example {"inputs": {..._pretokenized}, "prediction": text, "aux": per-example stats}; and
`metrics.json` (task metrics, timing, acceptance statistics, settings, git revision,
device). Results go to chunk files under `tmp-{task}-{shard}-of-{n}/` every
`checkpoint_period` batches, recorded in `progress.json` (temp file + rename); a rerun
with the same output_dir resumes after the last completed chunk, and the final file is
assembled atomically, so an interrupted run loses and duplicates nothing. It prints
(infer_output.print_summary) the results, where the files are and, for a finished run
reused, that nothing was decoded and how to decode again; on stderr a line before the
pauses of a first run (the CPU kernels' build, compiling).

Multi-host (one process per host, each running the same command): `--multihost`, with
T5X train's `--coordinator_address`, `--process_count`, `--process_index` where JAX does
not find them (multihost.py). The processes' settings are compared before decoding, each
feeds its rows of every batch, and process 0 alone writes (docs/t5x.md, "Several hosts").

Gin files and their includes are found relative to the current directory or
--gin_search_paths, as T5X finds them: run from the repository root. The batch loop and
the chunk files are in infer_run.py, the jsonl lines and metrics.json in infer_output.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import sys
from typing import Any, Dict, List, Optional, Sequence

import gin
import jax
import seqio
from tqdm import tqdm

from specdec_t5x.integration import (gin_checks, infer_checks, infer_output, multihost,
                                     run_dir, tasks, vocab_check)
from specdec_t5x.integration.infer_run import (BatchRunner, ChunkStore, examples_sha256,
                                               load_examples, target_alone)

MODES = infer_checks.MODES


@infer_checks.checked_first
@run_dir.holds_output_dir_lock
def infer(*, mode: str, model: Any, dataset_cfg: Any, restore_checkpoint_cfg: Any,
          output_dir: str, partitioner: Any = None, checkpoint_period: int = 100,
          shard_id: int = 0, num_shards: int = 1, allow_truncation: bool = True,
          num_examples: Optional[int] = None, decode_seed: int = 0,
          fallback_init_rng: Optional[int] = None, task_vocab_path: Optional[str] = None,
          task_data_dir: Optional[str] = None, tfds_data_dir: Optional[str] = None,
          preempt_after_batches: Optional[int] = None,
          compare_baseline: bool = False, overwrite: bool = False) -> Dict[str, Any]:
  """Decodes a seqio task with `model` and writes predictions and metrics (see module doc).

  Args:
    mode: 'predict' or 'predict_with_aux' (both write per-example statistics as "aux").
    model: a models.SpeculativeEncoderDecoderModel (no draft = autoregressive baseline).
    dataset_cfg: utils.DatasetConfig (task, split, lengths, batch_size, module).
    restore_checkpoint_cfg: utils.RestoreCheckpointConfig of the target (path, dtype).
    output_dir: where config.gin, the jsonl, metrics.json and the chunk files go.
    partitioner: partitioning.PjitPartitioner to shard params and batches, or None.
    checkpoint_period: batches per chunk (results made durable after each chunk).
    shard_id, num_shards: this job's share of the examples (every num_shards-th).
    allow_truncation: cut inputs longer than task_feature_lengths['inputs'] (as T5X's
      infer always does; metrics.json counts the inputs that reach the limit as
      `inputs_at_length_limit`); False: raise on the first such input.
    num_examples: decode only the first this many examples (None: all).
    decode_seed: base PRNG seed; batch i uses fold_in(fold_in(seed, shard_id), i).
    fallback_init_rng: with a None checkpoint path, initialise randomly from this seed.
    task_vocab_path, task_data_dir, tfds_data_dir: if any is set, re-register the project
      tasks with them (tasks.register_tasks).
    preempt_after_batches: testing aid; raise after this many batches of this run.
    compare_baseline: also decode every batch autoregressively with the target alone,
      in the same process, chunk by chunk: a chunk's batches by one decode, then by the
      other, the first one in turn (each runs warm as when run alone), write
      `{task}-{mode}-baseline.jsonl...` (chunked and resumable like the main file), and
      report its metrics and the walltime speedup: pooled (total baseline / total
      speculative seconds) with a bootstrap interval, and the median and quartiles of the
      per-batch ratios (timing.paired_speedup), over the batches that compile in
      neither run (the first of each input shape).
    overwrite: replace what output_dir holds for this task and shard when it was made
      with other settings (otherwise refused, finished or not). A run with the same
      settings is never discarded: it resumes, or, finished, is returned undecoded (and
      its summary reprinted, saying so).

  Every argument is checked first (infer_checks: checkpoint_period >= 1, 0 <= shard_id <
  num_shards, lengths >= 1, output_dir a directory or absent, gamma <= the decode length,
  topk <= the vocabulary, ...): a ValueError names the setting, value and rule before
  anything is read or written. Then output_dir is locked (run_dir.DirLock) while this
  runs: a second runner fails at once naming the holder. The run's identity (recorded in
  metrics.json as `run_settings`) includes its inputs: the number and a SHA-256 of the
  examples read for this shard, so a finished run is reused, and an unfinished one
  resumed, only for the same examples.

  Returns:
    The metrics dict also written to metrics.json.
  """
  if task_vocab_path or task_data_dir or tfds_data_dir:
    tasks.register_tasks(task_vocab_path, task_data_dir, tfds_data_dir=tfds_data_dir)
  if getattr(dataset_cfg, 'module', None):
    importlib.import_module(dataset_cfg.module)
  name = dataset_cfg.mixture_or_task_name
  if name not in seqio.TaskRegistry.names():
    raise ValueError(f'Unknown task {name!r} (MIXTURE_OR_TASK_NAME). Registered tasks: '
                     f'{sorted(seqio.TaskRegistry.names())}.')
  task = seqio.get_mixture_or_task(name)
  vocab = task.output_features['targets'].vocabulary
  model.check_task_vocabulary(vocab)
  vocab_check.check_checkpoints_vocabulary(vocab, {
      'TARGET_CHECKPOINT': restore_checkpoint_cfg.path,
      'DRAFT_CHECKPOINT': model.draft_checkpoint if model.is_speculative else None})
  model.check_checkpoints(restore_checkpoint_cfg.path, fallback_init_rng)

  os.makedirs(output_dir, exist_ok=True)
  examples = load_examples(name, dataset_cfg, allow_truncation=allow_truncation,
                           num_examples=num_examples, shard_id=shard_id,
                           num_shards=num_shards)
  lengths = dict(dataset_cfg.task_feature_lengths)
  max_len = int(model.max_decode_length or lengths['targets'])
  batch_size, period = int(dataset_cfg.batch_size), int(checkpoint_period)
  num_batches = -(-len(examples) // batch_size)
  num_chunks = -(-num_batches // period)
  with_baseline = bool(compare_baseline and model.is_speculative)
  settings = dict(model.describe(), target_checkpoint=restore_checkpoint_cfg.path,
                  restore_dtype=restore_checkpoint_cfg.dtype, max_decode_length=max_len,
                  fallback_init_rng=fallback_init_rng)
  fingerprint = dict(settings, task=name, split=dataset_cfg.split, lengths=lengths,
                     batch_size=batch_size, checkpoint_period=period, shard_id=shard_id,
                     num_shards=num_shards, num_examples=len(examples),
                     examples_sha256=examples_sha256(examples), mode=mode,
                     decode_seed=decode_seed, allow_truncation=allow_truncation,
                     compare_baseline=with_baseline)
  output_fname = f'{name}-{mode}.jsonl-{shard_id:05}-of-{num_shards:05}'
  metrics_name = 'metrics.json' if num_shards == 1 else (
      f'metrics-{shard_id:05}-of-{num_shards:05}.json')
  # Processes given other settings (gin, checkpoints, inputs) are refused before decoding.
  multihost.check_same_settings(dict(fingerprint, output_dir=output_dir,
                                     gin=gin.config_str()))
  tmp_name = f'tmp-{name}-{shard_id:05}-of-{num_shards:05}'
  base_tmp_name = f'tmp-{name}-baseline-{shard_id:05}'
  first = jax.process_index() == 0
  store = base_store = None

  def decide():  # Process 0 alone reads and tidies output_dir (the others write nothing).
    nonlocal store, base_store
    finished = run_dir.finished_run(output_dir, metrics_name, fingerprint, overwrite,
                                    tmp_dirs=(tmp_name, base_tmp_name))
    if finished is not None:
      return finished, []
    store = ChunkStore(os.path.join(output_dir, tmp_name), output_fname, fingerprint)
    if with_baseline:
      base_store = ChunkStore(os.path.join(output_dir, base_tmp_name), base_fname,
                              fingerprint)
    return None, [c for c in range(num_chunks)
                  if not store.done(c) or (base_store is not None and not base_store.done(c))]

  base_fname = output_fname.replace(f'{mode}.jsonl', f'{mode}-baseline.jsonl')
  finished, todo = multihost.from_first_process(decide, num_chunks)
  if finished is not None:  # Same settings, already done: nothing to decode.
    if first:
      infer_output.print_summary(finished, output_dir, metrics_name, reused=True)
    return finished if first else {}
  base_model = target_alone(model) if with_baseline else None  # run batch by batch
  if shard_id == 0 and first:  # Only once the settings are known good.
    run_dir.write_atomic(os.path.join(output_dir, 'config.gin'), gin.config_str())
  resumed = num_chunks - len(todo)

  if todo:
    # First use builds the kernels (even restoring a draft may trace them): say so first.
    infer_output.build_cpu_kernels(model.decode_config.cpu_kernels)
    params = model.restore_target(restore_checkpoint_cfg.path, restore_checkpoint_cfg.dtype,
                                  fallback_init_rng)
    model.restore_draft(restore_checkpoint_cfg.dtype, fallback_init_rng)
    place = partitioner.shard_params if partitioner is not None else jax.device_put
    params = place(params)
    if model.is_speculative:
      model.draft_params = place(model.draft_params)
    rng = jax.random.fold_in(jax.random.PRNGKey(decode_seed), shard_id)
    runner = BatchRunner(model, params, partitioner, vocab, lengths['inputs'], max_len, rng)
    base_runner = base_model and BatchRunner(base_model, params, partitioner, vocab,
                                             lengths['inputs'], max_len, rng)
    programs = 'speculative and baseline decode programs' if base_runner else 'decode program'
    infer_output.note(f'compiling the {programs} (at the first batch of each input length)...')
    bar = tqdm(total=num_batches, initial=resumed * period, desc=name, unit='batch')
    for chunk in todo:
      lines: List[str] = []
      base_lines: List[str] = []
      info: Dict[str, Any] = {}
      base_info: Dict[str, Any] = {}
      batches = range(chunk * period, min((chunk + 1) * period, num_batches))

      def speculative():
        for b in batches:
          if preempt_after_batches is not None and runner.batches_run >= preempt_after_batches:
            raise RuntimeError(f'Simulated preemption after {runner.batches_run} batches.')
          lines.extend(runner.run(b, examples[b * batch_size:(b + 1) * batch_size], info))
          bar.update(1)

      def baseline():
        for b in batches:
          base_lines.extend(base_runner.run(b, examples[b * batch_size:(b + 1) * batch_size],
                                            base_info))
      # With a baseline, the two decode a chunk's batches one after the other, first one
      # then the other, in turn (ABBA): both see the same machine load, each runs warm as
      # a run of it alone does, and neither always goes first. Alternating batch by batch
      # evicts each decode's weights and programs from the caches for the other's (the
      # demo's speculative decode measured ~15% slower that way, its baseline ~4%).
      order = [speculative, baseline] if base_runner else [speculative]
      for decode in order[::-1] if chunk % 2 else order:
        decode()
      if first:
        if base_store is not None:
          base_store.write(chunk, base_lines, base_info)
        store.write(chunk, lines, info)
    bar.close()
  if not first:
    return {}

  output_path = os.path.join(output_dir, output_fname)
  store.assemble(num_chunks, output_path)
  total = store.total(num_chunks)
  at_limit = sum(len(ex['inputs']) >= lengths['inputs'] for ex in examples)
  metrics = infer_output.run_metrics(task, output_path, total, settings,
                                     resumed_chunks=resumed, num_examples=len(examples),
                                     batch_size=batch_size,
                                     inputs_at_length_limit=int(at_limit))
  metrics['decode_seed'] = decode_seed
  metrics['run_settings'] = fingerprint  # checked by the next run in this output_dir
  if getattr(model, 'gamma_choice', None):  # gamma='auto': what was measured and chosen
    metrics['gamma_choice'] = model.gamma_choice
  if base_store is not None:
    base_path = os.path.join(output_dir, base_fname)
    base_store.assemble(num_chunks, base_path)
    # Batch by batch, over the batches that compiled in neither run (same inputs).
    infer_output.add_baseline(metrics, task, base_path, base_store.total(num_chunks), total)
  # metrics.json first: a kill before the tmp dirs are gone leaves a finished run (the
  # rerun returns it), never a run without its chunks.
  run_dir.write_atomic(os.path.join(output_dir, metrics_name), json.dumps(metrics, indent=1))
  for tmp_store in (base_store, store):
    if tmp_store is not None:
      shutil.rmtree(tmp_store.tmp_dir, ignore_errors=True)
  infer_output.print_summary(metrics, output_dir, metrics_name)
  return metrics


_MISSING_MACRO = (re.compile(r"(\w+)/macro\.value set to `%gin\.REQUIRED`"),
                  re.compile(r"No bindings specified for '(\w+)/gin\.macro'"))


def rewrite_gin_args(argv: Sequence[str]) -> List[str]:
  """`--gin.NAME=VALUE` -> `--gin_bindings=NAME = VALUE` (as T5X's gin_utils)."""
  out = []
  for arg in argv:
    if arg.startswith('--gin.'):
      if '=' not in arg:
        raise ValueError(f"Gin bindings must look like '--gin.NAME=VALUE', got {arg!r}.")
      name, value = arg[len('--gin.'):].split('=', 1)
      arg = f'--gin_bindings={name} = {value}'
    out.append(arg)
  return out


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
              search_paths: Sequence[str] = ('.',)) -> Any:
  """Clears gin, parses files then bindings, and returns the gin-configurable `infer`
  that the files bind as `infer_script.infer`.

  Files and their includes are looked up as T5X's gin_utils does: as given (relative to
  the current directory), then under each of `search_paths`."""
  # Gin files say `import __main__ as infer_script`; when this runs inside another program
  # (tests, notebooks) expose this module's `infer` there, as running the script does.
  main_module = sys.modules['__main__']
  if main_module is not sys.modules[__name__]:
    main_module.infer = infer
  gin.clear_config()
  infer_using_gin = gin.configurable(main_module.infer)
  roots = [p for p in search_paths if p]
  for path in roots:
    gin.add_config_file_search_path(path)
  gin_checks.check_macro_bindings(gin_bindings, gin_checks.defined_macros(gin_files, roots))
  gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                      finalize_config=True)
  return infer_using_gin


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """Parses T5X-style flags and gin, then runs the gin-configured `infer`."""
  parser = argparse.ArgumentParser(prog='python -m specdec_t5x.infer', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--gin_file', action='append', default=[], help='gin file(s), in order')
  parser.add_argument('--gin_bindings', action='append', default=[], help='one gin binding')
  parser.add_argument('--gin_search_paths', default='.',
                      help='comma-separated prefixes for gin files and includes')
  parser.add_argument('--tfds_data_dir', default=None, help='TFDS data dir override')
  parser.add_argument('--shard_id', type=int, default=None, help='overrides infer.shard_id')
  parser.add_argument('--multihost', action='store_true',
                      help='join the other processes first (jax.distributed; one process '
                      'per host, every one running this same command)')
  parser.add_argument('--coordinator_address', default=None,
                      help="with --multihost: process 0's HOST:PORT (default: detected)")
  parser.add_argument('--process_count', type=int, default=None,
                      help='with --multihost: the number of processes (default: detected)')
  parser.add_argument('--process_index', type=int, default=None,
                      help="with --multihost: this process's index (default: detected)")
  args = parser.parse_args(rewrite_gin_args(sys.argv[1:] if argv is None else argv))
  given = [f'--{k}' for k in ('coordinator_address', 'process_count', 'process_index')
           if getattr(args, k) is not None]
  if given and not args.multihost:
    parser.error(f'{", ".join(given)} take effect with --multihost only: add it.')
  if args.multihost:
    multihost.initialize(args.coordinator_address, args.process_count, args.process_index)
  if args.tfds_data_dir:
    seqio.set_tfds_data_dir_override(args.tfds_data_dir)
  try:
    infer_using_gin = parse_gin(args.gin_file, args.gin_bindings,
                                args.gin_search_paths.split(','))
    kwargs = {} if args.shard_id is None else {'shard_id': args.shard_id}
    return infer_using_gin(**kwargs)
  except ValueError as e:
    for pattern in _MISSING_MACRO:
      match = pattern.search(str(e))
      if match:
        macro = match.group(1)
        raise ValueError(f'Gin macro {macro} is required but not set: pass '
                         f'--gin.{macro}=VALUE (required macros are listed at the top of '
                         'configs/runs/infer.gin).') from e
    raise


if __name__ == '__main__':
  main()
