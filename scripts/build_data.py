r"""Builds the demo family's data: the corpus, the n-gram drafts, and distillation corpora.

  # corpus (apt fetches Debian indexes + .debs into --work_dir: ~2-3 min, ~550 MB):
  python scripts/build_data.py corpus --out data/corpus
  # + held-out samples, SentencePiece vocab (train split only) and pre-tokenised npz:
  python scripts/build_data.py corpus --out data/corpus --skip_build --demo_dir data/demo \
      --train_vocab data/vocab/demo_spm --export_npz data/corpus/npz
  # unigram and sparse-bigram drafts from the training corpus's decoder targets:
  python scripts/build_data.py ngram --data data/corpus/npz --out checkpoints/demo
  # a distillation corpus: the target's greedy outputs as the new targets:
  python scripts/build_data.py distill --target checkpoints/demo/demo_target \
      --data data/corpus/npz --out data/corpus/distill_npz --batch_size 1024

corpus takes Debian's apt/dpkg tools and access to deb.debian.org (Debian mirror only) and
writes {out}/{ende,summarize}/{train,validation,test}.tsv ('inputs<TAB>targets'),
{out}/stats.json (counts per source and split, vocab/token/truncation stats); optionally
data/demo/*_test.tsv, data/vocab/demo_spm.{model,vocab},
{export_npz}/{ende,summarize}_{train,validation}.npz. Prints stats.json's content.

ngram reads {task}_train.npz (int32 `targets` [N, 64], EOS-terminated, 0-padded) for each
task and writes {out}/unigram_{task}.npz and {out}/bigram_{task}.npz (draft_files.load_ngram
reads them). Prints the sizes written.

distill reads every `{task}_{split}.npz` of --data and writes the same files to --out, with
`inputs` unchanged and `targets` replaced by the target model's greedy decode (same width,
EOS kept, 0-padded). Training a draft on them (`scripts/train.py --init_from`) is
sequence-level knowledge distillation: the draft learns the target's own mode, which is the
quantity alpha measures. Prints one JSON line per file (rows, seconds, mean length). The
feature head demo_feature_head_kd trained on a subset (2 CPU cores, ~33 min):

  python scripts/build_data.py distill --target checkpoints/demo/demo_target \
      --out data/corpus/distill_npz --splits train --max_rows ende=36000,summarize=12000
  python scripts/build_data.py distill --target checkpoints/demo/demo_target \
      --out data/corpus/distill_npz --splits validation --max_rows 1024
"""

import argparse
import glob
import io
import json
import os
import pathlib
import time

import numpy as np

from specdec_t5x.algorithm import drafts, network
from specdec_t5x.integration import draft_files, model_dir, run_dir
from specdec_t5x.research.data import corpus_build
from specdec_t5x.research.results import harness
from specdec_t5x.research.train import distill as distill_lib


def corpus(args, parser) -> dict:
  """The corpus, its samples, vocabulary and npz exports; returns stats.json's content."""
  out = pathlib.Path(args.out)
  stats_path = out / 'stats.json'
  if args.skip_build:
    stats = json.loads(stats_path.read_text())
  else:
    stats = corpus_build.build_corpus(out, pathlib.Path(args.work_dir), update=not args.no_update)
  if args.demo_dir:
    stats['demo'] = corpus_build.write_demo(out, pathlib.Path(args.demo_dir))
  if args.train_vocab:
    stats['vocab'] = corpus_build.train_vocab(out, pathlib.Path(args.train_vocab))
  if args.export_npz:
    vocab = args.vocab or (args.train_vocab and args.train_vocab + '.model')
    if not vocab:
      parser.error('--export_npz needs --vocab or --train_vocab')
    stats['npz'] = corpus_build.export_npz(out, pathlib.Path(args.export_npz), pathlib.Path(vocab))
  corpus_build.dump_json(stats_path, stats)
  print(json.dumps(stats, indent=2, sort_keys=True))
  return stats


def ngram(args, parser) -> list:
  """The unigram and bigram drafts of each task; returns the paths written."""
  del parser
  os.makedirs(args.out, exist_ok=True)
  paths = []
  for task in args.tasks.split(','):
    targets = np.load(os.path.join(args.data, f'{task}_train.npz'))['targets']
    seqs = [row[row > 0] for row in targets]
    uni = {'logits': drafts.ngram_log_probs(seqs, args.vocab_size, 1)}
    bi = drafts.sparse_bigram(seqs, args.vocab_size, topk=args.topk)
    for name, params in (('unigram', uni), ('bigram', bi)):
      path = os.path.join(args.out, f'{name}_{task}.npz')
      draft_files.save_ngram(path, params, args.vocab_size)
      print(f'{path}: {os.path.getsize(path) / 1e6:.2f} MB from {len(seqs)} sequences')
      paths.append(path)
  return paths


def _max_rows(text: str) -> dict:
  """'N' -> {None: N} (every file); 'task=N,...' -> {task: N}."""
  if '=' not in text:
    return {None: int(text)}
  return harness.pairs(text, int)


def distill(args, parser) -> list:
  """The target's greedy outputs of every file; returns one summary per file."""
  del parser
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
      new = distill_lib.distill_targets(model, params, inputs.astype(np.int32),
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


def parser() -> argparse.ArgumentParser:
  """The three subcommands and their flags (each runs `args.run(args, parser)`)."""
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest='command', required=True)
  for name, run, about, flags in (
      ('corpus', corpus, 'the corpus, its samples, vocabulary and npz exports', dict(
          out=dict(default='data/corpus', help='corpus output directory'),
          work_dir=dict(default='data/work/corpus',
                        help='apt lists, downloaded .debs, extracted files'),
          skip_build=dict(action='store_true',
                          help='reuse the TSVs already in --out (vocab/npz/demo steps only)'),
          no_update=dict(action='store_true',
                         help='reuse the apt lists in --work_dir (no apt-get update)'),
          demo_dir=dict(default=None,
                        help='write {ende,summarize}_test.tsv samples (300 each) here'),
          train_vocab=dict(default=None,
                           help='model prefix for a SentencePiece model trained on train splits'),
          vocab=dict(default=None,
                     help='SentencePiece model for --export_npz (default: --train_vocab.model)'),
          export_npz=dict(default=None, help='directory for tokenised .npz'))),
      ('ngram', ngram, 'unigram and sparse-bigram drafts', dict(
          data='data/corpus/npz', out='checkpoints/demo', tasks='ende,summarize',
          vocab_size=dict(type=int, default=8192), topk=dict(type=int, default=16))),
      ('distill', distill, "a distillation corpus: the target's greedy outputs", dict(
          target=dict(required=True, help='model dir: config.json + checkpoint_*'),
          data='data/corpus/npz', out=dict(required=True), splits='train,validation',
          batch_size=dict(type=int, default=512),
          max_rows=dict(type=_max_rows, default={}, help="per file: N, or per task "
                        "'ende=36000,summarize=12000' (a task not named: all); 0 = all"),
          dtype=dict(default='float32', help='compute dtype, e.g. bfloat16 on GPU'),
          no_progress=dict(action='store_true')))):
    harness.add_flags(sub.add_parser(name, help=about), {}, flags).set_defaults(run=run)
  return ap


def main(argv=None):
  ap = parser()
  args = ap.parse_args(argv)
  return args.run(args, ap)


if __name__ == '__main__':
  main()
