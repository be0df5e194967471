"""Multi-host runs: one process per host joined by `jax.distributed`, as T5X runs.

Every process runs the same command (`python -m specdec_t5x.infer --multihost ...`).
`initialize` joins them before any other JAX use: the coordinator (process 0's
`host:port`), the process count and this process's index come from T5X train's flag
names (`--coordinator_address`, `--process_count`, `--process_index`) or, where they are
absent, from JAX's own detection (JAX_COORDINATOR_ADDRESS, Cloud TPU, SLURM, Open MPI).
On the CPU backend the processes' collectives go through gloo. Joining, heartbeats and
the shutdown barrier are bounded (`TIMEOUTS`): a process that never joins, or dies, makes
the others stop with an error within a minute instead of JAX's default five.

`check_same_settings` refuses, before anything is decoded, a run whose processes were
given other settings (another gin file, checkpoint or flag): every process would compile
and feed another program, and the collectives would hang or mix them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any, Callable, List, Mapping, Optional, Tuple

import jax
from jax.experimental import multihost_utils
import numpy as np

# Seconds: waiting for every process to join; without a heartbeat before a process counts
# as dead; the barrier at exit. Joining + detection stay under a minute.
TIMEOUTS = {'initialization_timeout': 30, 'heartbeat_timeout_seconds': 15,
            'shutdown_timeout_seconds': 30}

_FLAGS = {'coordinator_address': '--coordinator_address=HOST:PORT (process 0\'s host)',
          'number of processes': '--process_count=N',
          'process id': '--process_index=I'}


def initialize(coordinator_address: Optional[str] = None,
               process_count: Optional[int] = None,
               process_index: Optional[int] = None) -> None:
  """Joins this process to the others (`jax.distributed.initialize`, bounded in time).

  Args:
    coordinator_address: process 0's 'host:port'; None: JAX_COORDINATOR_ADDRESS or the
      cluster JAX detects.
    process_count: the number of processes; None: detected.
    process_index: this process's index, 0..process_count-1; None: detected.

  Raises:
    ValueError: naming the flag to pass when neither it nor the cluster gives a value.
    RuntimeError: when the others do not join within TIMEOUTS['initialization_timeout']
      and JAX raises (the JAX installed here ends the process itself instead, from its
      C++ side: hence the line printed first).
  """
  if jax.config.jax_cpu_collectives_implementation not in ('gloo', 'mpi'):
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  # JAX ends a process whose peers do not join, or die, from a C++ thread (abort, its
  # log saying "detected fatal errors"): this line says beforehand what that means.
  who = ('this process' if process_index is None or process_count is None else
         f'process {process_index} of {process_count}')
  where = coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS') or 'detected'
  print(f'--multihost: {who} joining (coordinator {where}); every process must join within '
        f'{TIMEOUTS["initialization_timeout"]} s, and if one dies the others stop within '
        f'{TIMEOUTS["heartbeat_timeout_seconds"] + 10} s ("JAX distributed service '
        'detected fatal errors"): rerun the same command on every host to resume.',
        file=sys.stderr, flush=True)
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=process_count, process_id=process_index,
                               **TIMEOUTS)
  except ValueError as e:
    missing = [flag for what, flag in _FLAGS.items() if what in str(e).lower()]
    if not missing:
      raise
    raise ValueError(
        f'--multihost: {e} JAX found no cluster to take it from (Cloud TPU, SLURM, Open '
        f'MPI): pass {", ".join(missing)} to every process (all three: '
        '--coordinator_address, --process_count, --process_index).') from None
  except Exception as e:  # pylint: disable=broad-except  # XlaRuntimeError: not joined
    if 'DEADLINE_EXCEEDED' not in str(e) and 'timed out' not in str(e).lower():
      raise
    raise RuntimeError(
        f'--multihost: not every process joined within '
        f'{TIMEOUTS["initialization_timeout"]} s (coordinator {coordinator_address}, '
        f'process {process_index} of {process_count}): start the same command on every '
        f'host with its own --process_index. JAX said: {str(e)[:500]}') from None


def settings_digest(settings: Mapping[str, Any]) -> bytes:
  """SHA-256 of `settings` as sorted JSON (values JSON cannot hold are written by str)."""
  text = json.dumps(settings, sort_keys=True, default=str)
  return hashlib.sha256(text.encode('utf-8')).digest()


def check_same_settings(settings: Mapping[str, Any]) -> None:
  """Raises ValueError on every process unless all processes pass equal `settings`.

  One collective (a digest from each process) when they agree; when they do not, process
  0's settings go to the others so that each names the keys it differs in.
  """
  if jax.process_count() == 1:
    return
  digests = np.asarray(multihost_utils.process_allgather(
      np.frombuffer(settings_digest(settings), np.uint8)))
  others = [i for i in range(len(digests)) if not np.array_equal(digests[i], digests[0])]
  if not others:
    return
  text = json.dumps(settings, sort_keys=True, default=str).encode('utf-8')
  size = int(multihost_utils.broadcast_one_to_all(np.int32(len(text))))
  padded = np.zeros(size, np.uint8)
  padded[:min(size, len(text))] = np.frombuffer(text, np.uint8)[:size]
  first = json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(padded))))
  mine = json.loads(text)
  changed = sorted(k for k in set(first) | set(mine) if first.get(k) != mine.get(k))
  where = (f'processes {others} run' if jax.process_index() == 0 else
           f'process {jax.process_index()} runs')
  raise ValueError(
      f'--multihost: {where} with other settings than process 0'
      + (f' (this process differs in {changed})' if changed else '') +
      ': every process must get the same command (gin files, bindings, checkpoints); '
      'nothing was decoded.')


def from_first_process(decide: Callable[[], Tuple[Any, List[int]]],
                       num_chunks: int) -> Tuple[Any, List[int]]:
  """`decide()` -> (finished run or None, chunks to decode), run by process 0 alone (it
  alone reads and tidies the output directory); the others get whether the run is
  finished (as True; they write nothing) and the chunks, or an error if process 0 raised.
  """
  if jax.process_count() == 1:
    return decide()
  message = np.zeros(2 + num_chunks, np.int32)  # [raised, finished, chunk to decode...]
  finished, todo, error = None, [], None
  if jax.process_index() == 0:
    try:
      finished, todo = decide()
    except Exception as e:  # pylint: disable=broad-except  # re-raised below, after telling
      error = e
    message[0], message[1] = error is not None, finished is not None
    message[[2 + c for c in todo]] = 1
  message = np.asarray(multihost_utils.broadcast_one_to_all(message))
  if error is not None:
    raise error
  if message[0]:
    raise RuntimeError('--multihost: process 0 refused the run (its error says why); '
                       'nothing was decoded.')
  if jax.process_index() != 0:
    finished = True if message[1] else None
    todo = [c for c in range(num_chunks) if message[2 + c]]
  return finished, todo
