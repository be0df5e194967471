"""seqio tasks for the paper's T5 experiments, plus offline demo tasks.

Importing this module registers four tasks (lazily: no vocabulary or data is read):

- `specdec_wmt_t2t_ende_v003` is T5's `wmt_t2t_ende_v003`
  (TFDS `wmt_t2t_translate/de-en:1.0.0`, metric BLEU).
- `specdec_cnn_dailymail_v002` is T5's `cnn_dailymail_v002`
  (TFDS `cnn_dailymail:3.4.0`, metric ROUGE).
- `demo_ende`, `demo_summarize`: offline stand-ins read from TSV files of raw
  `inputs<TAB>targets` lines (splits train/validation/test, see `demo_tsv_path`);
  BLEU and ROUGE respectively. Their vocabulary and data are found under the demo root
  (`demo.root`: the current directory unless told otherwise), resolved when registering.

Preprocessing is T5's: inputs "translate English to German: <en>" (targets German) or
"summarize: <article>" (targets the highlights); tokenize, keeping `inputs_pretokenized`
and `targets_pretokenized`; trim to the sequence length minus one and append EOS to both
features. Metrics: `metrics.bleu` for translation, `metrics.rouge` for summarisation.
The names differ from T5's so that importing `t5.data` too never clashes.

Call `register_tasks(...)` again to change the vocabulary or the data directories; it
replaces the four tasks and may be called any number of times.
"""
import functools
import os
import pathlib
from typing import Dict, List, Mapping, Optional

import seqio
import tensorflow as tf

from specdec_t5x.integration import demo, metrics
from specdec_t5x.integration.prefixes import PREFIXES, SUMMARIZE_PREFIX, TRANSLATE_PREFIX

T5_VOCAB_PATH = 'gs://t5-data/vocabs/cc_all.32000/sentencepiece.model'
T5_EXTRA_IDS = 100  # t5.data.DEFAULT_EXTRA_IDS: sentinels <extra_id_0..99>.

WMT_ENDE = 'specdec_wmt_t2t_ende_v003'
CNN_DAILYMAIL = 'specdec_cnn_dailymail_v002'
DEMO_ENDE = 'demo_ende'
DEMO_SUMMARIZE = 'demo_summarize'
TASK_NAMES = (WMT_ENDE, CNN_DAILYMAIL, DEMO_ENDE, DEMO_SUMMARIZE)
DEMO_SPLITS = ('train', 'validation', 'test')


