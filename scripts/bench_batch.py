"""Batched throughput: speculative (demo_target + demo_draft_m, greedy) vs AR at batch 1..64.

  flock /tmp/specdec_bench.lock python scripts/bench_batch.py [--batches=1,4,16,64] \
      [--gammas=2,4] [--max_len=32] [--task=ende] [--repeats=2]

Takes the demo checkpoints (checkpoints/demo/) and data/demo/{task}_test.tsv; prints one
line per (batch, method) and writes results/batch_throughput.{json,md,png}: tokens/s
(generated tokens / wall seconds, median of `repeats` interleaved after compilation), alpha and
tokens per target call, and whether every row of a batch equals its batch-1 output
(temperature 0). Also holds the demo loaders the other result scripts import.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from specdec_t5x.algorithm import batching, stats, timing  # noqa: E402
from specdec_t5x.research import benchmarking, evaluation  # noqa: E402

DEMO = os.path.join(REPO, 'checkpoints', 'demo')


def load_demo(name: str):
  """-> (Transformer, float32 params) of checkpoints/demo/<name>."""
  return evaluation.load_model(name)


def load_task(task: str, num: int, input_len: int = 128):
  """-> (encoder inputs [num, input_len] int32, reference strings, the SentencePiece model)."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  examples = evaluation.load_examples(task, num, max_input_len=input_len)
  sp = spm.SentencePieceProcessor(model_file=evaluation.DEMO_VOCAB)
  return (batching.pad_batch([e.inputs for e in examples], input_len),
          [e.reference for e in examples], sp)


def decode_text(sp, tokens) -> List[str]:
  out = []
  for row in np.asarray(tokens).tolist():
    row = row[:row.index(1)] if 1 in row else row
    out.append(sp.decode([t for t in row if 1 < t < sp.get_piece_size()]))  # ids past the SPM vocab (padding) dropped
  return out


def timed(fn, repeats: int):
  """Compiles (first call), then -> (median seconds, last output)."""
  timing.block(fn())  # compile
  times = []
  for _ in range(repeats):
    times.append(timing.wall(fn))
  return statistics.median(times), timing.block(fn())


summarize_stats = stats.summarize  # the other result scripts import it here


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--batches', default='1,4,16,64')
  ap.add_argument('--gammas', default='2,4')
  ap.add_argument('--max_len', type=int, default=32)
  ap.add_argument('--task', default='ende')
  ap.add_argument('--repeats', type=int, default=2)
  ap.add_argument('--out', default=os.path.join(REPO, 'results', 'batch_throughput'))
  args = ap.parse_args(argv)
  batches = [int(b) for b in args.batches.split(',')]
  gammas = [int(g) for g in args.gammas.split(',')]
  target, draft = load_demo('demo_target'), load_demo('demo_draft_m')
  enc, _, _ = load_task(args.task, max(batches))
  methods = [('ar', None)] + [(f'spec_g{g}', g) for g in gammas]
  rows = evaluation.batch_throughput(target, draft, enc, batches, gammas, args.max_len,
                                     args.repeats,
                                     report=lambda row: print(json.dumps(row), flush=True))
  data = {'command': 'python scripts/bench_batch.py ' + ' '.join(argv or sys.argv[1:]),
          'task': args.task, 'max_len': args.max_len, 'environment': benchmarking.environment(),
          'rows': rows}
  benchmarking.write_json(args.out + '.json', data)
  lines = ['# Batched throughput: speculative vs autoregressive (CPU)', '',
           f'`{data["command"]}` — demo_target + demo_draft_m, greedy, task {args.task}, '
           f'max_decode_length {args.max_len}, median of {args.repeats} after compilation.', '',
           '| batch | method | tokens/s | speedup vs AR | alpha | tokens/call | rows == batch-1 |',
           '|---:|---|---:|---:|---:|---:|---|']
  for r in rows:
    alpha = '-' if r['alpha_empirical'] is None else f"{r['alpha_empirical']:.2f}"
    lines.append(f"| {r['batch']} | {r['method']} | {r['tokens_per_s']:.1f} | "
                 f"{r['speedup_vs_ar']:.2f} | {alpha} | {r['mean_tokens_per_target_call']:.2f} | "
                 f"{r['rows_equal_batch1']} ({r['rows_checked']} rows) |")
  lines += ['', '## Where speculation stops paying (cost model)', '',
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
            'waste there. The table shows where that crossover lies for this model pair.']
  benchmarking.write_text(args.out + '.md', '\n'.join(lines) + '\n')
  try:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, _ in methods:
      pts = [(r['batch'], r['tokens_per_s']) for r in rows if r['method'] == method]
      ax.plot(*zip(*pts), marker='o', label=method)
    ax.set_xscale('log', base=2); ax.set_yscale('log')
    ax.set_xlabel('batch'); ax.set_ylabel('tokens/s'); ax.legend(); ax.grid(alpha=0.3)
    fig.tight_layout(); fig.savefig(args.out + '.png', dpi=120)
  except ImportError:
    pass


if __name__ == '__main__':
  main()
