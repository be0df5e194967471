"""Where the offline demo's files are: vocabulary, corpus, held-out sample, checkpoints.

The library holds no path into a checkout. Every location here is relative to a root
directory, taken from the caller's argument, else from $SPECDEC_DEMO_ROOT, else the
current directory (the repository root in every README command):

  <root>/data/vocab/demo_spm.model       the demo SentencePiece vocabulary (8000 pieces)
  <root>/data/corpus/{task}/{split}.tsv  the built corpus (scripts/build_data.py corpus)
  <root>/data/demo/{task}_test.tsv       the committed held-out sample
  <root>/checkpoints/demo/<name>         the committed demo checkpoints and n-gram drafts

Resolving a path reads nothing; `require` checks that a file exists and otherwise raises
FileNotFoundError naming it and how to point the demo elsewhere.
"""

from __future__ import annotations

import os
import pathlib
from typing import Optional, Union

ROOT_ENV = 'SPECDEC_DEMO_ROOT'
VOCAB = os.path.join('data', 'vocab', 'demo_spm.model')
CORPUS = os.path.join('data', 'corpus')
SAMPLE = os.path.join('data', 'demo')
CHECKPOINTS = os.path.join('checkpoints', 'demo')

PathLike = Union[str, os.PathLike]


def root(directory: Optional[PathLike] = None) -> str:
  """The demo root: `directory`, else $SPECDEC_DEMO_ROOT, else the current directory
  (absolute, so that a later chdir changes nothing)."""
  chosen = directory if directory is not None else os.environ.get(ROOT_ENV) or os.curdir
  return os.path.abspath(os.fspath(chosen))


def vocab_path(directory: Optional[PathLike] = None) -> str:
  """The demo vocabulary, `<root>/data/vocab/demo_spm.model`."""
  return os.path.join(root(directory), VOCAB)


def corpus_dir(directory: Optional[PathLike] = None) -> str:
  """The built corpus, `<root>/data/corpus` (holding `{ende,summarize}/{split}.tsv`)."""
  return os.path.join(root(directory), CORPUS)


def sample_dir(directory: Optional[PathLike] = None) -> str:
  """The committed held-out samples, `<root>/data/demo` (`{ende,summarize}_test.tsv`)."""
  return os.path.join(root(directory), SAMPLE)


def checkpoints_dir(directory: Optional[PathLike] = None) -> str:
  """The committed demo models, `<root>/checkpoints/demo`."""
  return os.path.join(root(directory), CHECKPOINTS)


def checkpoint(name: str, directory: Optional[PathLike] = None) -> str:
  """One demo model's directory (or n-gram draft file) under checkpoints/demo, which
  must exist, e.g. checkpoint('demo_target/checkpoint_2239')."""
  return require(os.path.join(checkpoints_dir(directory), name), f'demo checkpoint {name!r}')


def require(path: PathLike, what: str = 'demo file') -> str:
  """Returns `path` if it exists; else raises FileNotFoundError naming it.

  Raises:
    FileNotFoundError: the path does not exist; the message says how the demo root is
      chosen, so that a run from the wrong directory is obvious.
  """
  path = os.fspath(path)
  if not pathlib.Path(path).exists():
    raise FileNotFoundError(
        f'The {what} {path} does not exist. Demo files are looked up under a root '
        f'directory: the argument given, else ${ROOT_ENV}, else the current directory; run '
        f'from the repository root or set {ROOT_ENV}=<repository root>.')
  return path
