r"""Writes a distillation corpus: the target's greedy outputs as the new targets.

  python scripts/distill_data.py --target checkpoints/demo/demo_target \
      --data data/corpus/npz --out data/corpus/distill_npz --batch_size 1024

reads every `{task}_{split}.npz` of --data and writes the same files to --out, with
`inputs` unchanged and `targets` replaced by the target model's greedy decode (same
width, EOS kept, 0-padded). Training a draft on them (`scripts/train.py --init_from`)
is sequence-level knowledge distillation: the draft learns the target's own mode, which
is the quantity alpha measures. Prints one JSON line per file (rows, seconds, mean length).
The feature head demo_feature_head_kd trained on a subset (2 CPU cores, ~33 min):

  python scripts/distill_data.py --target checkpoints/demo/demo_target \
      --out data/corpus/distill_npz --splits train --max_rows ende=36000,summarize=12000
  python scripts/distill_data.py --target checkpoints/demo/demo_target \
      --out data/corpus/distill_npz --splits validation --max_rows 1024
"""

import argparse
import glob
import io
import json
import os
import time

import numpy as np

from specdec_t5x.algorithm import network
from specdec_t5x.integration import model_dir, run_dir
from specdec_t5x.research.train import distill
from specdec_t5x.research.results import harness


def _max_rows(text: str) -> dict:
  """'N' -> {None: N} (every file); 'task=N,...' -> {task: N}."""
  if '=' not in text:
    return {None: int(text)}
  return harness.pairs(text, int)


def main(argv=None) -> list:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--target', required=True, help='model dir: config.json + checkpoint_*')
  p.add_argument('--data', default='data/corpus/npz')
  p.add_argument('--out', required=True)
  p.add_argument('--splits', default='train,validation')
  p.add_argument('--batch_size', type=int, default=512)
  p.add_argument('--max_rows', type=_max_rows, default={}, help="per file: N, or per task "
                 "'ende=36000,summarize=12000' (a task not named: all); 0 = all")
  p.add_argument('--dtype', default='float32', help='compute dtype, e.g. bfloat16 on GPU')
  p.add_argument('--no_progress', action='store_true')
  args = p.parse_args(argv)
  config, params = model_dir.load(args.target, args.dtype)
  model = network.Transformer(config)
  os.makedirs(args.out, exist_ok=True)
  summaries = []
  for split in args.splits.split(','):
    for path in sorted(glob.glob(os.path.join(args.data, f'*_{split}.npz'))):
      with np.load(path) as z:
        inputs, targets = z['inputs'], z['targets']
      task = os.path.basename(path)[:-len(f'_{split}.npz')]
      rows = args.max_rows.get(task, args.max_rows.get(None, 0))
      if rows:
        inputs, targets = inputs[:rows], targets[:rows]
      t0 = time.time()
      new = distill.distill_targets(model, params, inputs.astype(np.int32),
                                     targets.shape[1], args.batch_size, not args.no_progress)
      out = os.path.join(args.out, os.path.basename(path))
      npz = io.BytesIO()
      np.savez_compressed(npz, inputs=inputs, targets=new)
      run_dir.write_atomic(out, npz.getvalue())
      summaries.append({'file': out, 'rows': len(new), 'seconds': round(time.time() - t0, 1),
                        'mean_len': float((new > 0).sum(1).mean()),
                        'reference_mean_len': float((targets > 0).sum(1).mean()),
                        'with_eos': float((new == 1).any(1).mean())})
      print(json.dumps(summaries[-1]), flush=True)
  return summaries


if __name__ == '__main__':
  main()
