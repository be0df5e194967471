"""Model files wherever T5X reads them: local paths and URLs (gs://bucket/dir, ...).

T5X reads checkpoints through tf.io.gfile and their zarr arrays through tensorstore with
the kvstore driver of their location ('gcs' for gs://). The same here: a URL's file
operations go through etils.epath (tf.io.gfile for gs:// where TensorFlow is installed,
as Orbax does; fsspec otherwise), its arrays through the kvstore tensorstore parses from
the URL (`kvstore`). A local path is read with the standard library and made absolute, as
before; a URL is kept as written, so every error names it exactly.
"""

from __future__ import annotations

import os
import posixpath
import urllib.parse
from typing import Any, Optional

import tensorstore as ts
from etils import epath


def is_url(path: Any) -> bool:
  """Whether `path` names a remote location (scheme://...) rather than a local path."""
  return '://' in os.fspath(path)


def _split(url: str) -> tuple[str, str]:
  scheme, rest = url.split('://', 1)
  return scheme + '://', rest


def resolve(path: Any) -> str:
  """A local path made absolute; a URL as given, without a trailing '/'."""
  path = os.fspath(path)
  if not is_url(path):
    return os.path.abspath(path)
  prefix, rest = _split(path)
  return prefix + rest.rstrip('/')


def join(path: str, *names: str) -> str:
  return (posixpath if is_url(path) else os.path).join(path, *names)


def dirname(path: str) -> str:
  """The parent directory (a bucket's root is its own parent)."""
  if not is_url(path):
    return os.path.dirname(path)
  prefix, rest = _split(path.rstrip('/'))
  parent = posixpath.dirname(rest)
  return prefix + parent if parent else path


def _remote(path: str, operation: str, *args: Any) -> Any:
  """epath.Path(path).<operation>(*args); a failure other than a missing file (no access,
  no connection) becomes an OSError that names `path`."""
  try:
    return getattr(epath.Path(path), operation)(*args)
  except FileNotFoundError:
    raise
  except Exception as e:  # The filesystem client's own types (tf.errors, fsspec's).
    raise OSError(f'Cannot read {path}: {type(e).__name__}: {e}') from e


def exists(path: str) -> bool:
  return _remote(path, 'exists') if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _remote(path, 'is_dir') if is_url(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return _remote(path, 'is_file') if is_url(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  if not is_url(path):
    return os.listdir(path)
  return [child.name for child in _remote(path, 'iterdir')]


def read_bytes(path: str) -> bytes:
  if not is_url(path):
    with open(path, 'rb') as f:
      return f.read()
  return _remote(path, 'read_bytes')


def read_text(path: str) -> str:
  return read_bytes(path).decode('utf-8')


def stat(path: str) -> tuple[float, int]:
  """(modification time, size in bytes) of a file."""
  if not is_url(path):
    st = os.stat(path)
    return st.st_mtime, st.st_size
  st = _remote(path, 'stat')
  return float(st.mtime), int(st.length)


def inside(root: str, rel: str) -> Optional[str]:
  """`root`/`rel` normalised, or None unless that is strictly inside `root` (`rel` is
  absolute, a URL, or climbs out with '..')."""
  if os.path.isabs(rel) or rel.startswith('/') or is_url(rel):
    return None
  if is_url(root):
    prefix, base = _split(root)
    paths = posixpath
  else:
    prefix, base, paths = '', root, os.path
  full = paths.normpath(paths.join(base, rel))
  if paths.commonpath([base, full]) != paths.normpath(base) or full == paths.normpath(base):
    return None
  return prefix + full


def kvstore(directory: str) -> dict[str, Any]:
  """The tensorstore kvstore spec of a directory: the 'file' driver for a local path, the
  driver tensorstore parses from a URL ('gcs' for gs://bucket/path, 's3', ...)."""
  if not is_url(directory):
    return {'driver': 'file', 'path': directory.rstrip('/') + '/'}
  prefix, rest = _split(directory)
  location, _, path = rest.partition('/')
  url = prefix + location + '/' + urllib.parse.quote(path.rstrip('/') + '/', safe='/')
  return ts.KvStore.Spec(url).to_json()
