r"""Trains the demo models: T5 v1.1-style models (teacher forcing on the pre-tokenised corpus)
or, with --head, a feature-reading draft head for a frozen target.

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
distilled data of `scripts/build_data.py distill`).

--head: trains a feature-reading draft head (EAGLE-style) for a frozen target, and exports it.

  # the demo target's head (checkpoints/demo/demo_feature_head; ~75 min on 2 CPU cores):
  python scripts/train.py --head --target checkpoints/demo/demo_target \
      --data data/corpus/npz --workdir runs/demo_feature_head --steps 4000 \
      --mixing_rates ende=3,summarize=1 --export checkpoints/demo/demo_feature_head \
      --vocab data/vocab/demo_spm.model
  # checkpoints/demo/demo_feature_head_4k: logits over the 4096 commonest target ids,
  # fine-tuned from the head above (61 min):
  python scripts/train.py --head --target checkpoints/demo/demo_target \
      --data data/corpus/npz --workdir runs/demo_feature_head_ft --steps 3000 \
      --learning_rate 1e-3 --mixing_rates ende=3,summarize=1 --draft_vocab_size 4096 \
      --init_from checkpoints/demo/demo_feature_head \
      --export checkpoints/demo/demo_feature_head_4k --vocab data/vocab/demo_spm.model
  # checkpoints/demo/demo_feature_head_kd (the draft of configs/demo.gin): that
  # head, 2000 more steps over the target's own greedy outputs (36k EN->DE + 12k
  # summarisation inputs, distilled as `scripts/build_data.py distill` says, ~33 min), every
  # decoder position (58 min):
  python scripts/train.py --head --target checkpoints/demo/demo_target \
      --data data/corpus/distill_npz --workdir runs/demo_feature_head_kd --steps 2000 \
      --learning_rate 1e-3 --max_target_len 0 --mixing_rates ende=3,summarize=1 \
      --draft_vocab_from checkpoints/demo/demo_feature_head_4k \
      --init_from checkpoints/demo/demo_feature_head_4k \
      --export checkpoints/demo/demo_feature_head_kd --vocab data/vocab/demo_spm.model
  # checkpoints/demo/demo_feature_head_fused: that head also reading the target's decoder
  # layers 0 and 2 (EAGLE-3's fusion; their weights start at zero), 1500 more steps (69 min):
  python scripts/train.py --head --target checkpoints/demo/demo_target \
      --data data/corpus/distill_npz --workdir runs/demo_feature_head_fused --steps 1500 \
      --learning_rate 1e-3 --max_target_len 0 --mixing_rates ende=3,summarize=1 \
      --feature_layers 0,2 --eval_every 250 \
      --draft_vocab_from checkpoints/demo/demo_feature_head_kd \
      --init_from checkpoints/demo/demo_feature_head_kd \
      --export checkpoints/demo/demo_feature_head_fused --vocab data/vocab/demo_spm.model

trains on the corpus's sentences teacher forced through the target, against the target's
own distribution at every position (research/train/feature_head.py: soft cross-entropy over
`--passes` self-fed passes, plus the feature regression), printing a tqdm bar. With
--data pointing at `scripts/build_data.py distill`'s output the contexts are the target's own
greedy outputs instead (as for the distilled drafts); the soft labels are the target's
either way. `--draft_vocab_size N` gives the head logits over the data targets' N
commonest ids only (EAGLE-3's reduced draft vocabulary: a cheaper draft call; the other
ids are never drafted, and exactness does not depend on it); `--init_from` starts from an
exported head (its output layer's columns picked for those ids). It writes
`<workdir>/checkpoint_<step>/` (Orbax: params, optimizer state, data cursors),
`config.json` and `log.jsonl` (train loss, per-pass
cross-entropy and argmax agreement with the target, validation records). Rerunning with
the same --workdir resumes. `--export` writes the head as a model directory (bfloat16
T5X checkpoint + config.json with "kind": "feature_draft" + vocabulary.json), which gin
files name as DRAFT_CHECKPOINT with DRAFT_CONFIG = @feature_draft.FeatureDraftConfig().
Prints the end record as one JSON line.
"""

