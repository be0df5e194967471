"""What a compiled program's while loops do per iteration, read from XLA's HLO text.

`loop_traffic(compiled.as_text(), min_elements)` lists the copies and transposes inside
every while body (and the computations it calls): `whole_buffer` holds those with at
least `min_elements` elements (the caller's smallest per-device cache) or shaped like a
weight the loop carries (a rank-2 float leaf of its state). A per-step copy of a cache or
a weight is HBM traffic the paper's shapes never need.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Dict, List, Set, Tuple

_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) \(.*\{$')
_CALLED = re.compile(r'(?:calls|to_apply|body|condition|branch_computations|'
                     r'true_computation|false_computation)=\{?([%\w.\-, ]+)\}?')
_INSTRUCTION = re.compile(r'\s*(?:ROOT )?%?[\w.\-]+ = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(')
_WHILE = re.compile(r'= \((.*)\) while\(.*body=%?([\w.\-]+)')
_LEAF = re.compile(r'(\w+)\[([\d,]*)\]')
_FLOATS = ('f32', 'bf16', 'f16', 'f64')

Shape = Tuple[str, Tuple[int, ...]]  # (element type, dimensions)


def _dims(text: str) -> Tuple[int, ...]:
  return tuple(int(d) for d in text.split(',') if d)


def computations(hlo: str) -> Dict[str, List[str]]:
  """HLO text -> {computation name: its instruction lines}."""
  comps, current = {}, None
  for line in hlo.splitlines():
    match = _COMPUTATION.match(line)
    if match:
      current = match.group(1)
      comps[current] = []
    elif line.startswith('}'):
      current = None
    elif current is not None:
      comps[current].append(line)
  return comps


def _reachable(comps: Dict[str, List[str]], name: str, seen: Set[str]) -> None:
  if name in seen or name not in comps:
    return
  seen.add(name)
  for line in comps[name]:
    for group in _CALLED.findall(line):
      for callee in re.split(r'[,\s]+', group):
        _reachable(comps, callee.lstrip('%'), seen)


@dataclasses.dataclass
class LoopTraffic:
  """Copies/transposes inside while bodies: `ops` counts them by (op, shape);
  `whole_buffer` lists those of at least `min_elements` or shaped like a carried weight."""
  ops: collections.Counter
  whole_buffer: List[Tuple[str, Shape]]
  min_elements: int

  def summary(self) -> Dict[str, object]:
    return {'copies_and_transposes': sum(self.ops.values()),
            'whole_buffer': [f'{op} {t}[{",".join(map(str, d))}]'
                             for op, (t, d) in self.whole_buffer],
            'min_elements': self.min_elements}


def loop_computations(comps: Dict[str, List[str]]) -> Set[str]:
  """The computations inside while loops (each body and everything it calls)."""
  inner: Set[str] = set()
  for lines in comps.values():
    for line in lines:
      match = _WHILE.search(line)
      if match:
        _reachable(comps, match.group(2), inner)
  return inner


def loop_traffic(hlo: str, min_elements: int,
                 ops: Tuple[str, ...] = ('copy', 'transpose')) -> LoopTraffic:
  """Per-device HLO text of a compiled program (`jax.jit(f).lower(...).compile().as_text()`)
  -> the `ops` inside its while loops. Raises ValueError if it has no while loop."""
  comps = computations(hlo)
  carried = [(t, _dims(d)) for lines in comps.values() for line in lines
             for match in [_WHILE.search(line)] if match
             for t, d in _LEAF.findall(match.group(1))]
  inner = loop_computations(comps)
  if not inner:
    raise ValueError('The program has no while loop.')
  weights = {(t, d) for t, d in carried if t in _FLOATS and len(d) == 2 and min(d) > 1}
  counts: collections.Counter = collections.Counter()
  whole: List[Tuple[str, Shape]] = []
  for name in inner:
    for line in comps[name]:
      match = _INSTRUCTION.match(line)
      if not match or match.group(3) not in ops:
        continue
      shape = (match.group(1), _dims(match.group(2)))
      counts[(match.group(3), shape)] += 1
      if math.prod(shape[1]) >= min_elements or shape in weights:
        whole.append((match.group(3), shape))
  return LoopTraffic(counts, whole, min_elements)
