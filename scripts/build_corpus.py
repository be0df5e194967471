r"""Builds the offline Debian EN->DE / summarisation corpus, its vocabulary and npz exports.

  # corpus (apt fetches Debian indexes + .debs into --work_dir: ~2-3 min, ~550 MB):
  python scripts/build_corpus.py --out data/corpus
  # + held-out samples, SentencePiece vocab (train split only) and pre-tokenised npz:
  python scripts/build_corpus.py --out data/corpus --skip_build --demo_dir data/demo \
      --train_vocab data/vocab/demo_spm --export_npz data/corpus/npz

Takes: Debian's apt/dpkg tools and access to deb.debian.org (Debian mirror only).
Writes: {out}/{ende,summarize}/{train,validation,test}.tsv ('inputs<TAB>targets'),
{out}/stats.json (counts per source and split, vocab/token/truncation stats);
optionally data/demo/*_test.tsv, data/vocab/demo_spm.{model,vocab},
{export_npz}/{ende,summarize}_{train,validation}.npz. Prints stats.json's content.
"""
import argparse
import json
import pathlib

from specdec_t5x.research.data import corpus_build  # pylint: disable=g-import-not-at-top


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--out', default='data/corpus', help='corpus output directory')
  parser.add_argument('--work_dir', default='data/work/corpus',
                      help='apt lists, downloaded .debs, extracted files')
  parser.add_argument('--skip_build', action='store_true',
                      help='reuse the TSVs already in --out (vocab/npz/demo steps only)')
  parser.add_argument('--no_update', action='store_true',
                      help='reuse the apt lists in --work_dir (no apt-get update)')
  parser.add_argument('--demo_dir', default=None,
                      help='write {ende,summarize}_test.tsv samples (300 each) here')
  parser.add_argument('--train_vocab', default=None,
                      help='model prefix for a SentencePiece model trained on train splits')
  parser.add_argument('--vocab', default=None,
                      help='SentencePiece model for --export_npz (default: --train_vocab.model)')
  parser.add_argument('--export_npz', default=None, help='directory for tokenised .npz')
  args = parser.parse_args()

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


if __name__ == '__main__':
  main()
