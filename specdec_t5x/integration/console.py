"""The command line's start-up without the lines TensorFlow, CUDA and absl print while
TensorFlow loads (`python -m specdec_t5x.infer` only: specdec_t5x/infer.py uses it).

On a machine without a GPU, importing TensorFlow 2.x prints absl's pre-init banner, the
oneDNN notice and "Could not find cuda drivers" (twice: two of its libraries log), and its
first device query "failed call to cuInit". TF_CPP_MIN_LOG_LEVEL does not reach the
import-time lines (static initialisers log them before it is read; measured on TF 2.21), so
`quiet_start` also sends file descriptor 2 to a temporary file while TensorFlow loads and
lists its devices, then writes back every line but those (`is_noise`): Python's warnings,
this package's logging, tracebacks and any other error pass through, in order.

Importing this module changes nothing and imports the standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

LEVEL = 'TF_CPP_MIN_LOG_LEVEL'  # TensorFlow's and XLA's C++ logging: 0 all, 1 no INFO, ...
DEFAULT_LEVEL = '1'  # the command line's, unless the user set one: TF's INFO lines off

_HEAD = r'(?:[{s}]\d{{4}} [\d:.]+ +\d+|\d{{4}}-\d\d-\d\d [\d:.]+: [{s}]) [\w/.-]+:\d+\] '
_NOISE = re.compile('|'.join((
    r'WARNING: All log messages before absl::InitializeLog\(\) is called are written to '
    r'STDERR$',  # absl's pre-init banner, once per library that logs
    _HEAD.format(s='IW'),  # C++ INFO and WARNING lines (absl's format, or TSL's older one)
    _HEAD.format(s='E') + r'(?:failed call to cuInit|Unable to register cu\w+ factory)',
    r'To enable the following instructions: .*rebuild TensorFlow',  # an INFO's 2nd line
)))


def is_noise(line: str) -> bool:
  """Whether `line`, written while TensorFlow loads, is one of its start-up lines (INFO or
  WARNING of its C++ libraries, absl's banner, CUDA's absence) and not this package's."""
  return bool(_NOISE.match(line)) and 'specdec_t5x' not in line


@contextlib.contextmanager
def quiet_start() -> Iterator[None]:
  """Inside the block (the import of the runner, which loads TensorFlow), and while
  TensorFlow then lists its devices on leaving it, file descriptor 2 goes to a temporary
  file; afterwards its lines are written to stderr but `is_noise`'s. Sets
  TF_CPP_MIN_LOG_LEVEL to DEFAULT_LEVEL for the rest of the run unless it is set; a user's
  TF_CPP_MIN_LOG_LEVEL=0 (show everything) turns the filter off."""
  if os.environ.setdefault(LEVEL, DEFAULT_LEVEL) == '0':
    yield
    return
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # no stderr: nothing to filter
    yield
    return
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield
      tf = sys.modules.get('tensorflow')
      if tf is not None:  # its first device query logs CUDA's absence: here, not mid-run
        tf.config.list_physical_devices()
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      lines = capture.read().decode('utf-8', 'replace').splitlines(keepends=True)
      sys.stderr.write(''.join(line for line in lines if not is_noise(line)))
      sys.stderr.flush()
