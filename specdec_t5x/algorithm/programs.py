"""Compiled programs kept for reuse: a bounded memo of jitted programs, the one key every
such memo uses (`program_key`), and a decode program bound to its sampling values
(api.compiled_program)."""

from __future__ import annotations

import collections
from typing import Any, Callable

import jax
import numpy as np

from specdec_t5x.algorithm.cpu import modes

PROGRAMS_KEEP = 32  # jitted programs each memo keeps (least recently used dropped)


def module_key(module) -> Any:
  """A module as a key: Flax modules hash by their (frozen) fields; identity otherwise."""
  try:
    hash(module)
    return module
  except TypeError:
    return (type(module), id(module))


def program_key(target_module, draft_module, *settings: Any) -> tuple:
  """The key of a traced program of these modules (draft_module may be None) and hashable
  `settings`: their module keys, the settings, and the CPU kernels' trace-time switches
  (cpu.modes.trace_state: the traced kernel mode, the default mode, the accelerator forms),
  which choose the kernels a program traced now calls."""
  draft = None if draft_module is None else module_key(draft_module)
  return (module_key(target_module), draft) + tuple(settings) + (modes.trace_state(),)


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


_CONSTANTS: 'collections.OrderedDict[Any, jax.Array]' = collections.OrderedDict()
CONSTANTS_KEEP = 256  # run-time constants kept on the device


def run_time_constant(value: Any, dtype: Any) -> jax.Array:
  """`value` (a scalar or a small array) as a device array of `dtype`, made once per value:
  the run-time arguments every call of a program repeats (the EOS id, the sampling values)
  move to the device once, not with every call. Uncommitted, as jnp.asarray makes it, so a
  partitioned program places it where it needs it. Inside an outer trace (generate under
  jit, as T5X's infer calls it) the value is staged into that trace and not kept."""
  array = np.asarray(value, dtype)
  key = (array.tobytes(), array.dtype.str, array.shape)
  if key not in _CONSTANTS:
    made = jax.numpy.asarray(array)
    if isinstance(made, jax.core.Tracer):
      return made
    _CONSTANTS[key] = made
    while len(_CONSTANTS) > CONSTANTS_KEEP:
      _CONSTANTS.popitem(last=False)
  return _CONSTANTS[key]


class BoundProgram:
  """A jitted api.decode_program called with fixed run-time sampling values
  (SamplingConfig.values): calls and `lower` take the program's positional arguments
  (target_vars, draft_vars, encoder_tokens, rng, eos_id[, prompt]), not `sampling`."""

  def __init__(self, program: Any, values: Any):
    self.program, self.values = program, run_time_constant(values, np.float32)

  def __call__(self, *args):
    return self.program(*_with_prompt(args), sampling=self.values)

  def lower(self, *args):
    return self.program.lower(*_with_prompt(args), sampling=self.values)


def _with_prompt(args) -> tuple:
  """The positional arguments with prompt (the sixth) None when not given."""
  return tuple(args) + (None,) * (6 - len(args))
