"""What the inference runner writes and prints (integration/infer.py): one jsonl line per
example, the task's metrics over the final file, metrics.json's contents (speculative and
baseline), the summary it prints and its notes on a first run's pauses."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, Mapping, Optional

import jax
import numpy as np

from specdec_t5x.algorithm import stats, timing
from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.integration import run_dir

PER_BATCH = 'warm_batch_seconds'  # [[batch index, seconds], ...] of batches not compiling


def _text(value: Any) -> Any:
  return value.decode('utf-8') if isinstance(value, bytes) else value


def json_line(example: Mapping[str, Any], prediction: str, aux: Mapping[str, int]) -> str:
  """{"inputs": {..._pretokenized}, "prediction": text, "aux": per-example stats}."""
  inputs = {k: _text(v) for k, v in example.items() if k.endswith('_pretokenized')}
  return json.dumps({'inputs': inputs, 'prediction': prediction, 'aux': dict(aux)},
                    ensure_ascii=False)


def decode_text(vocab: Any, tokens: np.ndarray, eos_id: int) -> str:
  """A decoded row as text: cut at the first EOS, padding (id 0) dropped."""
  ids = [int(t) for t in tokens]
  ids = ids[:ids.index(eos_id)] if eos_id in ids else ids
  return _text(vocab.decode([t for t in ids if t != 0]))


def task_metrics(task: Any, output_path: str) -> Optional[Dict[str, float]]:
  """The task's metric fns on (targets, predictions) of the final file, if targets exist."""
  with open(output_path, encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  if not rows or not all('targets_pretokenized' in r['inputs'] for r in rows):
    return None
  targets = [task.postprocess_fn(r['inputs']['targets_pretokenized'], example=r['inputs'],
                                 is_target=True) for r in rows]
  preds = [task.postprocess_fn(r['prediction'], example=r['inputs'], is_target=False)
           for r in rows]
  scores: Dict[str, float] = {}
  for fn in getattr(task, 'predict_metric_fns', task.metric_fns):
    scores.update({k: float(v) for k, v in fn(targets, preds).items()})
  return scores


def run_metrics(task: Any, output_path: str, total: Dict[str, Any],
                settings: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
  """metrics.json of a finished run: task metrics, timing, acceptance statistics
  (stats.summarize of the summed chunks), settings, git revision and devices (all
  processes' in a multi-host run, with `num_processes`)."""
  devices = jax.devices()
  seconds, warm_seconds = total.get('seconds', 0.0), total.get('warm_seconds', 0.0)
  return {
      'task': task.name, 'predictions_file': os.path.basename(output_path),
      'metrics': task_metrics(task, output_path), **extra, 'wall_seconds': seconds,
      'tokens_per_second': total.get('generated_tokens', 0) / seconds if seconds else None,
      'tokens_per_second_excluding_first_batch': (
          total.get('warm_tokens', 0) / warm_seconds if warm_seconds else None),
      **stats.summarize(total), **settings, 'git_revision': run_dir.git_revision(),
      'device_kind': devices[0].device_kind, 'platform': devices[0].platform,
      'num_devices': len(devices),
      **({'num_processes': jax.process_count()} if jax.process_count() > 1 else {}),
  }


def add_baseline(metrics: Dict[str, Any], task: Any, base_path: str,
                 base: Dict[str, Any], total: Dict[str, Any]) -> None:
  """Adds the baseline's metrics and the walltime speedup to `metrics`.

  The speedup is timing.paired_speedup over the batches that compiled in neither run
  (their PER_BATCH timings in the summed chunk statistics `base` and `total`, of the
  baseline and the speculative run)."""
  warm = base.get('warm_seconds', 0.0)
  metrics['baseline'] = {
      'predictions_file': os.path.basename(base_path),
      'metrics': task_metrics(task, base_path),
      'wall_seconds': base.get('seconds', 0.0), 'warm_seconds': warm,
      'tokens_per_second': base.get('warm_tokens', 0) / warm if warm else None,
      **stats.summarize(base)}
  spec_s = {int(b): t for b, t in total.get(PER_BATCH, [])}
  base_s = {int(b): t for b, t in base.get(PER_BATCH, [])}
  paired = sorted(set(spec_s) & set(base_s))
  speed = timing.paired_speedup([base_s[b] for b in paired], [spec_s[b] for b in paired])
  metrics['walltime_speedup'] = speed['pooled']
  metrics['walltime_speedup_stats'] = speed


def note(message: str, end: str = '\n') -> None:
  """A line on what the runner is doing, not a result: to stderr, beside the progress
  bar (results go to stdout); process 0 only."""
  if jax.process_index() == 0:
    print(message, end=end, file=sys.stderr, flush=True)


def build_cpu_kernels(mode: str) -> None:
  """Builds the CPU decode kernels now, saying so, when decoding in kernel mode `mode`
  would (modes.needs_build: the first run after an install or an upgrade)."""
  if not modes.needs_build(mode):
    return
  note('building the CPU decode kernels (once, ~5 s)...', end='')
  tick = time.perf_counter()
  built = modes.enabled(mode)  # a failure is logged once, with its reason
  note(f' done ({time.perf_counter() - tick:.1f} s)' if built else " failed: XLA's ops are used")


def _arithmetic(m: Mapping[str, Any]) -> str:
  """' (bfloat16, CPU kernels packed_bf16)': the weights' dtype the two decodes compared in,
  and on the CPU the kernel mode ('' where metrics.json does not say)."""
  dtype = (m.get('target_config') or {}).get('dtype')
  if not dtype:
    return ''
  kernels = m.get('cpu_kernels') if m.get('platform') == 'cpu' else None
  return f" ({dtype}" + (f', CPU kernels {kernels}' if kernels else '') + ')'


def print_summary(m: Mapping[str, Any], output_dir: str, metrics_name: str = 'metrics.json',
                  reused: bool = False) -> None:
  """The run's few lines on stdout: quality, acceptance and (with a baseline) speed, and
  where the files are; for a finished run `reused` (nothing decoded), that it was, and how
  to decode again."""
  def fmt(scores):
    return ', '.join(f'{k} {v:.2f}' for k, v in scores.items()) if scores else 'no targets'
  if reused:
    when = time.strftime('%Y-%m-%d %H:%M', time.localtime(
        os.path.getmtime(os.path.join(output_dir, metrics_name))))
    print(f'reused the run finished in {output_dir} at {when} (same settings and inputs; '
          'nothing decoded):')
  speculative, base = m.get('speculative', True), m.get('baseline')
  print(f"{m['task']}: {'speculative' if speculative else 'autoregressive'} "
        f"[{fmt(m.get('metrics'))}]" + (f" vs baseline [{fmt(base['metrics'])}]" if base else ''))
  if speculative:
    choice = m.get('gamma_choice')
    gamma = (f"{choice['gamma']} (auto: alpha {choice['alpha']:.2f}, c {choice['c']:.2f})"
             if choice else m.get('gamma'))
    print(f"alpha {m.get('alpha') or 0:.3f}, acceptance rate "
          f"{m.get('acceptance_rate') or 0:.3f}, "
          f"{m.get('mean_tokens_per_target_call') or 0:.2f} tokens per target call, gamma "
          f"{gamma}")
  if base:
    print(f"walltime speedup {timing.format_speedup(m.get('walltime_speedup_stats'))}"
          + _arithmetic(m))
  files = [metrics_name, 'config.gin', m['predictions_file']] + (
      [base['predictions_file']] if base else [])
  files = [f for f in files if os.path.isfile(os.path.join(output_dir, f))]
  print(f"outputs in {output_dir}: {', '.join(files)}")
  if reused:
    print(f'to decode again: delete {output_dir} (or its {metrics_name}), or pass another '
          '--gin.INFER_OUTPUT_DIR')
