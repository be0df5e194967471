"""Where a decode loop's time goes, read from XLA's own profiler (no host round trips).

`profile` compiles api.decode_program with each model call under a named scope
('target_call', 'draft_call'), runs the decodes under `jax.profiler` and sums the
duration of every executed HLO instruction (XLA:CPU runs each as a timed thunk) by where
it sits:

  target_calls  instructions of the target's calls inside the decode's while loop
  draft_calls   the same for the draft's calls
  loop_work     the rest of the while loop: sampling, acceptance, the sequence buffer,
                statistics, the loop's test, copies XLA inserted between iterations
  outside       everything before and after the loop (encoders, caches, the output)

per loop iteration (a batch's target calls). The runtime's gaps between instructions are
in none of them (compare their sum with the loop's unprofiled time per iteration). An
instruction XLA created without source metadata (some dots, copies) takes the category of
an operand that has one. A fusion is
one instruction: where XLA fused loop work into a model call (or back), its time goes to
its root's side. The profiler's per-instruction markers slow each instruction a little,
so read shares and differences, not timers of record; the decode's tokens are those of
the unprofiled program.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api
from specdec_t5x.algorithm.cpu import packing
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import hlo_loops

SCOPES = {'target': 'target_call', 'draft': 'draft_call'}
PARTS = ('target_calls', 'draft_calls', 'loop_work')
_CONTAINERS = ('while', 'conditional', 'call')
_NAME = re.compile(r'\s*(?:ROOT )?%?([\w.\-]+) = (.*)$')
_OPCODE = re.compile(r'(?:^|[\]})] )([a-z][\w\-]*)\(')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SCOPE = re.compile(r'/(%s|%s)/' % (SCOPES['target'], SCOPES['draft']))


def _operands(rest: str, start: int) -> Tuple[str, ...]:
  """The %names inside the parenthesis that opens at rest[start]."""
  depth = 0
  for end in range(start, len(rest)):
    depth += {'(': 1, ')': -1}.get(rest[end], 0)
    if depth == 0:
      return tuple(re.findall(r'%([\w.\-]+)', rest[start:end]))
  return ()


def categories(hlo: str) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
  """Compiled HLO text -> ({instruction: category}, {instruction: opcode},
  {instruction: op_name}); category is 'target_calls', 'draft_calls' or 'loop_work' inside
  a while loop, 'outside' elsewhere."""
  comps = hlo_loops.computations(hlo)
  inner = hlo_loops.loop_computations(comps)
  opcode, operands, op_name, where = {}, {}, {}, {}
  for comp, lines in comps.items():
    for line in lines:
      match = _NAME.match(line)
      code = match and _OPCODE.search(match.group(2))
      if not code:
        continue
      name, rest = match.group(1), match.group(2)
      opcode[name], where[name] = code.group(1), comp in inner
      operands[name] = _operands(rest, code.end() - 1)
      meta = _OP_NAME.search(rest)
      if meta:
        op_name[name] = meta.group(1)
  side = {n: _SCOPE.search(o).group(1) for n, o in op_name.items() if _SCOPE.search(o)}
  for _ in range(len(opcode)):  # metadata-less instructions: an operand's model call
    found = {n: next(side[o] for o in operands[n] if o in side) for n in opcode
             if n not in side and n not in op_name and any(o in side for o in operands[n])}
    if not found:
      break
    side.update(found)
  names = {v: k for k, v in SCOPES.items()}
  cat = {n: (f'{names[side[n]]}_calls' if n in side else 'loop_work') if where[n]
         else 'outside' for n in opcode}
  return cat, opcode, op_name


def _trace_events(log_dir: str):
  paths = glob.glob(os.path.join(log_dir, '**', '*.trace.json.gz'), recursive=True)
  if len(paths) != 1:
    raise RuntimeError(f'Expected one profiler trace under {log_dir}, found {paths}.')
  with gzip.open(paths[0], 'rt', encoding='utf-8') as f:
    return [e for e in json.load(f)['traceEvents'] if e.get('ph') == 'X']


def _profile_shape(target, draft, rows: Sequence[np.ndarray], max_len: int,
                   config: DecodeConfig) -> Tuple[int, Dict[str, float], Dict[str, float]]:
  """One decode of each batch in `rows` (one shape: one program) under the profiler ->
  (loop iterations, seconds summed by category, loop work's seconds by op_name)."""
  def named(name, fn):
    def call(*args, **tree):
      with jax.named_scope(SCOPES[name]):
        return fn(*args, **tree)
    return call

  program = api.decode_program(target[0], draft and draft[0], max_len=max_len,
                               config=config, wrap=named)
  nonce = time.time_ns() % (1 << 31)

  def fresh(*args):  # a program no compilation cache holds (see below)
    return program(*args), jnp.int32(nonce)
  fn = jax.jit(fresh)
  t_vars = packing.decode_variables(*target)
  d_vars = None if draft is None else packing.decode_variables(*draft)
  calls = [(t_vars, d_vars, jnp.asarray(r), jax.random.PRNGKey(i), jnp.int32(1))
           for i, r in enumerate(rows)]
  # The traced executable is the one whose HLO names the categories, compiled here: one
  # read back from a persistent compilation cache (JAX_COMPILATION_CACHE_DIR) traces
  # without instruction names, so the program carries a constant no other compile had.
  compiled = fn.lower(*calls[0]).compile()
  cat, opcode, op_name = categories(compiled.as_text())
  iterations = 0
  for args in calls:  # warm before the trace
    iterations += int(np.max(np.asarray(
        jax.block_until_ready(compiled(*args))[0][1]['target_calls'])))
  with tempfile.TemporaryDirectory() as log_dir:
    jax.profiler.start_trace(log_dir, create_perfetto_trace=True)
    try:
      for args in calls:
        jax.block_until_ready(compiled(*args))
    finally:
      jax.profiler.stop_trace()
    events = _trace_events(log_dir)
  total: Dict[str, float] = collections.defaultdict(float)
  heavy: Dict[str, float] = collections.defaultdict(float)
  for e in events:
    name = e['name']
    if name not in cat or opcode[name] in _CONTAINERS:  # their instructions count
      continue
    seconds = e.get('dur', 0.0) * 1e-6
    total[cat[name]] += seconds
    if cat[name] == 'loop_work':
      heavy[op_name.get(name, name).split('/while/body/')[-1]] += seconds
  return iterations, total, heavy


def profile(target, draft: Optional[Any], rows: Sequence[np.ndarray], max_len: int,
            config: DecodeConfig, top: int = 6) -> Dict[str, Any]:
  """Profiles one decode of each batch in `rows`; batches of one shape (length bucket)
  share a program and a trace (instruction names are per program). -> {'iterations',
  'per_iteration_s': {part: seconds}, 'outside_s' (per decode), 'top_loop_work':
  [[op_name, seconds per iteration]] (the `top` largest)}."""
  by_shape: Dict[Tuple[int, ...], list] = collections.defaultdict(list)
  for r in rows:
    by_shape[np.shape(r)].append(r)
  iterations = 0
  total: Dict[str, float] = collections.defaultdict(float)
  heavy: Dict[str, float] = collections.defaultdict(float)
  for group in by_shape.values():
    n, seconds, parts = _profile_shape(target, draft, group, max_len, config)
    iterations += n
    for totals, add in ((total, seconds), (heavy, parts)):
      for k, v in add.items():
        totals[k] += v
  per = max(iterations, 1)
  return {'iterations': iterations,
          'per_iteration_s': {p: total[p] / per for p in PARTS},
          'outside_s': total['outside'] / max(len(rows), 1),
          'top_loop_work': [[k, v / per]
                            for k, v in sorted(heavy.items(), key=lambda kv: -kv[1])[:top]]}
