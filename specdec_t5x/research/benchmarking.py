"""Result-file helpers of the research scripts: the environment record and atomic JSON/text writes."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from typing import Any, Dict

import jax

from specdec_t5x.integration import run_dir


def environment() -> Dict[str, Any]:
  """Machine, device and code revision, recorded in every results file."""
  rev = run_dir.git_revision() or 'unknown'
  dev = jax.devices()[0]
  return {'git_revision': rev, 'device_kind': dev.device_kind, 'platform': dev.platform,
          'num_devices': jax.device_count(), 'cpu_count': os.cpu_count(),
          'machine': platform.machine(), 'python': platform.python_version(),
          'jax': jax.__version__}


def write_json(path: str, data: Any) -> None:
  """Atomic JSON write (temp file + rename)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix='.tmp')
  with os.fdopen(fd, 'w') as f:
    json.dump(data, f, indent=2, default=float)
    f.write('\n')
  os.replace(tmp, path)


def write_text(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix='.tmp')
  with os.fdopen(fd, 'w') as f:
    f.write(text)
  os.replace(tmp, path)
