"""Tests for specdec_t5x.tasks and specdec_t5x.metrics (offline; tiny vocab made here).

The WMT / CNN tasks run the real TFDS builders under `tfds.testing.mock_data`, fed either
with local real-looking examples (`as_dataset_fn`) or with TFDS's random text.
"""
import importlib
import math
import pathlib

import pytest
from conftest import train_tiny_spm
import sacrebleu
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from specdec_t5x.integration import metrics
from specdec_t5x.integration import tasks

FIXTURES = pathlib.Path(__file__).parent / 'data' / 'tasks'
CORPUS = FIXTURES / 'corpus'
SAMPLES = FIXTURES / 'demo'
EOS = 1
LONG = {'inputs': 256, 'targets': 256}


def _read_tsv(path):
  lines = path.read_text(encoding='utf-8').splitlines()
  return [tuple(line.split('\t')) for line in lines if line.strip()]


ENDE = _read_tsv(CORPUS / 'ende' / 'train.tsv')
SUMMARIES = _read_tsv(CORPUS / 'summarize' / 'validation.tsv')


def _train_vocab(path):
  texts = [tasks.TRANSLATE_PREFIX, tasks.SUMMARIZE_PREFIX, 'abcdefghij ABCDEFGHIJ']
  for tsv in FIXTURES.rglob('*.tsv'):
    texts += [t for pair in _read_tsv(tsv) for t in pair]
  return train_tiny_spm(path, texts)


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
  """Registers the tasks with a tiny vocabulary and the fixture TSVs; restores after."""
  path = _train_vocab(tmp_path_factory.mktemp('spm') / 'tiny.model')
  tasks.register_tasks(vocab_path=path, data_dir=str(CORPUS), sample_dir=str(SAMPLES))
  yield _vocab_of(tasks.WMT_ENDE)
  tasks.register_tasks()


def _vocab_of(task_name):
  return seqio.get_mixture_or_task(task_name).output_features['inputs'].vocabulary


def _examples(task_name, split, lengths=LONG, **kwargs):
  ds = tasks.get_dataset(task_name, split, lengths, **kwargs)
  return [{k: (v.decode('utf-8') if isinstance(v, bytes) else v) for k, v in ex.items()}
          for ex in ds.as_numpy_iterator()]


def _check_tokens(ex, vocab, lengths, normalize=False):
  for key in ('inputs', 'targets'):
    ids = ex[key].tolist()
    text = ex[f'{key}_pretokenized']
    if normalize:  # SentencePiece's nmt_nfkc drops repeated/edge whitespace.
      text = ' '.join(text.split())
    assert ids[-1] == EOS and EOS not in ids[:-1]
    assert len(ids) <= lengths[key]
    assert vocab.decode(ids[:-1]) == text
    assert len(ids) == len(vocab.encode(text)) + 1  # Nothing was cut at these lengths.


def _as_dataset_fn(examples, seen):
  def as_dataset(self, split, **unused_kwargs):
    seen.append((self.name, self.builder_config.name if self.builder_config else None,
                 str(self.version), split))
    assert set(examples[0]) == set(self.info.features.keys())
    return tf.data.Dataset.from_tensor_slices(
        {k: [ex[k] for ex in examples] for k in examples[0]})
  return as_dataset


def test_import_registers_lazily_and_reregistering_is_idempotent(vocab):
  importlib.reload(tasks)  # Registers again with the defaults: must not read/crash.
  importlib.reload(tasks)
  for name in tasks.TASK_NAMES:
    assert name in seqio.TaskRegistry.names()
  wmt_vocab, demo_vocab = _vocab_of(tasks.WMT_ENDE), _vocab_of(tasks.DEMO_ENDE)
  assert wmt_vocab.sentencepiece_model_file == tasks.T5_VOCAB_PATH == (
      'gs://t5-data/vocabs/cc_all.32000/sentencepiece.model')
  assert wmt_vocab.extra_ids == 100
  assert demo_vocab.sentencepiece_model_file.endswith('data/vocab/demo_spm.model')
  assert demo_vocab.extra_ids == 0
  path = vocab.sentencepiece_model_file
  names = tasks.register_tasks(path, str(CORPUS), sample_dir=str(SAMPLES))
  assert names == list(tasks.TASK_NAMES)
  for name in names:
    feats = seqio.get_mixture_or_task(name).output_features
    assert feats['targets'].vocabulary.sentencepiece_model_file == path
    assert feats['targets'].add_eos and feats['inputs'].add_eos
    assert not feats['inputs'].required  # As T5's DEFAULT_OUTPUT_FEATURES.


