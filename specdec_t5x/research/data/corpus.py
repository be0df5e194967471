"""An offline EN->DE and summarisation corpus built from Debian data, plus its vocabulary.

Sources (all fetched with apt from Debian's own mirrors, see data/README.md):
  * DDTP translated package descriptions: Translation-en / Translation-de paired by
    Description-md5 -> synopsis pairs, paragraph pairs, sentence pairs (EN->DE);
    long description -> synopsis (summarisation).
  * The Ding dictionary (package trans-de-en): its example-sentence pairs (EN->DE).
  * gettext .mo catalogs with German translations (English msgid -> German msgstr).

Every example carries a split key (the Debian source package for DDTP, the dictionary
entry for Ding, the English message for gettext); a hash of that key picks the split, so
near-duplicates across suites can never land in two splits. The parsers are pure
functions over text/bytes (tested hermetically in tests/test_corpus.py); fetching with
apt, the build, the vocabulary and the npz export are in corpus_build.py.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import pathlib
import random
import re
import struct
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from specdec_t5x.integration import prefixes

TASK_PREFIXES = prefixes.PREFIXES  # defined once, read by the seqio tasks too

SPLITS = ('train', 'validation', 'test')



# ----------------------------------------------------------------------------- text


def normalize(text: str) -> str:
  """Collapses all whitespace (tabs, newlines included) to single spaces."""
  return ' '.join(text.split())


def word_count(text: str) -> int:
  return len(text.split())


# ------------------------------------------------------------------- deb822 / DDTP


def parse_deb822(text: str) -> Iterator[Dict[str, str]]:
  """Yields the stanzas of a Packages/Translation file as {field: raw value}.

  Continuation lines keep their leading space and are joined with '\n', so a
  description value is 'synopsis\\n long line\\n .\\n long line'.
  """
  stanza: Dict[str, str] = {}
  field = None
  for line in text.splitlines():
    if not line.strip():
      if stanza:
        yield stanza
      stanza, field = {}, None
    elif line[0] in ' \t':
      if field is not None:
        stanza[field] += '\n' + line
    else:
      field, _, value = line.partition(':')
      stanza[field] = value.strip()
  if stanza:
    yield stanza


def split_description(value: str) -> Tuple[str, List[str]]:
  """Debian description -> (synopsis, long-description paragraphs), whitespace-normalised.

  Continuation lines start with one space; ' .' separates paragraphs (Debian Policy 5.6.13).
  """
  lines = value.split('\n')
  synopsis = normalize(lines[0])
  paragraphs: List[List[str]] = [[]]
  for line in lines[1:]:
    body = line[1:] if line.startswith(' ') else line
    if body.strip() == '.':
      paragraphs.append([])
    else:
      paragraphs[-1].append(body)
  paras = [normalize(' '.join(p)) for p in paragraphs]
  return synopsis, [p for p in paras if p]


def parse_translation(text: str, lang: str) -> Dict[str, Tuple[str, str]]:
  """Translation-<lang> text -> {Description-md5: (package, raw description)}."""
  field = f'Description-{lang}'
  out = {}
  for stanza in parse_deb822(text):
    md5, desc = stanza.get('Description-md5'), stanza.get(field)
    if md5 and desc:
      out.setdefault(md5, (stanza.get('Package', ''), desc))
  return out


def parse_packages_sources(text: str) -> Dict[str, str]:
  """Packages text -> {binary package: source package} ('Source: foo (1.2)' -> 'foo')."""
  out = {}
  for stanza in parse_deb822(text):
    pkg = stanza.get('Package')
    if pkg:
      source = stanza.get('Source', pkg).split()[0]
      out.setdefault(pkg, source)
  return out


_SENTENCE_END = re.compile(r'(?<=[.!?])\s+(?=["„(]?[A-ZÄÖÜ0-9])')
# Abbreviations after which a period does not end a sentence (both languages).
_ABBREV = re.compile(r'(\b(e\.g|i\.e|etc|z\.B|z\. B|bzw|ca|vs|Dr|Nr|usw|u\.a|d\.h|'
                     r'inkl|evtl|ggf|bspw|sog|vgl|v)\.|\b[A-Za-z]\.)$')


def split_sentences(paragraph: str) -> List[str]:
  """Heuristic sentence split (only used when both sides agree on the count)."""
  pieces: List[str] = []
  for piece in _SENTENCE_END.split(paragraph):
    if pieces and _ABBREV.search(pieces[-1]):
      pieces[-1] += ' ' + piece
    else:
      pieces.append(piece)
  return pieces


@dataclasses.dataclass(frozen=True)
class Example:
  """One corpus pair; `key` decides the split, `source` labels it in stats.json."""
  source: str
  key: str
  inputs: str
  targets: str


def ddtp_ende_examples(md5: str, en: str, de: str, split_key: str) -> List[Example]:
  """Aligned EN->DE pieces of one description pair.

  Always the synopsis pair; when both long descriptions have the same number of
  paragraphs, each paragraph pair, itself split into sentence pairs when both sides have
  the same (>1) number of sentences.
  """
  del md5
  en_syn, en_paras = split_description(en)
  de_syn, de_paras = split_description(de)
  out = [Example('ddtp_synopsis', split_key, en_syn, de_syn)]
  if len(en_paras) == len(de_paras):
    for en_p, de_p in zip(en_paras, de_paras):
      en_s, de_s = split_sentences(en_p), split_sentences(de_p)
      if len(en_s) == len(de_s) > 1:
        out.extend(Example('ddtp_sentence', split_key, a, b) for a, b in zip(en_s, de_s))
      else:
        out.append(Example('ddtp_paragraph', split_key, en_p, de_p))
  return out


def ddtp_summary_example(en: str, split_key: str, min_words: int = 40) -> Optional[Example]:
  """English long description -> synopsis, if the description has >= min_words words."""
  synopsis, paras = split_description(en)
  document = ' '.join(paras)
  if word_count(document) < min_words:
    return None
  return Example('ddtp_summary', split_key, document, synopsis)


# ----------------------------------------------------------------------------- Ding

_DING_ANNOTATION = re.compile(r'\s*(\{[^}]*\}|\[[^\]]*\])')
_SENTENCE_LIKE = re.compile(r'^["„“‘(]?[A-ZÄÖÜ0-9].*[.!?]["“”’)]?$')


def _ding_clean(text: str) -> str:
  return normalize(_DING_ANNOTATION.sub('', text))


def _is_sentence(text: str) -> bool:
  return word_count(text) >= 3 and bool(_SENTENCE_LIKE.match(text))


def ding_examples(lines: Iterable[str]) -> List[Example]:
  """Example-sentence pairs from Ding 'German | ... :: English | ...' lines (EN->DE).

  The ' | ' pieces of both sides are aligned by position; a pair is kept when both
  pieces are sentences (capitalised, end in .!?, >= 3 words) after dropping {gender}
  and [label] annotations. Alternatives ('; ') pair by position when both sides list
  the same number, otherwise the first of each. The split key is the entry's headword.
  """
  out = []
  for line in lines:
    line = line.rstrip('\n')
    if not line or line.startswith('#') or ' :: ' not in line:
      continue
    de_side, en_side = line.split(' :: ', 1)
    de_pieces, en_pieces = de_side.split(' | '), en_side.split(' | ')
    if len(de_pieces) != len(en_pieces):
      continue
    key = 'ding:' + _ding_clean(de_pieces[0].split(';')[0])
    for de_piece, en_piece in zip(de_pieces, en_pieces):
      de_alts = [_ding_clean(a) for a in de_piece.split('; ')]
      en_alts = [_ding_clean(a) for a in en_piece.split('; ')]
      if len(de_alts) != len(en_alts):
        de_alts, en_alts = de_alts[:1], en_alts[:1]
      for de, en in zip(de_alts, en_alts):
        if _is_sentence(de) and _is_sentence(en):
          out.append(Example('ding', key, en, de))
  return out


# -------------------------------------------------------------------------- gettext

_MO_MAGIC_LE, _MO_MAGIC_BE = 0x950412de, 0xde120495
_CHARSET = re.compile(r'charset=([\w.-]+)', re.IGNORECASE)


def parse_mo(data: bytes) -> List[Tuple[Optional[str], str, str, bool]]:
  """A GNU .mo catalog -> [(msgctxt, msgid, msgstr, is_plural)] (header entry dropped).

  Format: magic, revision, N, offset of original table, offset of translation table;
  each table holds N (length, offset) pairs. msgctxt is joined to msgid by '\\x04',
  plural forms by '\\x00'.
  """
  (magic,) = struct.unpack('<I', data[:4])
  if magic == _MO_MAGIC_LE:
    endian = '<'
  elif magic == _MO_MAGIC_BE:
    endian = '>'
  else:
    raise ValueError('not a .mo file (bad magic)')
  _, n, orig_off, trans_off = struct.unpack(endian + '4I', data[4:20])
  raw = []
  for i in range(n):
    olen, ooff = struct.unpack(endian + '2I', data[orig_off + 8 * i:orig_off + 8 * i + 8])
    tlen, toff = struct.unpack(endian + '2I', data[trans_off + 8 * i:trans_off + 8 * i + 8])
    raw.append((data[ooff:ooff + olen], data[toff:toff + tlen]))
  charset = 'utf-8'
  for msgid, msgstr in raw:
    if msgid == b'':
      match = _CHARSET.search(msgstr.decode('ascii', 'replace'))
      if match and match.group(1).upper() != 'CHARSET':
        charset = match.group(1)
  out = []
  for msgid, msgstr in raw:
    if msgid == b'':
      continue
    ctxt = None
    if b'\x04' in msgid:
      ctxt_b, msgid = msgid.split(b'\x04', 1)
      ctxt = ctxt_b.decode(charset, 'replace')
    plural = b'\x00' in msgid
    out.append((ctxt, msgid.decode(charset, 'replace'), msgstr.decode(charset, 'replace'),
                plural))
  return out


_FORMAT = re.compile(r'%(\d+\$)?[-+ #0\']*\d*(\.\d+)?(hh|h|ll|l|L|q|j|z|t)?[a-zA-Z%]|'
                     r'%\([^)]*\)[a-z]|\$\{[^}]*\}|\{[^}]*\}|%[A-Z_]+%')
_MNEMONIC = re.compile(r'(?<![\w&_])[_&](?=\w)')
_MARKUP = re.compile(r'<[^>]*>|&\w+;')
_ALPHA_WORD = re.compile(r"^[^\W\d_][\w'’-]*[.,:;!?)]*$")


def clean_message(text: str) -> str:
  """Drops GTK/Qt mnemonic markers ('_Open', '&Open') and normalises whitespace."""
  return normalize(_MNEMONIC.sub('', text))


def mo_examples(entries: Sequence[Tuple[Optional[str], str, str, bool]],
                min_words: int = 3, max_words: int = 60) -> List[Example]:
  """Filters a catalog into EN->DE pairs.

  Skips plural entries, untranslated or identical strings, markup, messages with fewer
  than `min_words` alphabetic words once format directives are removed (format-only or
  very short), and messages over `max_words` words (mostly --help option tables).
  """
  out = []
  for _, msgid, msgstr, plural in entries:
    if plural or not msgstr or '\x00' in msgstr:
      continue
    if _MARKUP.search(msgid) or _MARKUP.search(msgstr):
      continue
    en, de = clean_message(msgid), clean_message(msgstr)
    if not en or not de or en == de or word_count(en) > max_words:
      continue
    words = [w for w in _FORMAT.sub(' ', en).split() if _ALPHA_WORD.match(w)]
    if len(words) < min_words:
      continue
    out.append(Example('gettext', 'mo:' + en.lower(), en, de))
  return out


# ------------------------------------------------------------------- split / dedup


def split_of(key: str, validation_pct: float = 2.0, test_pct: float = 2.0) -> str:
  """Deterministic split from a hash of the split key (package name etc.)."""
  bucket = int(hashlib.sha256(key.encode('utf-8')).hexdigest()[:8], 16) % 10000 / 100.0
  if bucket < test_pct:
    return 'test'
  if bucket < test_pct + validation_pct:
    return 'validation'
  return 'train'


def dedup(examples: Iterable[Example]) -> Tuple[List[Example], Dict[str, int]]:
  """Keeps the first example per (whitespace-normalised, case-folded) input text.

  Also drops examples with an empty side. Deduping on inputs (rather than pairs) means
  no input text can appear in two splits.
  """
  seen = set()
  kept, dropped = [], collections.Counter()
  for ex in examples:
    inputs, targets = normalize(ex.inputs), normalize(ex.targets)
    if not inputs or not targets:
      dropped['empty'] += 1
      continue
    fold = inputs.casefold()
    if fold in seen:
      dropped['duplicate'] += 1
      continue
    seen.add(fold)
    kept.append(dataclasses.replace(ex, inputs=inputs, targets=targets))
  return kept, dict(dropped)


def assign_splits(examples: Sequence[Example],
                  seed: int = 0) -> Dict[str, List[Example]]:
  """Groups examples by split_of(key); each split is shuffled with a fixed seed."""
  out: Dict[str, List[Example]] = {s: [] for s in SPLITS}
  for ex in examples:
    out[split_of(ex.key)].append(ex)
  for split in SPLITS:
    random.Random(f'{seed}-{split}').shuffle(out[split])
  return out


def write_tsv(path: pathlib.Path, pairs: Iterable[Tuple[str, str]]) -> int:
  """Writes 'inputs<TAB>targets' lines (tabs/newlines inside text become spaces)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  n = 0
  with open(path, 'w', encoding='utf-8') as f:
    for inputs, targets in pairs:
      f.write(f'{normalize(inputs)}\t{normalize(targets)}\n')
      n += 1
  return n


def read_tsv(path: pathlib.Path) -> List[Tuple[str, str]]:
  with open(path, encoding='utf-8') as f:
    return [tuple(line.rstrip('\n').split('\t', 1)) for line in f if line.strip()]