import argparse
import json
import os
import sys

from specdec_t5x.algorithm import feature_draft
from specdec_t5x.integration import model_dir
from specdec_t5x.research.results import harness
from specdec_t5x.research.train import config as train_config, loop as training
from specdec_t5x.research.train import feature_head as feature_train
from specdec_t5x.research.train.config import TrainConfig


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


# The flags both trainers take, with the TrainConfig fields (COMMON) they set alike: their
# argparse settings but the default, which each trainer gives (harness.add_flags).
FLAGS = {
    'data': dict(help='dir of {task}_{split}.npz'),
    'workdir': dict(required=True),
    'warmup_steps': dict(type=int), 'weight_decay': dict(type=float),
    'save_every': dict(type=int), 'eval_every': dict(type=int), 'log_every': dict(type=int),
    'num_val_examples': dict(type=int, help='per task'), 'seed': dict(type=int),
    'no_progress': dict(action='store_true', help='no tqdm bar'),
}
COMMON = ('warmup_steps', 'weight_decay', 'save_every', 'eval_every', 'log_every',
          'num_val_examples', 'seed')


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  return harness.add_flags(p, FLAGS, dict(
      model=dict(required=True, help=f'comma list of {sorted(train_config.PRESETS)}'),
      data='data/corpus/npz', workdir=dict(help='one model: the run dir; several: parent'),
      steps=dict(default='10000', help="per model; 'auto' fits max_seconds"),
      max_seconds=dict(default='none', help='time budget per model (seconds)'),
      batch_size=dict(default='64', help='per model'),
      learning_rate=dict(default='2e-3', help='peak, per model'),
      optimizer=dict(default='adamw', choices=['adamw', 'adafactor']),
      schedule=dict(default='cosine', choices=['cosine', 'rsqrt']),
      warmup_steps=500, weight_decay=0.01, z_loss=dict(type=float, default=1e-4),
      mixing_rates=dict(default='', help="e.g. 'ende=1,summarize=1'; default: sizes"),
      dtype=dict(default='float32', help='compute dtype, e.g. bfloat16'),
      override=dict(default='', help="T5Config fields, e.g. 'layers=4,mlp_dim=1024'"),
      save_every=1000, eval_every=500, log_every=50, num_val_examples=512, seed=0,
      final_export=dict(default='', help='write bf16 params to DIR/<model>/'),
      init_from=dict(default='none', help='per model: checkpoint dir (or its parent: the '
                     'highest step) whose params start a fresh run (fine-tuning)'),
      teacher=dict(default='', help='model dir (config.json + checkpoint_*): token-level KD '
                   'from its logits'),
      kd_weight=dict(type=float, default=0.5, help='weight of KL(teacher || model)'),
      no_progress={},
      vocab=dict(default='', help='SentencePiece model the data was tokenized with: recorded '
                 'as vocabulary.json next to the --final_export (checked by infer)'),
      allow_changed_config=dict(action='store_true', help='resume a workdir although '
                                'hyperparameters differ from its config.json'))).parse_args(argv)


def train_models(argv=None) -> list:
  """Trains each --model in turn; returns their summaries."""
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
        learning_rate=lr[i], z_loss=args.z_loss, mixing_rates=_pairs(args.mixing_rates) or None,
        max_seconds=seconds[i], init_from=init_from[i], teacher=args.teacher or None,
        kd_weight=args.kd_weight, **{k: getattr(args, k) for k in COMMON})
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


def _layers(text: str) -> tuple:
  try:
    return tuple(int(item) for item in text.split(',') if item.strip())
  except ValueError:
    raise argparse.ArgumentTypeError(f'expected comma-separated layer indices, got {text!r}')