def test_task_metrics(vocab):
  del vocab
  assert seqio.get_mixture_or_task(tasks.WMT_ENDE).metric_fns == [metrics.bleu]
  assert seqio.get_mixture_or_task(tasks.DEMO_ENDE).metric_fns == [metrics.bleu]
  assert seqio.get_mixture_or_task(tasks.CNN_DAILYMAIL).metric_fns == [metrics.rouge]
  assert seqio.get_mixture_or_task(tasks.DEMO_SUMMARIZE).metric_fns == [metrics.rouge]


def test_wmt_real_builder_with_local_examples(vocab):
  seen = []
  local = [{'en': en, 'de': de} for en, de in ENDE]
  with tfds.testing.mock_data(as_dataset_fn=_as_dataset_fn(local, seen)):
    exs = _examples(tasks.WMT_ENDE, 'validation')
    short = _examples(tasks.WMT_ENDE, 'validation', {'inputs': 9, 'targets': 5},
                      num_examples=2)
  assert seen[0] == ('wmt_t2t_translate', 'de-en', '1.0.0', 'validation')
  assert len(exs) == len(ENDE)
  for ex, (en, de) in zip(exs, ENDE):
    assert ex['inputs_pretokenized'] == 'translate English to German: ' + en
    assert ex['targets_pretokenized'] == de
    _check_tokens(ex, vocab, LONG)
  assert len(short) == 2
  for ex, full in zip(short, exs):  # Cut to length - 1, then EOS (append_eos_after_trim).
    assert ex['inputs'].tolist() == full['inputs'].tolist()[:8] + [EOS]
    assert ex['targets'].tolist() == full['targets'].tolist()[:4] + [EOS]


def test_cnn_dailymail_real_builder_with_local_examples(vocab):
  seen = []
  local = [{'article': a, 'highlights': h.replace('. ', '.\n'), 'id': f'{i:040x}',
            'publisher': 'cnn'} for i, (a, h) in enumerate(SUMMARIES)]
  with tfds.testing.mock_data(as_dataset_fn=_as_dataset_fn(local, seen)):
    exs = _examples(tasks.CNN_DAILYMAIL, 'test')
  assert seen[0] == ('cnn_dailymail', None, '3.4.0', 'test')
  assert len(exs) == len(local)
  for ex, src in zip(exs, local):
    assert ex['inputs_pretokenized'] == 'summarize: ' + src['article']
    assert ex['targets_pretokenized'] == src['highlights']
    assert set(ex) == {'inputs', 'targets', 'inputs_pretokenized', 'targets_pretokenized'}
    _check_tokens(ex, vocab, LONG, normalize=True)  # Newlines become spaces.


@pytest.mark.parametrize('task_name,prefix', [
    (tasks.WMT_ENDE, 'translate English to German: '),
    (tasks.CNN_DAILYMAIL, 'summarize: '),
])
def test_real_builders_with_random_examples(vocab, task_name, prefix):
  with tfds.testing.mock_data(num_examples=3):
    exs = _examples(task_name, 'validation')
  assert len(exs) == 3
  for ex in exs:
    assert ex['inputs_pretokenized'].startswith(prefix)
    _check_tokens(ex, vocab, LONG, normalize=True)


def test_demo_tasks_read_fixture_tsvs(vocab):
  val = _examples(tasks.DEMO_ENDE, 'validation')  # The blank line is skipped.
  assert [(e['inputs_pretokenized'], e['targets_pretokenized']) for e in val] == [
      ('translate English to German: My brother reads a book.',
       'Mein Bruder liest ein Buch.'),
      ('translate English to German: The street is closed because of the snow.',
       'Die Straße ist wegen des Schnees gesperrt.')]
  for ex in val:
    _check_tokens(ex, vocab, LONG)
  # test: the corpus file wins over the committed sample when both exist ...
  test = _examples(tasks.DEMO_ENDE, 'test')
  assert [e['targets_pretokenized'] for e in test] == [
      'Wir treffen uns morgen am Bahnhof.', 'Die Datei konnte nicht geöffnet werden.']
  # ... and the sample is used when the corpus lacks the split.
  summ = _examples(tasks.DEMO_SUMMARIZE, 'test')
  assert len(summ) == 1
  assert summ[0]['inputs_pretokenized'].startswith('summarize: Heavy rain flooded')
  assert summ[0]['targets_pretokenized'] == (
      'Heavy rain floods the old town. Nobody was injured.')
  _check_tokens(summ[0], vocab, LONG)
  with pytest.raises(FileNotFoundError, match='summarize/train.tsv'):
    tasks.get_dataset(tasks.DEMO_SUMMARIZE, 'train', LONG)


