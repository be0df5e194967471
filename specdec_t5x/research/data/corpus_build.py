"""Builds the offline corpus of corpus.py: apt/dpkg fetching, splits, samples, vocabulary.

`build_corpus` fetches Debian's translated descriptions, the Ding dictionary and gettext
catalogs with apt (from Debian's own mirrors; see data/README.md), parses them with
corpus.py's pure functions, deduplicates, splits by source package, and writes TSVs;
`write_demo` samples the committed test files, `train_vocab` the SentencePiece model and
`export_npz` the token arrays that scripts/train.py reads. The apt/dpkg steps are thin
subprocess wrappers.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import random
import shutil
import subprocess
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

import numpy as np
import tqdm

from specdec_t5x.research.data.corpus import (TASK_PREFIXES, Example, assign_splits, dedup, ddtp_ende_examples,
                                ddtp_summary_example, ding_examples, mo_examples, parse_mo,
                                parse_packages_sources, parse_translation, read_tsv,
                                word_count, write_tsv)

MIRROR = 'http://deb.debian.org/debian'
KEYRING = '/usr/share/keyrings/debian-archive-keyring.gpg'
# (suite, components). Older suites (buster and before) left deb.debian.org.
SUITES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('sid', ('main', 'contrib', 'non-free', 'non-free-firmware')),
    ('trixie', ('main', 'contrib', 'non-free', 'non-free-firmware')),
    ('bookworm', ('main', 'contrib', 'non-free', 'non-free-firmware')),
    ('bullseye', ('main', 'contrib', 'non-free')),
)
DING_PACKAGE = 'trans-de-en'
GETTEXT_SUITE = 'bookworm'
# Debian packages (bookworm) that ship usr/share/locale/de/LC_MESSAGES/*.mo.
GETTEXT_PACKAGES: Tuple[str, ...] = (
    'apt', 'aptitude-common', 'audacity-data', 'baobab', 'bash', 'binutils-common',
    'bison', 'brasero-common', 'cheese-common', 'claws-mail-i18n', 'coreutils',
    'debconf-i18n', 'diffutils', 'dpkg', 'e2fsprogs-l10n', 'eog', 'evince-common',
    'evolution-common', 'file-roller', 'filezilla-common', 'findutils', 'freeciv-data',
    'gawk', 'gcc-12-locales', 'geany-common', 'gedit-common', 'gettext', 'gettext-base',
    'gimp-data', 'git', 'gnome-calculator', 'gnome-control-center-data',
    'gnome-disk-utility', 'gnome-maps', 'gnome-shell-common', 'gnome-software-common',
    'gnome-terminal-data', 'gnucash-common', 'gnupg-l10n', 'gramps', 'grep',
    'hexchat-common', 'inkscape', 'iso-codes', 'kdeconnect', 'libc-l10n',
    'libglib2.0-data', 'libgphoto2-l10n', 'libgtk-3-common', 'libgtk2.0-common',
    'libpam-runtime', 'libsane-common', 'login', 'm4', 'make', 'meld', 'mutt', 'nano',
    'nautilus-data', 'network-manager', 'okular', 'pidgin-data', 'procps', 'psmisc',
    'pulseaudio', 'remmina-common', 'rhythmbox-data', 'sed', 'synaptic', 'tar',
    'tasksel-data', 'texinfo', 'thunar-data', 'totem-common', 'util-linux-locales',
    'vlc-l10n', 'wget', 'xfce4-panel', 'xfce4-session', 'xkb-data',
)
REQUIRED_TOOLS = ('apt-get', '/usr/lib/apt/apt-helper', 'dpkg-deb')


# ---------------------------------------------------------------------- apt / dpkg


def check_tools() -> None:
  """Raises a clear error when the apt/dpkg tools this builder needs are missing."""
  missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None and not os.access(t, os.X_OK)]
  if missing:
    raise RuntimeError(
        f'build_corpus needs Debian\'s apt and dpkg tools; missing: {", ".join(missing)}. '
        'Run it on Debian/Ubuntu with the apt and dpkg packages installed.')


def write_apt_config(work_dir: pathlib.Path,
                     suites: Sequence[Tuple[str, Sequence[str]]] = SUITES) -> pathlib.Path:
  """A private apt setup under work_dir that fetches Translation-en and Translation-de.

  The system's apt.conf.d is not read (Dir::Etc::Parts points at an empty dir), so a
  container's 'Acquire::Languages "none"' cannot interfere; languages are cleared then
  set to "en", "de". Indexes are kept lz4-compressed (read with apt-helper cat-file).
  """
  work_dir = work_dir.resolve()
  for d in ('lists/partial', 'cache/archives/partial', 'empty'):
    (work_dir / d).mkdir(parents=True, exist_ok=True)
  sources = ''.join(
      f'deb [signed-by={KEYRING}] {MIRROR} {suite} {" ".join(comps)}\n'
      for suite, comps in suites)
  (work_dir / 'sources.list').write_text(sources)
  conf = f'''Dir::Etc::Parts "{work_dir}/empty";
Dir::Etc::SourceList "{work_dir}/sources.list";
Dir::Etc::SourceParts "{work_dir}/empty";
Dir::State::Lists "{work_dir}/lists";
Dir::Cache "{work_dir}/cache";
APT::Architectures {{ "amd64"; }};
APT::Sandbox::User "root";
#clear Acquire::Languages;
Acquire::Languages {{ "en"; "de"; }};
Acquire::Check-Valid-Until "false";
Acquire::GzipIndexes "true";
Acquire::CompressionTypes::Order {{ "lz4"; "xz"; "gz"; }};
'''
  path = work_dir / 'apt.conf'
  path.write_text(conf)
  return path


def _apt_env(conf: pathlib.Path) -> Dict[str, str]:
  return dict(os.environ, APT_CONFIG=str(conf), LC_ALL='C')


def apt_update(conf: pathlib.Path) -> str:
  """`apt-get update` with the private config; errors for single suites are tolerated."""
  proc = subprocess.run(['apt-get', 'update'], env=_apt_env(conf), capture_output=True,
                        text=True, check=False)
  return proc.stdout + proc.stderr


def cat_file(path: pathlib.Path) -> str:
  """Reads a (possibly .lz4/.xz/.gz compressed) index file via apt-helper cat-file."""
  proc = subprocess.run(['/usr/lib/apt/apt-helper', 'cat-file', str(path)],
                        capture_output=True, check=True)
  return proc.stdout.decode('utf-8', 'replace')


def list_index(lists_dir: pathlib.Path, suite: str, kind: str) -> List[pathlib.Path]:
  """Index files of a suite, sorted; kind is 'Translation-en', 'Translation-de', 'Packages'."""
  pattern = (f'*_dists_{suite}_*_binary-amd64_Packages*' if kind == 'Packages'
             else f'*_dists_{suite}_*_i18n_{kind}*')
  return sorted(p for p in lists_dir.glob(pattern) if not p.name.endswith('.diff'))


def apt_download(conf: pathlib.Path, package: str, dest: pathlib.Path) -> pathlib.Path:
  """`apt-get download package` into dest (reused when already there)."""
  dest.mkdir(parents=True, exist_ok=True)
  name = package.split('/')[0]
  found = sorted(dest.glob(f'{name}_*.deb'))
  if found:
    return found[-1]
  subprocess.run(['apt-get', 'download', '-q', package], cwd=dest, env=_apt_env(conf),
                 capture_output=True, check=True)
  found = sorted(dest.glob(f'{name}_*.deb'))
  if not found:
    raise RuntimeError(f'apt-get download {package} produced no .deb')
  return found[-1]


def deb_extract(deb: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
  shutil.rmtree(dest, ignore_errors=True)
  dest.mkdir(parents=True)
  subprocess.run(['dpkg-deb', '-x', str(deb), str(dest)], check=True)
  return dest


# --------------------------------------------------------------------------- build


def _collect_ddtp(lists_dir: pathlib.Path, suites: Sequence[str]):
  """(en by md5, de by md5, binary->source) over suites, newest suite first wins."""
  en: Dict[str, Tuple[str, str]] = {}
  de: Dict[str, Tuple[str, str]] = {}
  sources: Dict[str, str] = {}
  files = [(s, kind, p) for s in suites
           for kind in ('Packages', 'Translation-en', 'Translation-de')
           for p in list_index(lists_dir, s, kind)]
  for _, kind, path in tqdm.tqdm(files, desc='parse apt indexes', unit='file'):
    text = cat_file(path)
    if kind == 'Packages':
      for k, v in parse_packages_sources(text).items():
        sources.setdefault(k, v)
    else:
      target = en if kind == 'Translation-en' else de
      for k, v in parse_translation(text, kind.split('-')[1]).items():
        target.setdefault(k, v)
  return en, de, sources


def build_corpus(out_dir: pathlib.Path, work_dir: pathlib.Path, update: bool = True,
                 gettext_packages: Sequence[str] = GETTEXT_PACKAGES,
                 suites: Sequence[Tuple[str, Sequence[str]]] = SUITES,
                 seed: int = 0) -> dict:
  """Fetches the Debian sources, writes {ende,summarize}/{split}.tsv; returns stats."""
  check_tools()
  start = time.time()
  conf = write_apt_config(work_dir, suites)
  lists_dir = work_dir.resolve() / 'lists'
  if update:
    log = apt_update(conf)
    (work_dir / 'apt-update.log').write_text(log)
  suite_names = [s for s, _ in suites]
  answered = [s for s in suite_names if list_index(lists_dir, s, 'Translation-en')]
  if not answered:
    raise RuntimeError(f'apt-get update fetched no Translation-en; see {work_dir}/apt-update.log')
  en, de, sources = _collect_ddtp(lists_dir, answered)

  def key_of(package: str) -> str:
    return 'pkg:' + sources.get(package, package)

  ende: List[Example] = []
  for md5 in sorted(de):
    if md5 in en:
      package = en[md5][0]
      ende.extend(ddtp_ende_examples(md5, en[md5][1], de[md5][1], key_of(package)))
  summarize: List[Example] = []
  for md5 in sorted(en):
    ex = ddtp_summary_example(en[md5][1], key_of(en[md5][0]))
    if ex:
      summarize.append(ex)

  debs = work_dir / 'debs'
  ding_deb = apt_download(conf, f'{DING_PACKAGE}/{GETTEXT_SUITE}', debs)
  ding_dir = deb_extract(ding_deb, work_dir / 'extract' / DING_PACKAGE)
  with open(ding_dir / 'usr/share/trans/de-en', encoding='utf-8') as f:
    ende.extend(ding_examples(f))
  shutil.rmtree(ding_dir)

  gettext_counts = {}
  for package in tqdm.tqdm(sorted(gettext_packages), desc='gettext packages', unit='deb'):
    deb = apt_download(conf, f'{package}/{GETTEXT_SUITE}', debs)
    root = deb_extract(deb, work_dir / 'extract' / package)
    n = 0
    for mo in sorted(root.glob('usr/share/locale/de/LC_MESSAGES/*.mo')):
      examples = mo_examples(parse_mo(mo.read_bytes()))
      ende.extend(examples)
      n += len(examples)
    gettext_counts[package] = n
    shutil.rmtree(root)  # Only the .debs are cached; extracted trees run to ~1.5 GB.

  stats = {'suites': answered, 'gettext_packages': gettext_counts,
           'ddtp_descriptions': {'en': len(en), 'de': len(de),
                                 'paired': len(set(en) & set(de))}}
  for task, examples in (('ende', ende), ('summarize', summarize)):
    kept, dropped = dedup(examples)
    splits = assign_splits(kept, seed)
    counts: Dict[str, Dict[str, int]] = collections.defaultdict(dict)
    for split, rows in splits.items():
      write_tsv(out_dir / task / f'{split}.tsv', ((e.inputs, e.targets) for e in rows))
      per_source = collections.Counter(e.source for e in rows)
      for source, n in sorted(per_source.items()):
        counts[source][split] = n
      counts['total'][split] = len(rows)
    stats[task] = {'counts': dict(counts), 'dropped': dropped,
                   'leaked_keys': _leaked_keys(splits)}
  stats['build_seconds'] = round(time.time() - start, 1)
  return stats


def _leaked_keys(splits: Dict[str, List[Example]]) -> int:
  keys = [set(e.key for e in rows) for rows in splits.values()]
  return sum(len(a & b) for i, a in enumerate(keys) for b in keys[i + 1:])


# ----------------------------------------------------------------------- samples


def sample_demo(rows: Sequence[Tuple[str, str]], n: int, min_words: int, max_words: int,
                seed: int = 0) -> List[Tuple[str, str]]:
  """n rows (fixed seed), preferring inputs of min_words..max_words words."""
  preferred = [r for r in rows if min_words <= word_count(r[0]) <= max_words]
  chosen = set(preferred)
  rest = [r for r in rows if r not in chosen] if len(preferred) < n else []
  rng = random.Random(seed)
  picked = rng.sample(preferred, min(n, len(preferred)))
  if len(picked) < n:
    picked += rng.sample(rest, min(n - len(picked), len(rest)))
  return picked


def write_demo(out_dir: pathlib.Path, demo_dir: pathlib.Path, n: int = 300) -> Dict[str, int]:
  """data/demo/{ende,summarize}_test.tsv: samples of the test split."""
  ende = sample_demo(read_tsv(out_dir / 'ende' / 'test.tsv'), n, 5, 40)
  summ = sample_demo(read_tsv(out_dir / 'summarize' / 'test.tsv'), n, 0, 200)
  return {'ende': write_tsv(demo_dir / 'ende_test.tsv', ende),
          'summarize': write_tsv(demo_dir / 'summarize_test.tsv', summ)}


# ---------------------------------------------------------------------- vocabulary


def train_vocab(out_dir: pathlib.Path, model_prefix: pathlib.Path, vocab_size: int = 8000,
                seed: int = 0) -> dict:
  """SentencePiece unigram model on the train split (both tasks, prefixes included).

  T5 conventions: pad=0, eos=1, unk=2, no bos, no byte fallback.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  model_prefix.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    text = pathlib.Path(tmp) / 'train.txt'
    n = 0
    with open(text, 'w', encoding='utf-8') as f:
      for task, prefix in TASK_PREFIXES.items():
        for inputs, targets in read_tsv(out_dir / task / 'train.tsv'):
          f.write(prefix + inputs + '\n' + targets + '\n')
          n += 2
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(model_prefix), vocab_size=vocab_size,
        model_type='unigram', character_coverage=0.9999, pad_id=0, eos_id=1, unk_id=2,
        bos_id=-1, byte_fallback=False, input_sentence_size=0,
        max_sentence_length=20000, num_threads=os.cpu_count() or 1,
        minloglevel=2)
  return {'lines': n, 'vocab_size': vocab_size, 'model': f'{model_prefix}.model'}


