"""Command-line gin checks gin itself does not make (run before parsing).

* A gin file that no search path holds: gin fails with `TypeError: expected str, bytes
  or os.PathLike object, not NoneType`; here it is a FileNotFoundError naming the file
  and the places looked in.
* A `--gin.NAME=VALUE` whose all-caps NAME is a macro no gin file defines (a typo such
  as `--gin.GAMA=5`): gin accepts it as a new, unused macro and the run goes on with the
  default. Here it is a ValueError naming the closest defined macros.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Iterable, Optional, Sequence, Set

_MACRO_DEF = re.compile(r'^([A-Z][A-Z0-9_]*)\s*=', re.MULTILINE)
_MACRO_NAME = re.compile(r'^[A-Z][A-Z0-9_]*$')
_INCLUDE = re.compile(r"""^include\s+['"]([^'"]+)['"]""", re.MULTILINE)
_MACRO_REF = re.compile(r'%([A-Z][A-Z0-9_]*)')


def find_gin_file(name: str, roots: Sequence[str]) -> Optional[str]:
  """Where gin would find `name`: as given, or under one of `roots` (in order)."""
  for candidate in [name] + [os.path.join(root, name) for root in roots]:
    if os.path.isfile(candidate):
      return candidate
  return None


def defined_macros(gin_files: Iterable[str], roots: Sequence[str]) -> Set[str]:
  """Macros the files (and the files they include) define; raises for a missing file."""
  macros: Set[str] = set()
  seen: Set[str] = set()
  todo = [(name, True) for name in gin_files]
  while todo:
    name, top_level = todo.pop()
    path = find_gin_file(name, roots)
    if path is None and not top_level:
      continue  # gin reports a missing include itself, naming the including file.
    if path is None:
      raise FileNotFoundError(f'Gin file {name!r} not found; looked in: '
                              f'{[name] + [os.path.join(r, name) for r in roots]} '
                              '(--gin_search_paths adds prefixes).')
    if os.path.abspath(path) in seen:
      continue
    seen.add(os.path.abspath(path))
    with open(path, encoding='utf-8') as f:
      text = f.read()
    macros.update(_MACRO_DEF.findall(text))
    todo += [(name, False) for name in _INCLUDE.findall(text)]
  return macros


def check_macro_bindings(bindings: Iterable[str], defined: Set[str]) -> None:
  """Raises ValueError for a binding `NAME = VALUE` of an all-caps macro that neither a
  gin file defines nor another binding references (as `%NAME`)."""
  bindings = list(bindings)
  referenced = {m for b in bindings for m in _MACRO_REF.findall(b.split('=', 1)[-1])}
  for binding in bindings:
    name = binding.split('=', 1)[0].strip()
    if _MACRO_NAME.match(name) and name not in defined | referenced:
      close = difflib.get_close_matches(name, sorted(defined), n=3, cutoff=0.6)
      hint = f' Did you mean {" or ".join(close)}?' if close else ''
      raise ValueError(
          f'Gin macro {name} (from --gin.{name}=...) is not defined by the gin files, so '
          f'nothing would use it.{hint} Known macros: {sorted(defined)}.')
