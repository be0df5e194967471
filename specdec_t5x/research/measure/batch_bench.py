"""Batched throughput: speculative (demo_target + demo_draft_m, greedy) vs AR at batch 1..64.

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py \
      --experiment=batch_throughput [--batches=1,4,16,64] [--gammas=2,4] [--max_len=32] \
      [--task=ende] [--repeats=2]

Takes the demo checkpoints (checkpoints/demo/) and data/demo/{task}_test.tsv; prints one
line per (batch, method) and writes results/batch_throughput.{json,md,png}: tokens/s
(generated tokens / wall seconds, median of `repeats` interleaved after compilation), alpha and
tokens per target call, and whether every row of a batch equals its batch-1 output
(temperature 0).
"""

from __future__ import annotations

import json
from typing import List

from specdec_t5x.research.measure import demo_data, evaluation, measurement, speed
from specdec_t5x.research.results import harness

COST_MODEL = (
    'A speculative step costs gamma draft calls plus one target call over gamma + 1 '
    'positions, and emits E = (1 - a^(gamma+1)) / (1 - a) tokens per row. At batch 1 '
    'on CPU a target call is dominated by fixed per-call overhead and weight reads, '
    'so verifying gamma + 1 positions costs about one step and the speedup is '
    'E / (gamma c + 1). As the batch grows the call becomes compute bound: the '
    'verification does batch x (gamma + 1) token-positions of work where AR does '
    'batch, so its cost grows ~ (gamma + 1) x while AR amortises the overhead over '
    'the batch. Once batch x (gamma + 1) saturates the 2 CPU cores, speculative '
    'tokens/s ~ E / ((gamma + 1) + gamma c_b) of AR, below 1 whenever '
    'E < gamma + 1, i.e. always for a < 1; and the loop runs until the slowest row '
    'finishes, with every row paying for the widest draft. Rejected drafts are pure '
    'waste there. The table shows where that crossover lies for this model pair.')


def measure(args, script: str) -> dict:
  """The throughput rows of every (batch, method), each printed as it comes."""
  batches = harness.ints(args.batches)
  target, draft = evaluation.load_model('demo_target'), evaluation.load_model('demo_draft_m')
  enc, _, _ = demo_data.load_task(args.task, max(batches))
  rows = speed.batch_throughput(target, draft, enc, batches, harness.ints(args.gammas),
                                args.max_len, args.repeats,
                                report=lambda row: print(json.dumps(row), flush=True))
  return dict(task=args.task, max_len=args.max_len, rows=rows)


def render(report: harness.Report) -> List[str]:
  args = report['args']
  return report.header(
      'Batched throughput: speculative vs autoregressive',
      f"demo_target + demo_draft_m, greedy, task {args['task']}, max_decode_length "
      f"{args['max_len']}, median of {args['repeats']} interleaved repeats after "
      'compilation.') + demo_data.throughput_table(report['rows']) + [
          '', '## Where speculation stops paying (cost model)', '', COST_MODEL]


def plot(report: harness.Report) -> None:
  plt = harness.pyplot()
  if plt is not None:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    demo_data.throughput_plot(ax, report['rows'])
    report.save_figure(fig, dpi=120)


main = measurement.Measurement(
    'batch_throughput', __doc__, measure, render, repeats=2, after=plot, prints=False,
    flags=dict(batches='1,4,16,64', gammas='2,4', max_len=32, task='ende')).main
