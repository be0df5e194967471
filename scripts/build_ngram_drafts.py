"""Unigram and sparse-bigram drafts from the training corpus's decoder targets.

  python scripts/build_ngram_drafts.py --data data/corpus/npz --out checkpoints/demo

Reads {task}_train.npz (int32 `targets` [N, 64], EOS-terminated, 0-padded) for each task
and writes {out}/unigram_{task}.npz and {out}/bigram_{task}.npz (draft_files.load_ngram reads
them). Prints the sizes written.
"""

import argparse
import os

import numpy as np

from specdec_t5x.algorithm import drafts
from specdec_t5x.integration import draft_files


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--data', default='data/corpus/npz')
  ap.add_argument('--out', default='checkpoints/demo')
  ap.add_argument('--tasks', default='ende,summarize')
  ap.add_argument('--vocab_size', type=int, default=8192)
  ap.add_argument('--topk', type=int, default=16)
  args = ap.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  for task in args.tasks.split(','):
    targets = np.load(os.path.join(args.data, f'{task}_train.npz'))['targets']
    seqs = [row[row > 0] for row in targets]
    uni = {'logits': drafts.ngram_log_probs(seqs, args.vocab_size, 1)}
    bi = drafts.sparse_bigram(seqs, args.vocab_size, topk=args.topk)
    for name, params in (('unigram', uni), ('bigram', bi)):
      path = os.path.join(args.out, f'{name}_{task}.npz')
      draft_files.save_ngram(path, params, args.vocab_size)
      print(f'{path}: {os.path.getsize(path) / 1e6:.2f} MB from {len(seqs)} sequences')


if __name__ == '__main__':
  main()
