"""Hermetic tests of the Debian corpus parsers (no apt, no network).

  python -m pytest -q tests/test_corpus.py

Fixtures under tests/data/corpus/ are verbatim excerpts of Debian's bookworm
Translation-en/-de and Packages indexes and of trans-de-en's /usr/share/trans/de-en;
.mo catalogs are written in the test by a small GNU .mo writer.
"""
import collections
import gettext
import io
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

from specdec_t5x.research.data import corpus, corpus_build

DATA = pathlib.Path(__file__).parent / 'data' / 'corpus'


def _read(name: str) -> str:
  return (DATA / name).read_text(encoding='utf-8')


def write_mo(messages, endian='<', charset='UTF-8') -> bytes:
  """A GNU .mo file from [(msgid_bytes_or_str, msgstr)] (header entry added, sorted)."""
  header = f'Content-Type: text/plain; charset={charset}\n'.encode('ascii')
  entries = [(b'', header)] + [
      (k.encode(charset) if isinstance(k, str) else k,
       v.encode(charset) if isinstance(v, str) else v) for k, v in messages]
  entries.sort()
  n = len(entries)
  orig_table, trans_table = 28, 28 + 8 * n
  offset = 28 + 16 * n
  blobs, orig, trans = b'', [], []
  for table, idx in ((orig, 0), (trans, 1)):
    for entry in entries:
      table.append((len(entry[idx]), offset + len(blobs)))
      blobs += entry[idx] + b'\x00'
  out = struct.pack(endian + '7I', 0x950412de, 0, n, orig_table, trans_table, 0, 0)
  for length, off in orig + trans:
    out += struct.pack(endian + '2I', length, off)
  return out + blobs


def test_parse_translation_and_pair_by_md5():
  en = corpus.parse_translation(_read('Translation-en'), 'en')
  de = corpus.parse_translation(_read('Translation-de'), 'de')
  assert set(de) < set(en)  # abcde has no German translation.
  assert en['da35113f2508604b50014e0ccf6a31ac'][0] == 'abcde'
  md5 = '0f25c2ca95ceff4500fde9f651d74f2e'  # 2048-qt
  examples = corpus.ddtp_ende_examples(md5, en[md5][1], de[md5][1], 'pkg:2048-qt')
  assert examples[0] == corpus.Example('ddtp_synopsis', 'pkg:2048-qt',
                                       'mathematics based puzzle game',
                                       'Mathematik-Rätselspiel')
  # Three sentences on both sides -> three sentence pairs, aligned in order.
  sentences = [e for e in examples if e.source == 'ddtp_sentence']
  assert len(sentences) == 3
  assert sentences[-1].inputs == ('When two tiles with the same number touch, they will '
                                  'merge into one.')
  assert sentences[-1].targets.startswith('Wenn sich zwei Kacheln')
  assert all('\n' not in e.inputs + e.targets for e in examples)


def test_split_description_paragraphs():
  en = corpus.parse_translation(_read('Translation-en'), 'en')
  synopsis, paras = corpus.split_description(en['26581e685027d5ae84824362a4ba59ee'][1])
  assert synopsis == 'Real-time strategy game of ancient warfare (data files)'
  assert len(paras) == 2
  assert paras[1] == 'This package contains the main data files required by 0 A.D.'
  assert corpus.split_description('short\n one\n .\n .\n two\n  verbatim') == (
      'short', ['one', 'two verbatim'])


def test_unequal_paragraphs_give_only_synopsis():
  ex = corpus.ddtp_ende_examples('x', 'Syn\n a\n .\n b', 'Syn-de\n a-de', 'pkg:x')
  assert [e.source for e in ex] == ['ddtp_synopsis']


def test_packages_source_mapping():
  sources = corpus.parse_packages_sources(_read('Packages'))
  assert sources['libdrm-tests'] == 'libdrm'  # 'Source: libdrm (2.4.114-1)'
  assert sources['2048-qt'] == '2048-qt'
  assert sources['0ad'] == '0ad'