def encode_task(sp, rows: Sequence[Tuple[str, str]], prefix: str, input_len: int = 128,
                target_len: int = 64, eos_id: int = 1):
  """Tokenised, EOS-terminated, truncated (EOS kept as the last token), 0-padded arrays."""
  inputs = np.zeros((len(rows), input_len), np.int32)
  targets = np.zeros((len(rows), target_len), np.int32)
  inp_ids = sp.encode([prefix + r[0] for r in rows])
  tgt_ids = sp.encode([r[1] for r in rows])
  trunc_in = trunc_tgt = 0
  tokens_in = tokens_tgt = 0
  for i, (a, b) in enumerate(zip(inp_ids, tgt_ids)):
    tokens_in += len(a) + 1
    tokens_tgt += len(b) + 1
    trunc_in += len(a) + 1 > input_len
    trunc_tgt += len(b) + 1 > target_len
    a = a[:input_len - 1] + [eos_id]
    b = b[:target_len - 1] + [eos_id]
    inputs[i, :len(a)] = a
    targets[i, :len(b)] = b
  stats = {'examples': len(rows), 'truncated_inputs': int(trunc_in),
           'truncated_targets': int(trunc_tgt), 'input_tokens': int(tokens_in),
           'target_tokens': int(tokens_tgt)}
  return inputs, targets, stats


def export_npz(out_dir: pathlib.Path, npz_dir: pathlib.Path, vocab_model: pathlib.Path,
               splits: Sequence[str] = ('train', 'validation')) -> dict:
  """{task}_{split}.npz with int32 `inputs` [N, 128] and `targets` [N, 64]; returns stats."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_file=str(vocab_model))
  npz_dir.mkdir(parents=True, exist_ok=True)
  stats = {}
  jobs = [(t, s) for t in TASK_PREFIXES for s in splits]
  for task, split in tqdm.tqdm(jobs, desc='tokenise', unit='file'):
    rows = read_tsv(out_dir / task / f'{split}.tsv')
    inputs, targets, st = encode_task(sp, rows, TASK_PREFIXES[task])
    np.savez_compressed(npz_dir / f'{task}_{split}.npz', inputs=inputs, targets=targets)
    stats[f'{task}_{split}'] = st
  return stats


def dump_json(path: pathlib.Path, obj: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj, indent=2, sort_keys=True) + '\n')
