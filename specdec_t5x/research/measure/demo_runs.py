"""The README's first command, run fresh several times: what each run prints.

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=demo_runs \
      [--runs=3] [--env KEY=VALUE]
  # another demo file: results/demo_draft_m_runs.{json,md}
  python scripts/compare_decodes.py --experiment=demo_runs \
      --gin_file configs/demo_draft_m.gin --out results/demo_draft_m_runs

Run from the repository root on an idle machine. Each run is a new process,
`python -m specdec_t5x.infer --gin_file=configs/demo.gin` (or --gin_file) into an empty
output directory (compilation included, as a new user sees it). Records the three lines it
prints, its metrics (speedup with interval, alpha, BLEU of both runs) and whether the
speculative and baseline prediction files hold the same predictions, in
results/demo_speedup_runs.{json,md} (or --out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from specdec_t5x.research.measure import measurement
from specdec_t5x.research.results import harness

PREFIXES = ('demo_ende:', 'alpha ', 'walltime speedup')
COMMAND = [sys.executable, '-m', 'specdec_t5x.infer']


def predictions(path: str):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line)['prediction'] for line in f]


def one_run(env, gin_file: str) -> dict:
  with tempfile.TemporaryDirectory() as out:
    command = COMMAND + [f'--gin_file={gin_file}', f"--gin.INFER_OUTPUT_DIR='{out}'"]
    proc = subprocess.run(command, env=env, text=True,
                          capture_output=True, check=False)
    if proc.returncode:
      raise RuntimeError(f'the demo command failed:\n{proc.stderr[-3000:]}')
    printed = [line for line in proc.stdout.splitlines() if line.startswith(PREFIXES)]
    with open(os.path.join(out, 'metrics.json'), encoding='utf-8') as f:
      metrics = json.load(f)
    spec = predictions(os.path.join(out, metrics['predictions_file']))
    base = predictions(os.path.join(out, metrics['baseline']['predictions_file']))
  return dict(printed=printed, walltime_speedup_stats=metrics['walltime_speedup_stats'],
              alpha=metrics['alpha'], acceptance_rate=metrics['acceptance_rate'],
              mean_tokens_per_target_call=metrics['mean_tokens_per_target_call'],
              bleu=metrics['metrics'], baseline_bleu=metrics['baseline']['metrics'],
              identical_predictions=spec == base, num_predictions=len(spec),
              git_revision=metrics['git_revision'])


def run(args, script: str) -> Dict[str, Any]:
  """--runs fresh runs of the demo command, each printed as it ends."""
  env = dict(os.environ, **dict(kv.split('=', 1) for kv in args.env))
  runs = []
  for i in range(args.runs):
    runs.append(one_run(env, args.gin_file))
    print(i + 1, *runs[-1]['printed'], f"identical: {runs[-1]['identical_predictions']}",
          sep='\n', flush=True)
  return dict(demo_command=' '.join(['python'] + COMMAND[1:] + [f'--gin_file={args.gin_file}']),
              runs=runs)


def render(report: harness.Report) -> List[str]:
  args, runs = report['args'], report['runs']
  pooled = [r['walltime_speedup_stats']['pooled'] for r in runs]
  return report.header(
      'The demo command, fresh runs',
      f"`{report['demo_command']}`, {args['runs']} fresh processes one after another "
      f"(environment overrides: {args['env'] or 'none'}). Pooled speedups "
      f'{min(pooled):.2f}-{max(pooled):.2f}x.') + harness.table(
          ['run', 'printed speedup line', 'alpha', 'acceptance rate', 'BLEU spec / base',
           'identical predictions'],
          [[i + 1, f"`{r['printed'][-1]}`", f"{r['alpha']:.3f}", f"{r['acceptance_rate']:.3f}",
            f"{r['bleu']['bleu']:.2f} / {r['baseline_bleu']['bleu']:.2f}",
            f"{r['identical_predictions']} ({r['num_predictions']})"]
           for i, r in enumerate(runs)], 'rlllll') + [
      '', 'The speedup is the pooled ratio (total autoregressive seconds / total speculative '
      'seconds over the batches, the two decodes taking turns chunk by chunk) with a bootstrap '
      '95% interval, '
      'and the median and IQR of the per-batch ratios; batches that compile a new length '
      'bucket are left out (timing.paired_speedup).']


main = measurement.Measurement('demo_speedup_runs', __doc__, run, render, prints=False,
                               flags=dict(runs=dict(type=int, default=3),
                                          gin_file='configs/demo.gin',
                                          env=dict(action='append', default=[],
                                                   help='KEY=VALUE set for the runs (e.g. '
                                                   'SPECDEC_CPU_KERNELS=0)'))).main