def test_summary_examples():
  en = corpus.parse_translation(_read('Translation-en'), 'en')
  ex = corpus.ddtp_summary_example(en['da35113f2508604b50014e0ccf6a31ac'][1], 'pkg:abcde')
  assert ex.targets == 'A Better CD Encoder'
  assert ex.inputs.startswith('frontend program to cdparanoia') and ' . ' not in ex.inputs
  assert corpus.word_count(ex.inputs) >= 40
  assert corpus.ddtp_summary_example('Tiny\n too short to keep.', 'pkg:t') is None


def test_ding_example_sentences():
  examples = corpus.ding_examples(io.StringIO(_read('ding-de-en.txt')))
  pairs = {(e.inputs, e.targets) for e in examples}
  assert ('Would you like to have dinner with me?',
          'Wollen wir zusammen zu Abend essen?') in pairs
  assert ('I usually cut across the park on my way home.',
          'Auf dem Heimweg nehme ich immer die Abkürzung über den Park.') in pairs
  assert ("What's on the schedule for today?", 'Was steht für heute auf dem Programm?') in pairs
  # Headwords and phrases are not sentences; annotations never leak into the text.
  assert all(corpus.word_count(e.inputs) >= 3 for e in examples)
  assert not any('{' in e.targets or '[' in e.targets for e in examples)
  assert len(examples) == 6
  keys = collections.Counter(e.key for e in examples)
  assert keys['ding:Abendessen (als Hauptmahlzeit)'] == 2


@pytest.mark.parametrize('endian', ['<', '>'])
def test_parse_mo_matches_stdlib(endian):
  messages = [('Open the file', 'Die Datei öffnen'),
              ('menu\x04Save all documents', 'Alle Dokumente speichern'),
              (b'%d file\x00%d files', b'%d Datei\x00%d Dateien')]
  data = write_mo(messages, endian)
  entries = corpus.parse_mo(data)
  assert ('menu', 'Save all documents', 'Alle Dokumente speichern', False) in entries
  assert (None, 'Open the file', 'Die Datei öffnen', False) in entries
  assert any(plural for *_, plural in entries)
  if endian == '<':  # The stdlib reader agrees with ours on the same bytes.
    stdlib = gettext.GNUTranslations(io.BytesIO(data))
    assert stdlib.gettext('Open the file') == 'Die Datei öffnen'
    assert stdlib.pgettext('menu', 'Save all documents') == 'Alle Dokumente speichern'


def test_parse_mo_latin1_and_bad_magic():
  entries = corpus.parse_mo(write_mo([('Close the window', 'Fenster schließen')],
                                     charset='ISO-8859-1'))
  assert entries == [(None, 'Close the window', 'Fenster schließen', False)]
  with pytest.raises(ValueError):
    corpus.parse_mo(b'\x00' * 32)


def test_mo_examples_filters():
  entries = corpus.parse_mo(write_mo([
      ('_Open the selected file', '_Ausgewählte Datei öffnen'),  # mnemonic stripped
      ('&Quit the program now', 'Programm jetzt &beenden'),
      ('Cancel', 'Abbrechen'),  # very short
      ('%s: %s (%d)', '%s: %s (%d)'),  # format only
      ('%s of %s files', '%s von %s Dateien'),  # 2 real words: too short
      ('Unable to read %s from disk', '%s konnte nicht gelesen werden'),
      ('<b>Bold heading text here</b>', '<b>Fetter Überschriftentext hier</b>'),
      ('Not translated at all', 'Not translated at all'),
      (b'one file was removed\x00%d files were removed', b'eine\x00%d'),
      ('Line one of it\n\tline two', 'Zeile eins\n\tZeile zwei'),
  ]))
  got = {(e.inputs, e.targets) for e in corpus.mo_examples(entries)}
  assert got == {
      ('Open the selected file', 'Ausgewählte Datei öffnen'),
      ('Quit the program now', 'Programm jetzt beenden'),
      ('Unable to read %s from disk', '%s konnte nicht gelesen werden'),
      ('Line one of it line two', 'Zeile eins Zeile zwei'),
  }


