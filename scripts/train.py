r"""Trains T5 v1.1-style demo models with teacher forcing on the pre-tokenised corpus.

  python scripts/train.py --model demo_target --data data/corpus/npz \
      --workdir runs/demo_target --steps 20000 --batch_size 128 --max_seconds 300

prints jax.devices(), the parameter count, a tqdm bar with train/val loss, and a summary
JSON line per model; writes `<workdir>/checkpoint_<step>/` (Orbax: float32 params,
optimizer state and data cursors; the latest two kept), `config.json` and `log.jsonl`
(step, train_loss, val_loss, tokens_per_s, elapsed). Rerunning with the same --workdir
resumes exactly.

Several models, one after another, each with its own budget (one value or one per model):

  python scripts/train.py --model demo_target,demo_draft_m,demo_draft_s \
      --workdir runs/demo --steps auto --max_seconds 240,150,90 \
      --final_export checkpoints/demo

trains into runs/demo/<model>/ and exports bf16 params to
checkpoints/demo/<model>/checkpoint_<step>/ with a config.json (T5Config fields).
`--steps auto` fits the cosine schedule to the time budget. `--init_from DIR` starts a
fresh run from a checkpoint's params (continued training, or fine-tuning a draft on the
distilled data of scripts/distill_data.py).
"""

import argparse
import json
import os

from specdec_t5x.integration import model_dir
from specdec_t5x.research.results import harness
from specdec_t5x.research.train import config as train_config, loop as training


def _value(text: str):
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return text


def _pairs(text: str) -> dict:
  """'a=1,b=x' -> {'a': 1, 'b': 'x'}."""
  return harness.pairs(text, _value)


def _per_model(text: str, n: int, cast) -> list:
  """One value for every model, or a comma list with one value per model."""
  items = [None if v in ('auto', 'none') else cast(v) for v in str(text).split(',')]
  if len(items) not in (1, n):
    raise SystemExit(f'{text!r}: give one value or {n} (one per model)')
  return items * n if len(items) == 1 else items


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--model', required=True, help=f'comma list of {sorted(train_config.PRESETS)}')
  p.add_argument('--data', default='data/corpus/npz', help='dir of {task}_{split}.npz')
  p.add_argument('--workdir', required=True, help='one model: the run dir; several: parent')
  p.add_argument('--steps', default='10000', help="per model; 'auto' fits max_seconds")
  p.add_argument('--max_seconds', default='none', help='time budget per model (seconds)')
  p.add_argument('--batch_size', default='64', help='per model')
  p.add_argument('--learning_rate', default='2e-3', help='peak, per model')
  p.add_argument('--optimizer', default='adamw', choices=['adamw', 'adafactor'])
  p.add_argument('--schedule', default='cosine', choices=['cosine', 'rsqrt'])
  p.add_argument('--warmup_steps', type=int, default=500)
  p.add_argument('--weight_decay', type=float, default=0.01)
  p.add_argument('--z_loss', type=float, default=1e-4)
  p.add_argument('--mixing_rates', default='', help="e.g. 'ende=1,summarize=1'; default: sizes")
  p.add_argument('--dtype', default='float32', help='compute dtype, e.g. bfloat16')
  p.add_argument('--override', default='', help="T5Config fields, e.g. 'layers=4,mlp_dim=1024'")
  p.add_argument('--save_every', type=int, default=1000)
  p.add_argument('--eval_every', type=int, default=500)
  p.add_argument('--log_every', type=int, default=50)
  p.add_argument('--num_val_examples', type=int, default=512, help='per task')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--final_export', default='', help='write bf16 params to DIR/<model>/')
  p.add_argument('--init_from', default='none',
                 help='per model: checkpoint dir (or its parent: the highest step) whose params '
                      'start a fresh run (fine-tuning)')
  p.add_argument('--teacher', default='',
                 help='model dir (config.json + checkpoint_*): token-level KD from its logits')
  p.add_argument('--kd_weight', type=float, default=0.5, help='weight of KL(teacher || model)')
  p.add_argument('--no_progress', action='store_true', help='no tqdm bar')
  p.add_argument('--vocab', default='',
                 help='SentencePiece model the data was tokenized with: recorded as '
                      'vocabulary.json next to the --final_export (checked by infer)')
  p.add_argument('--allow_changed_config', action='store_true',
                 help="resume a workdir although hyperparameters differ from its config.json")
  return p.parse_args(argv)


def main(argv=None) -> list:
  args = parse(argv)
  names = args.model.split(',')
  n = len(names)
  steps, seconds, batch, lr = (
      _per_model(args.steps, n, int), _per_model(args.max_seconds, n, float),
      _per_model(args.batch_size, n, int), _per_model(args.learning_rate, n, float))
  init_from = _per_model(args.init_from, n, str)
  summaries = []
  for i, name in enumerate(names):
    model_cfg = train_config.model_config(name, dtype=args.dtype, **_pairs(args.override))
    cfg = train_config.TrainConfig(
        steps=steps[i], batch_size=batch[i], optimizer=args.optimizer, schedule=args.schedule,
        learning_rate=lr[i], warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
        z_loss=args.z_loss, mixing_rates=_pairs(args.mixing_rates) or None,
        max_seconds=seconds[i], save_every=args.save_every, eval_every=args.eval_every,
        log_every=args.log_every, num_val_examples=args.num_val_examples, seed=args.seed,
        init_from=init_from[i], teacher=args.teacher or None, kd_weight=args.kd_weight)
    workdir = args.workdir if n == 1 else os.path.join(args.workdir, name)
    params, summary = training.train(model_cfg, args.data, workdir, cfg,
                                     progress=not args.no_progress,
                                     allow_changed_config=args.allow_changed_config)
    if args.final_export:
      summary['export'] = model_dir.save(
          params, os.path.join(args.final_export, name), model_cfg, summary['step'],
          vocab_path=args.vocab or None)
    summaries.append({'model': name, 'params': train_config.num_params(params), **summary})
    print(json.dumps(summaries[-1]), flush=True)
  return summaries


if __name__ == '__main__':
  main()
