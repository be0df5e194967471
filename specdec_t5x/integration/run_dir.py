"""Guards for an inference output directory: one runner at a time, one set of settings.

* `DirLock`: an exclusive `fcntl.flock` on `<output_dir>/.lock[-<shard>]` holding the
  holder's pid, host and start time; a second runner fails at once, naming the holder.
  The lock dies with its process (kill -9 included), so a stale file never blocks.
* `check_settings`: a directory whose recorded run (finished: metrics.json; unfinished:
  the chunk manifest) has other prediction-changing settings or other inputs (their
  count and SHA-256) is refused, unless the caller passes `overwrite=True` (gin:
  `infer.overwrite`).
"""

from __future__ import annotations

import datetime
import fcntl
import functools
import json
import os
import shutil
import socket
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union


def write_atomic(path: str, data: Union[str, bytes]) -> None:
  """Writes `data` (text as UTF-8, or bytes) to `path` through `path.tmp-<pid>`, flushed
  to disk and renamed into place: a reader sees the old file or the new one, never half.
  (Training removes leftover `*.tmp-*` files of a killed write on its next start.)"""
  tmp = f'{path}.tmp-{os.getpid()}'
  with open(tmp, 'wb') as f:
    f.write(data.encode('utf-8') if isinstance(data, str) else data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class DirLock:
  """Exclusive, non-blocking lock on a directory (a context manager).

  Args:
    directory: the directory to lock (created if missing).
    name: lock file name inside it (one per shard, so shards of a run share a directory).
  """

  def __init__(self, directory: str, name: str = '.lock'):
    self.path = os.path.join(directory, name)
    self._fd: Optional[int] = None

  def acquire(self) -> 'DirLock':
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        holder = _read(fd) or 'holder unknown'
        os.close(fd)
        raise RuntimeError(
            f'{os.path.dirname(self.path)} is in use by another run ({holder}; lock file '
            f'{self.path}). Wait for it to finish or stop it, or use another output_dir.'
        ) from None
      try:  # The holder before us may have unlinked the file: lock the current one.
        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    os.ftruncate(fd, 0)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')
    os.write(fd, f'pid {os.getpid()} on host {socket.gethostname()}, since {started}'
             .encode())
    os.fsync(fd)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      os.unlink(self.path)  # Still locked: a waiting opener re-checks the inode.
    except FileNotFoundError:
      pass
    os.close(self._fd)
    self._fd = None

  def __enter__(self) -> 'DirLock':
    return self.acquire()

  def __exit__(self, *exc: Any) -> None:
    self.release()


def _read(fd: int) -> str:
  try:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode('utf-8', 'replace').strip()
  except OSError:
    return ''


def changed_keys(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> List[str]:
  """Keys whose JSON values differ (a missing key counts as changed)."""
  current = json.loads(json.dumps(current))
  return sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))


def check_settings(recorded: Optional[Mapping[str, Any]], current: Mapping[str, Any],
                   where: str, what: str) -> None:
  """Raises ValueError if `where` holds a `what` run whose settings differ from `current`.

  `recorded` None means the run recorded no settings (an older version wrote it): it
  cannot be shown to be the same run, so it is refused too.
  """
  changed = (changed_keys(recorded, current) if recorded is not None
             else ['(not recorded)'])
  if changed:
    inputs = ('; its inputs differ (the examples read for this shard: another '
              'task_data_dir, an edited source file, another split or num_examples)'
              if {'examples_sha256', 'num_examples'} & set(changed) else '')
    raise ValueError(
        f'{where} holds {what} run with other settings (changed: {changed}){inputs}; use '
        'another output_dir, or pass --gin.infer.overwrite=True to replace it.')


def lock_file_name(shard_id: int = 0, num_shards: int = 1) -> str:
  """One lock per shard: the shards of a sharded run may share one output_dir."""
  return '.lock' if num_shards == 1 else f'.lock-{shard_id:05}-of-{num_shards:05}'


def holds_output_dir_lock(fn):
  """Decorates a runner taking keyword arguments `output_dir` (and optionally `shard_id`,
  `num_shards`) to hold the directory's DirLock while it runs (on JAX process 0 only:
  the other hosts of a multi-host job write nothing)."""
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    import jax  # pylint: disable=g-import-not-at-top
    if jax.process_index() != 0 or not kwargs.get('output_dir'):
      return fn(*args, **kwargs)
    name = lock_file_name(kwargs.get('shard_id', 0), kwargs.get('num_shards', 1))
    with DirLock(kwargs['output_dir'], name):
      return fn(*args, **kwargs)
  return wrapper


def _differs(recorded: Optional[Mapping[str, Any]], settings: Mapping[str, Any]) -> bool:
  return recorded is None or bool(changed_keys(recorded, settings))


def finished_run(output_dir: str, metrics_name: str, settings: Mapping[str, Any],
                 overwrite: bool, tmp_dirs: Sequence[str] = ()) -> Optional[Dict[str, Any]]:
  """The recorded metrics if `output_dir` holds this run finished, else None (run it).

  A finished run (metrics file) with other settings raises (check_settings) unless
  `overwrite`, which removes it with its predictions, and any of `tmp_dirs` (unfinished
  chunks, with their manifest) made with other settings. A run with the same settings is
  never discarded: finished, it is returned (leftover `tmp_dirs` of a kill between writing
  the metrics and removing them go); unfinished, it resumes.
  """
  path = os.path.join(output_dir, metrics_name)
  metrics = None
  if os.path.isfile(path):
    with open(path, encoding='utf-8') as f:
      metrics = json.load(f)
  outputs = [] if metrics is None else [
      os.path.join(output_dir, m['predictions_file'])
      for m in (metrics, metrics.get('baseline') or {}) if m.get('predictions_file')]
  if metrics is not None and _differs(metrics.get('run_settings'), settings):
    if not overwrite:
      check_settings(metrics.get('run_settings'), settings, output_dir, 'a finished')
    for p in [path] + outputs:
      if os.path.isfile(p):
        os.remove(p)
    metrics = None
  for tmp in (os.path.join(output_dir, d) for d in tmp_dirs):
    manifest = os.path.join(tmp, 'progress.json')
    if overwrite and os.path.isfile(manifest):
      with open(manifest, encoding='utf-8') as f:
        if _differs(json.load(f).get('fingerprint'), settings):
          shutil.rmtree(tmp)
    if metrics is not None and all(os.path.isfile(p) for p in outputs):
      shutil.rmtree(tmp, ignore_errors=True)
  if metrics is None or not all(os.path.isfile(p) for p in outputs):
    return None  # Not finished (or its predictions were deleted since): run it.
  return metrics


def git_revision() -> Optional[str]:
  """The git revision of the installed package's checkout ('-dirty' if it has changes
  outside results/, which the result scripts themselves rewrite), or None when the
  package is not inside a git checkout."""
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    rev = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=here, capture_output=True,
                         text=True, timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no', '--',
                            ':/', ':(top,exclude)results'],
                           cwd=here, capture_output=True, text=True, timeout=10).stdout
    return rev + ('-dirty' if dirty.strip() else '')
  except (OSError, subprocess.SubprocessError):
    return None