def test_split_rule_by_package():
  # Many pieces per package (as across suites): every package lands in exactly one split.
  examples = [corpus.Example('ddtp_synopsis', f'pkg:p{i}', f'text {i} {j}', f'de {i} {j}')
              for i in range(3000) for j in range(3)]
  splits = corpus.assign_splits(examples, seed=0)
  keys = {s: {e.key for e in rows} for s, rows in splits.items()}
  assert not keys['train'] & keys['validation']
  assert not keys['train'] & keys['test']
  assert not keys['validation'] & keys['test']
  assert corpus_build._leaked_keys(splits) == 0  # pylint: disable=protected-access
  fractions = {s: len(k) / 3000 for s, k in keys.items()}
  assert 0.94 < fractions['train'] < 0.98
  assert 0.01 < fractions['validation'] < 0.03 and 0.01 < fractions['test'] < 0.03
  # Deterministic: same key, same split; same seed, same order.
  assert corpus.split_of('pkg:coreutils') == corpus.split_of('pkg:coreutils')
  assert corpus.assign_splits(examples, seed=0) == splits


def test_dedup():
  ex = [corpus.Example('a', 'k1', 'Hello  world', 'Hallo Welt'),
        corpus.Example('b', 'k2', 'hello world', 'Hallo, Welt'),  # same input, case/space
        corpus.Example('c', 'k3', '  ', 'leer'),
        corpus.Example('d', 'k4', 'Goodbye\tworld', 'Auf\nWiedersehen')]
  kept, dropped = corpus.dedup(ex)
  assert [(e.source, e.inputs, e.targets) for e in kept] == [
      ('a', 'Hello world', 'Hallo Welt'), ('d', 'Goodbye world', 'Auf Wiedersehen')]
  assert dropped == {'duplicate': 1, 'empty': 1}


def test_tsv_roundtrip(tmp_path):
  path = tmp_path / 'x' / 'train.tsv'
  assert corpus.write_tsv(path, [('a\tb', 'c\nd'), ('e', 'f')]) == 2
  assert corpus.read_tsv(path) == [('a b', 'c d'), ('e', 'f')]


class _StubSp:
  """Stands in for SentencePieceProcessor: one id per character (2..)."""

  def encode(self, texts):
    return [[2 + (ord(c) % 50) for c in t] for t in texts]


def test_encode_task_truncates_keeping_eos():
  rows = [('ab', 'c'), ('x' * 20, 'y' * 10)]
  inputs, targets, stats = corpus_build.encode_task(_StubSp(), rows, 'p: ', input_len=8,
                                              target_len=4)
  assert inputs.dtype == np.int32 and inputs.shape == (2, 8) and targets.shape == (2, 4)
  assert list(inputs[0]) == [2 + ord(c) % 50 for c in 'p: ab'] + [1, 0, 0]
  assert list(targets[0]) == [2 + ord('c') % 50, 1, 0, 0]
  assert inputs[1, -1] == 1 and targets[1, -1] == 1
  assert stats['truncated_inputs'] == 1 and stats['truncated_targets'] == 1


def test_sample_demo_prefers_length_window():
  rows = [(' '.join(['w'] * n), 't') for n in range(1, 60)]
  picked = corpus_build.sample_demo(rows, 10, 5, 40)
  assert len(picked) == 10 and all(5 <= corpus.word_count(r[0]) <= 40 for r in picked)
  assert len(corpus_build.sample_demo(rows[:3], 10, 5, 40)) == 3


def test_apt_config_and_missing_tools(tmp_path, monkeypatch):
  conf = corpus_build.write_apt_config(tmp_path, [('bookworm', ('main',))]).read_text()
  assert '#clear Acquire::Languages;' in conf and '"en"; "de";' in conf
  assert f'Dir::State::Lists "{tmp_path.resolve()}/lists"' in conf
  assert 'bookworm main' in (tmp_path / 'sources.list').read_text()
  monkeypatch.setattr(corpus_build, 'REQUIRED_TOOLS', ('no-such-tool-xyz',))
  with pytest.raises(RuntimeError, match='no-such-tool-xyz'):
    corpus_build.check_tools()


def test_the_corpus_loads_without_seqio_or_tensorflow():
  """The corpus reads the task prefixes from integration/prefixes.py, not the seqio tasks."""
  code = ('import sys\nimport specdec_t5x.research.data.corpus\n'
          "print(sorted(m for m in ('seqio', 'tensorflow') if m in sys.modules))\n")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       check=True).stdout.strip().splitlines()[-1]
  assert out == '[]', f'importing the corpus loaded {out}'