def train_head(argv=None) -> dict:
  """Trains (and exports) one feature head; returns its end record."""
  p = argparse.ArgumentParser(prog='train.py --head',
                              description='--head: a feature-reading draft head')
  harness.add_flags(p, FLAGS, dict(
      target=dict(required=True, help='the target model dir (config.json + checkpoint)'),
      data=dict(required=True, help='dir of {task}_{split}.npz (distilled)'), workdir={},
      steps=dict(type=int, default=4000),
      max_seconds=dict(type=float, default=None, help='budget of this call'),
      batch_size=dict(type=int, default=32), learning_rate=dict(type=float, default=2e-3),
      warmup_steps=100, weight_decay=0.01,
      passes=dict(type=int, default=3, help='self-fed passes (draft positions)'),
      feature_weight=dict(type=float, default=1.0),
      max_target_len=dict(type=int, default=32,
                          help='train on the first N decoder positions (0 = all)'),
      emb_dim=dict(type=int, default=128), num_heads=dict(type=int, default=2),
      mlp_dim=dict(type=int, default=512), num_layers=dict(type=int, default=1),
      feature_layers=dict(type=_layers, default=(), help="target decoder layers whose outputs "
                          "the head also reads, e.g. '0,2' (EAGLE-3's fusion; the final "
                          'features always); empty: the final only'),
      draft_vocab_size=dict(type=int, default=0, help="logits over the data targets' N "
                            'commonest ids only (a reduced draft vocabulary, EAGLE-3); 0 = the '
                            'whole vocabulary'),
      draft_vocab_from=dict(default='', help="an exported head whose draft vocabulary to keep "
                            "(e.g. --init_from's, when fine-tuning on other data); instead of "
                            '--draft_vocab_size'),
      init_from=dict(default='', help='an exported head (model dir) to start from, e.g. to '
                     'fine-tune it'),
      mixing_rates=dict(type=lambda t: harness.pairs(t, float), default={},
                        help="e.g. 'ende=3,summarize=1'; default: sizes"),
      save_every=250, eval_every=500, log_every=50, num_val_examples=256, seed=0,
      export=dict(default='', help='write the head as a model dir here'),
      vocab=dict(default='', help='SentencePiece model, recorded with --export'),
      no_progress={}))
  args = p.parse_args(argv)
  target_cfg = model_dir.load_config(args.target)
  if args.draft_vocab_size and args.draft_vocab_from:
    p.error('give --draft_vocab_size or --draft_vocab_from, not both')
  if args.draft_vocab_from:
    draft_vocab = model_dir.draft_vocab(args.draft_vocab_from)
  elif args.draft_vocab_size:
    draft_vocab = feature_train.commonest_ids(args.data, args.draft_vocab_size,
                                              target_cfg.vocab_size)
  else:
    draft_vocab = ()
  head_cfg = feature_draft.FeatureDraftConfig(
      vocab_size=target_cfg.vocab_size, target_emb_dim=target_cfg.emb_dim,
      emb_dim=args.emb_dim, num_heads=args.num_heads, head_dim=64, mlp_dim=args.mlp_dim,
      num_layers=args.num_layers, draft_vocab=draft_vocab, feature_layers=args.feature_layers)
  cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size,
                    learning_rate=args.learning_rate, mixing_rates=args.mixing_rates or None,
                    max_seconds=args.max_seconds, **{k: getattr(args, k) for k in COMMON})
  params, end = feature_train.train_head(args.target, args.data, args.workdir, head_cfg, cfg,
                                         passes=args.passes,
                                         feature_weight=args.feature_weight,
                                         max_target_len=args.max_target_len or None,
                                         init_from=args.init_from or None,
                                         progress=not args.no_progress)
  if args.export and end['done']:
    end['exported'] = feature_train.export(params, head_cfg, args.export, end['step'],
                                           args.vocab or None)
  print(json.dumps(end), flush=True)
  return end


def main(argv=None):
  """--head: train_head on the other flags; else train_models."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if '--head' in argv:
    argv.remove('--head')
    return train_head(argv)
  return train_models(argv)


if __name__ == '__main__':
  main()
