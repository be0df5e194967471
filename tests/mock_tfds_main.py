r"""Runs `python -m MODULE ARGS...` on mocked TFDS data, with the tasks on a vocabulary.

  python tests/mock_tfds_main.py VOCAB NUM_EXAMPLES DATA_DIR MODULE [ARGS...]

A test fixture for subprocess runs of real entry points (`t5x.train`,
`specdec_t5x.infer`) on the project's WMT / CNN tasks, offline: it re-registers the tasks
(specdec_t5x.tasks.register_tasks) with the SentencePiece model VOCAB, writes TFDS
metadata for both datasets under DATA_DIR (splits train / validation / test of
NUM_EXAMPLES examples in one shard each: seqio lists a split's shards before sharding it
over hosts, as T5X's data pipeline asks), and runs MODULE as `__main__` inside
`tfds.testing.mock_data`, so the real TFDS builders yield NUM_EXAMPLES random examples.
"""
import os
import runpy
import sys

import tensorflow_datasets as tfds

from specdec_t5x.integration import tasks

DATASETS = ('wmt_t2t_translate/de-en:1.0.0', 'cnn_dailymail:3.4.0')
SPLITS = ('train', 'validation', 'test')


def write_metadata(data_dir: str, num_examples: int) -> None:
  """Writes dataset_info.json / features.json of DATASETS with SPLITS into data_dir."""
  for name in DATASETS:
    builder = tfds.builder(name, data_dir=data_dir)
    template = tfds.core.ShardedFileTemplate(
        data_dir=builder.data_dir, dataset_name=builder.name, filetype_suffix='tfrecord')
    builder.info.set_splits(tfds.core.SplitDict([
        tfds.core.SplitInfo(name=split, shard_lengths=[num_examples], num_bytes=0,
                            filename_template=template.replace(split=split))
        for split in SPLITS]))
    os.makedirs(builder.data_dir, exist_ok=True)
    builder.info.write_to_directory(builder.data_dir)


def main() -> None:
  if len(sys.argv) < 5:
    raise SystemExit(__doc__)
  vocab, num_examples, data_dir, module = sys.argv[1], int(sys.argv[2]), *sys.argv[3:5]
  write_metadata(data_dir, num_examples)
  tasks.register_tasks(vocab_path=vocab)
  sys.argv = [module] + sys.argv[5:]
  with tfds.testing.mock_data(num_examples=num_examples, data_dir=data_dir):
    runpy.run_module(module, run_name='__main__', alter_sys=True)


if __name__ == '__main__':
  main()