def _text_pair(prefix: str, input_key: str, target_key: str):
  """A seqio preprocessor mapping {input_key, target_key} to {'inputs', 'targets'}."""

  @seqio.map_over_dataset
  def fn(x: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    return {
        'inputs': tf.strings.join([prefix, x[input_key]]),
        'targets': x[target_key],
    }

  return fn


def _parse_tsv(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Lines 'inputs<TAB>targets' (no quoting) -> {'inputs', 'targets'}; skips blank lines."""
  dataset = dataset.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)

  def parse(line):
    inputs, targets = tf.io.decode_csv(
        line, record_defaults=['', ''], field_delim='\t', use_quote_delim=False)
    return {'inputs': inputs, 'targets': targets}

  return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def demo_tsv_path(name: str, split: str, data_dir: Optional[str] = None,
                  sample_dir: Optional[str] = None, sample_first: bool = True) -> str:
  """The TSV file a demo task reads for `split`.

  Args:
    name: 'ende' or 'summarize'.
    split: one of DEMO_SPLITS.
    data_dir: corpus root holding `{name}/{split}.tsv`; default `demo.corpus_dir()`
      (`data/corpus` under the demo root).
    sample_dir: holds the committed held-out sample `{name}_test.tsv` for split 'test';
      default `demo.sample_dir()` (`data/demo` under the demo root).
    sample_first: split 'test' reads the sample before the corpus's own test split (the
      default corpus: the demo's figures are quoted on the sample, and a machine that
      built the corpus decodes the same inputs as a fresh clone); False: the corpus
      first, the sample only where it lacks the split (a corpus the user named).

  Returns:
    The path of an existing file.

  Raises:
    FileNotFoundError: if no file exists for this split.
  """
  if split not in DEMO_SPLITS:
    raise ValueError(f'Unknown split {split!r} for demo task {name!r}; '
                     f'expected one of {DEMO_SPLITS}.')
  candidates = [pathlib.Path(data_dir or demo.corpus_dir()) / name / f'{split}.tsv']
  if split == 'test':
    sample = pathlib.Path(sample_dir or demo.sample_dir()) / f'{name}_test.tsv'
    candidates.insert(0 if sample_first else 1, sample)
  for path in candidates:
    if path.is_file():
      return str(path)
  raise FileNotFoundError(
      f'No {split} data for demo task {name!r}; looked for: '
      + ', '.join(str(p) for p in candidates) + f' (demo root: the current directory '
      f'unless ${demo.ROOT_ENV} or register_tasks(demo_root=...) says otherwise).')


@functools.lru_cache(maxsize=16)
def _check_tsv_cached(path: str, mtime: float, size: int) -> None:
  del mtime, size  # Cache keys: a file is scanned again only after it changed.
  with open(path, 'rb') as f:
    for number, raw in enumerate(f, 1):
      try:
        line = raw.decode('utf-8')
      except UnicodeDecodeError as e:
        raise ValueError(
            f'{path}:{number}: invalid UTF-8 (byte {raw[e.start:e.start + 1]!r} at column '
            f'{e.start + 1}): {raw[:60]!r}. The demo tasks read UTF-8; re-encode the file '
            '(e.g. iconv -f latin1 -t utf-8) or fix that line.') from None
      line = line.rstrip('\r\n')
      if line.strip() and line.count('\t') != 1:
        raise ValueError(
            f'{path}:{number}: expected inputs<TAB>targets (one tab), found '
            f'{line.count(chr(9))} tabs: {line[:60]!r}.')


def check_tsv(path: str) -> None:
  """Raises ValueError naming file and line for invalid UTF-8 or a line without exactly
  one tab (blank lines are skipped, as `_parse_tsv` does). Called before any decoding."""
  st = os.stat(path)
  _check_tsv_cached(os.path.abspath(path), st.st_mtime, st.st_size)


def _demo_dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None, *,
                     name: str, data_dir: Optional[str], sample_dir: Optional[str],
                     sample_first: bool) -> tf.data.Dataset:
  del shuffle_files, seed  # One file per split: nothing to shuffle.
  path = demo_tsv_path(name, split, data_dir=data_dir, sample_dir=sample_dir,
                       sample_first=sample_first)
  check_tsv(path)
  return tf.data.TextLineDataset(path)


class _DemoVocabulary(seqio.SentencePieceVocabulary):
  """The demo tasks' default vocabulary: on first use, a missing file raises a
  FileNotFoundError that names it and the demo root (demo.require), not TF's bare one."""

  def _model_context(self):
    if not self._model:
      demo.require(self.sentencepiece_model_file, 'demo vocabulary')
    return super()._model_context()


def _output_features(vocab_path: str, extra_ids: int,
                     vocab_cls=seqio.SentencePieceVocabulary) -> Dict[str, seqio.Feature]:
  # As t5.data.tasks.DEFAULT_OUTPUT_FEATURES; the vocabulary file is read lazily.
  vocab = vocab_cls(vocab_path, extra_ids=extra_ids)
  return {
      'inputs': seqio.Feature(vocabulary=vocab, add_eos=True, required=False),
      'targets': seqio.Feature(vocabulary=vocab, add_eos=True),
  }


def _add(name: str, source, text_preprocessors: List, features, metric_fn) -> None:
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=text_preprocessors + [
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      metric_fns=[metric_fn],
  )


def register_tasks(vocab_path: Optional[str] = None,
                   data_dir: Optional[str] = None,
                   *,
                   extra_ids: Optional[int] = None,
                   tfds_data_dir: Optional[str] = None,
                   sample_dir: Optional[str] = None,
                   demo_root: Optional[str] = None) -> List[str]:
  """(Re-)registers the four tasks, replacing any earlier registration of them.

  Args:
    vocab_path: SentencePiece model for all four tasks. None: T5's public
      `cc_all.32000` (T5_VOCAB_PATH) for the WMT/CNN tasks and the demo vocabulary
      (`demo.vocab_path(demo_root)`) for the demo tasks. Nothing is read until used.
    data_dir: demo corpus root holding `{ende,summarize}/{train,validation,test}.tsv`;
      default `demo.corpus_dir(demo_root)`. A corpus named here supplies split 'test'
      too; the default one does not while the committed sample exists (the demo decodes
      the sample on any machine, corpus built or not).
    extra_ids: sentinel ids appended to the vocabulary. None: 100 for T5's vocabulary
      (as T5), 0 for any other.
    tfds_data_dir: TFDS data directory for the WMT/CNN sources (None: TFDS's default).
    sample_dir: directory of the committed `{ende,summarize}_test.tsv` samples (split
      'test'; see `data_dir`); default `demo.sample_dir(demo_root)`.
    demo_root: the directory the demo defaults are under (demo.root: None means
      $SPECDEC_DEMO_ROOT, else the current directory), resolved now.

  Returns:
    The registered task names (TASK_NAMES).
  """
  def features(path: str, vocab_cls=seqio.SentencePieceVocabulary):
    n = extra_ids if extra_ids is not None else (T5_EXTRA_IDS if path == T5_VOCAB_PATH
                                                 else 0)
    return _output_features(path, n, vocab_cls)

  t5_features = features(vocab_path or T5_VOCAB_PATH)
  demo_features = (features(vocab_path) if vocab_path else
                   features(demo.vocab_path(demo_root), _DemoVocabulary))
  sample_first = not data_dir
  data_dir = data_dir or demo.corpus_dir(demo_root)
  sample_dir = sample_dir or demo.sample_dir(demo_root)

  _add(WMT_ENDE,
       seqio.TfdsDataSource(tfds_name='wmt_t2t_translate/de-en:1.0.0',
                            tfds_data_dir=tfds_data_dir),
       [_text_pair(TRANSLATE_PREFIX, 'en', 'de')], t5_features, metrics.bleu)
  _add(CNN_DAILYMAIL,
       seqio.TfdsDataSource(tfds_name='cnn_dailymail:3.4.0', tfds_data_dir=tfds_data_dir),
       [_text_pair(SUMMARIZE_PREFIX, 'article', 'highlights')], t5_features,
       metrics.rouge)
  for task, name, metric_fn in ((DEMO_ENDE, 'ende', metrics.bleu),
                                 (DEMO_SUMMARIZE, 'summarize', metrics.rouge)):
    source = seqio.FunctionDataSource(
        functools.partial(_demo_dataset_fn, name=name, data_dir=data_dir,
                          sample_dir=sample_dir, sample_first=sample_first),
        splits=DEMO_SPLITS)
    _add(task, source, [_parse_tsv, _text_pair(PREFIXES[name], 'inputs', 'targets')],
         demo_features, metric_fn)
  return list(TASK_NAMES)


def get_dataset(task_name: str,
                split: str,
                sequence_length: Optional[Mapping[str, int]] = None,
                num_examples: Optional[int] = None,
                *,
                truncate: bool = True) -> tf.data.Dataset:
  """Unbatched, unshuffled examples of a task for inference and scoring.

  Each example has `inputs`/`targets` (int32 token ids ending in EOS) and
  `inputs_pretokenized`/`targets_pretokenized` (the texts, prefix included).

  Args:
    task_name: a registered seqio task, e.g. one of TASK_NAMES.
    split: e.g. 'validation' or 'test'.
    sequence_length: {'inputs': L, 'targets': T}, maximum lengths EOS included. Longer
      sequences are cut to length - 1 tokens plus EOS. None: no cutting.
    num_examples: keep only the first this many examples (None: all).
    truncate: if False, inputs longer than `sequence_length['inputs']` raise instead of
      being cut (this iterates over the examples once to check them).

  Returns:
    A tf.data.Dataset of dicts of tensors, in the source's order.

  Raises:
    ValueError: unknown task, or (truncate=False) an input that is too long.
  """
  if task_name not in seqio.TaskRegistry.names():
    ours = sorted(n for n in seqio.TaskRegistry.names() if n in TASK_NAMES)
    raise ValueError(f'Unknown task {task_name!r}. Tasks registered by specdec_t5x: '
                     f'{ours} (call specdec_t5x.tasks.register_tasks() if empty).')
  task = seqio.get_mixture_or_task(task_name)

  def build(lengths):
    ds = task.get_dataset(sequence_length=lengths, split=split, use_cached=False,
                          shuffle=False, num_epochs=1, try_in_mem_cache=False)
    return ds if num_examples is None else ds.take(num_examples)

  if not truncate and sequence_length and 'inputs' in sequence_length:
    max_len = sequence_length['inputs']
    lengths = build(None).map(lambda ex: tf.size(ex['inputs']))
    for index, length in enumerate(lengths.as_numpy_iterator()):
      if length > max_len:
        raise ValueError(
            f'{task_name}:{split} example {index} has {length} input tokens (EOS '
            f'included), more than sequence_length["inputs"]={max_len}; raise the '
            'length or pass truncate=True.')
  return build(sequence_length)


register_tasks()
