"""The suite's compile accounting (compile_report): a new program is counted once, read
from JAX's own monitoring events (not again when jit's in-memory cache serves it), and the
summary adds up each file's phases."""
import types

import jax
import jax.numpy as jnp
import numpy as np

import compile_report


def test_a_new_program_is_counted_and_a_cached_one_is_not():
  compile_report.take()
  f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
  x = np.arange(7, dtype=np.float32)
  f(x).block_until_ready()
  seconds, programs = compile_report.take()
  assert programs >= 1 and seconds > 0
  f(x).block_until_ready()
  assert compile_report.take() == (0.0, 0)


def test_the_summary_adds_each_files_phases_and_puts_the_longest_first():
  def report(nodeid, duration, compiled):
    return types.SimpleNamespace(nodeid=nodeid, duration=duration,
                                 user_properties=[('branches', [1]),
                                                  (compile_report.KEY, compiled)])
  reports = [report('tests/a.py::x', 2.0, (1.5, 2)), report('tests/a.py::y', 1.0, (0.5, 1)),
             report('tests/b.py::z', 6.0, (3.0, 4)), report('tests/c.py::w', 1.0, (0.0, 0))]
  rows = compile_report.by_file(reports)
  assert rows['tests/a.py'] == [3.0, 2.0, 3] and rows['tests/b.py'] == [6.0, 3.0, 4]
  lines = compile_report.summary(reports, top=2)
  assert lines[0].startswith('5 s of 10 s in tests (50%) went to 7 XLA compiles')
  assert [line.split()[0] for line in lines[2:]] == ['tests/b.py', 'tests/a.py']
