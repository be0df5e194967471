"""Where the suite's time goes: each test phase's seconds in XLA compiles (JAX's monitoring
events; a program read back from the persistent compilation cache counts too, with its
short read time), reported per test file at the end of a run (conftest.py). Most of this
suite's time is compiling many small distinct programs, not running them: this table says
which files pay it."""

import collections
import os
from typing import Dict, Iterable, List, Tuple

import jax

COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'
KEY = 'compile'  # the user property: (seconds, programs) compiled during one test phase
_totals = [0.0, 0]


def _listen(event: str, duration: float, **_) -> None:
  if event == COMPILE_EVENT:
    _totals[0] += duration
    _totals[1] += 1


jax.monitoring.register_event_duration_secs_listener(_listen)


def take() -> Tuple[float, int]:
  """(seconds, programs) compiled since the last call, then reset."""
  out = (round(_totals[0], 3), _totals[1])
  _totals[0], _totals[1] = 0.0, 0
  return out


def by_file(reports: Iterable) -> Dict[str, List[float]]:
  """{test file: [phases' seconds, compile seconds, programs]} from the reports' properties."""
  rows: Dict[str, List[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
  for r in reports:
    row = rows[r.nodeid.split('::')[0]]
    row[0] += getattr(r, 'duration', 0.0)
    for name, value in getattr(r, 'user_properties', ()):
      if name == KEY:
        row[1] += value[0]
        row[2] += value[1]
  return rows


def summary(reports: Iterable, top: int = 12) -> List[str]:
  """The files that compile longest, and the run's share of test time spent compiling."""
  rows = by_file(reports)
  wall = sum(r[0] for r in rows.values())
  compiled = sum(r[1] for r in rows.values())
  if not wall:
    return []
  lines = [f'{compiled:.0f} s of {wall:.0f} s in tests ({compiled / wall:.0%}) went to '
           f'{sum(r[2] for r in rows.values()):.0f} XLA compiles (cache reads '
           f'included; worker seconds, {os.cpu_count()} CPUs); the files that compile longest:',
           f'{"file":44s} {"test s":>8s} {"compile s":>10s} {"compiles":>9s}']
  for name, (seconds, compile_s, programs) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
    lines.append(f'{name:44s} {seconds:8.1f} {compile_s:10.1f} {programs:9.0f}')
  return lines
