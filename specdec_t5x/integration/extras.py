"""Packages of the "test" extra, imported where a feature needs them.

The plain install (`pip install -e .`) holds what decoding, the runner and the demo need;
reading Hugging Face checkpoints and the peer benchmark also need PyTorch, Transformers,
safetensors or CTranslate2, which `pip install -e ".[test]"` adds. `need` imports one and,
where it is missing, says which feature wanted it and how to install it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL = 'pip install -e ".[test]"'


def need(module: str, feature: str) -> ModuleType:
  """The module named `module`, imported; ImportError naming `feature` and INSTALL when
  the plain install left it out."""
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f'{feature} needs the Python package {module.split(".")[0]!r}, which '
                      f'the plain install leaves out; `{INSTALL}` adds it.') from e
