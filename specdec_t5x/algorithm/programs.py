"""Compiled programs kept for reuse: a bounded memo of jitted programs, and a decode program
bound to its sampling values (api._compiled)."""

from __future__ import annotations

import collections
from typing import Any, Callable

PROGRAMS_KEEP = 32  # jitted programs each memo keeps (least recently used dropped)


def memoized_program(memo: 'collections.OrderedDict[Any, Any]', key: Any,
                     build: Callable[[], Any]) -> Any:
  """memo[key], built by build() when missing; the least recently used entries beyond
  PROGRAMS_KEEP are dropped, so that their compiled executables can be freed (a process that
  compiles hundreds of programs otherwise exhausts the JIT's memory mappings)."""
  if key not in memo:
    memo[key] = build()
    while len(memo) > PROGRAMS_KEEP:
      memo.popitem(last=False)
  memo.move_to_end(key)
  return memo[key]


class BoundProgram:
  """A jitted api.decode_program called with fixed run-time sampling values
  (SamplingConfig.values): calls and `lower` take the program's positional arguments
  (target_vars, draft_vars, encoder_tokens, rng, eos_id[, prompt]), not `sampling`."""

  def __init__(self, program: Any, values: Any):
    self.program, self.values = program, values

  def __call__(self, *args):
    return self.program(*_with_prompt(args), sampling=self.values)

  def lower(self, *args):
    return self.program.lower(*_with_prompt(args), sampling=self.values)


def _with_prompt(args) -> tuple:
  """The positional arguments with prompt (the sixth) None when not given."""
  return tuple(args) + (None,) * (6 - len(args))