def test_truncate_false_raises_on_long_inputs(vocab):
  del vocab
  lengths = {'inputs': 12, 'targets': 64}
  with pytest.raises(ValueError, match=r'summarize:validation example 0 has \d+ input'):
    tasks.get_dataset(tasks.DEMO_SUMMARIZE, 'validation', lengths, truncate=False)
  cut = _examples(tasks.DEMO_SUMMARIZE, 'validation', lengths)  # Default: cut, EOS last.
  assert all(len(e['inputs']) == 12 and e['inputs'][-1] == EOS for e in cut)
  fits = _examples(tasks.DEMO_SUMMARIZE, 'validation', LONG, truncate=False)
  assert [e['inputs'].tolist() for e in fits] == [
      e['inputs'].tolist() for e in _examples(tasks.DEMO_SUMMARIZE, 'validation', LONG)]


def test_unknown_task_lists_registered_tasks(vocab):
  del vocab
  with pytest.raises(ValueError, match='specdec_wmt_t2t_ende_v003') as err:
    tasks.get_dataset('wmt_t2t_ende_v003', 'test', LONG)
  assert "Unknown task 'wmt_t2t_ende_v003'" in str(err.value)
  assert 'demo_summarize' in str(err.value)


def test_bleu():
  refs = ['Das Wetter ist heute schön.', 'Wo ist die nächste Apotheke?']
  assert metrics.bleu(refs, refs)['bleu'] == pytest.approx(100.0)
  # No zero n-gram counts (no smoothing), no brevity penalty: p_n = 6/7, 5/6, 4/5, 3/4.
  got = metrics.bleu(['the cat sat on the mat yesterday'], ['the cat sat on the mat today'])
  assert got['bleu'] == pytest.approx(100 * (3 / 7) ** 0.25)
  # All precisions 1, hypothesis 6 tokens vs reference 7: BLEU = BP = exp(1 - 7/6).
  got = metrics.bleu(['the cat sat on the mat today'], ['the cat sat on the mat'])
  assert got['bleu'] == pytest.approx(100 * math.exp(1 - 7 / 6))
  # The intl tokenizer splits Unicode punctuation such as German quotes; 13a does not.
  ref = ['„Das ist ein guter Test“, sagte er.']
  hyp = ['„ Das ist ein guter Test “ , sagte er .']
  assert metrics.bleu(ref, hyp)['bleu'] == pytest.approx(100.0)
  assert sacrebleu.corpus_bleu(hyp, [ref], tokenize='13a').score < 100
  with pytest.raises(ValueError):
    metrics.bleu(refs, refs[:1])


def test_rouge():
  refs = ['The cat sat on the mat.', 'It rained all day in the old town.']
  for bootstrap in (False, True):
    got = metrics.rouge(refs, refs, bootstrap=bootstrap)
    assert set(got) == {'rouge1', 'rouge2', 'rougeLsum'}
    assert all(v == pytest.approx(100.0) for v in got.values())
  # P = 1, R = 3/6 -> F = 2/3; bigrams 2 of 2 predicted, 2 of 5 reference -> F = 4/7.
  got = metrics.rouge(['the cat sat on the mat'], ['the cat sat'])
  assert got['rouge1'] == pytest.approx(200 / 3)
  assert got['rouge2'] == pytest.approx(400 / 7)
  assert got['rougeLsum'] == pytest.approx(200 / 3)
  # T5's " . " -> " .\n" makes rougeLsum sentence-level: swapped sentences still score 100.
  got = metrics.rouge(['the cat sat . the dog ran'], ['the dog ran . the cat sat'])
  assert got['rougeLsum'] == pytest.approx(100.0)
  assert got['rouge2'] == pytest.approx(80.0)
  # Mean over examples: one perfect, one disjoint.
  got = metrics.rouge(['a b c', 'd e f'], ['a b c', 'x y z'])
  assert got['rouge1'] == pytest.approx(50.0)
