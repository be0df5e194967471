"""The suite's compile effort (conftest): exactness, parity and unit tests compile with
XLA's least optimisation effort, they and their children alike (and XLA:CPU's elemental
emitters in the test's own process); a `slow` test compiles as the run's user does."""
import json
import os

import jax
from jax._src import compiler as jax_compiler  # pylint: disable=g-direct-jax-src-import
import pytest

import conftest

_CHILD = ('import json, jax; print("RESULT " + json.dumps('
          '[jax.config.values[n] for n in %r]))' % list(conftest.QUICK_COMPILE))


def _switches():
  return [jax.config.values[name] for name in conftest.QUICK_COMPILE]


def _xla_options():
  """The options of XLA's own that this process's next compile gets (conftest)."""
  return [o for o in jax_compiler.get_compile_options(1, 1).env_option_overrides
          if o in conftest.QUICK_XLA_OPTIONS]


def _users_switches():
  users = json.loads(os.environ['SPECDEC_TEST_USERS_COMPILE'])
  return [conftest._parse(name, users[variable])
          for name, (variable, _) in conftest.QUICK_COMPILE.items()]


@pytest.mark.skipif(not conftest.QUICK_ENABLED,
                    reason='SPECDEC_TEST_QUICK_COMPILE=0: every test compiles as the user does')
def test_a_fast_test_and_its_child_compile_with_the_least_effort():
  assert _switches() == [True]
  assert _xla_options() == list(conftest.QUICK_XLA_OPTIONS)
  assert conftest.run_child(_CHILD) == [True]


@pytest.mark.slow
def test_a_slow_test_and_its_child_compile_as_the_user_does():
  assert _switches() == _users_switches()
  assert _xla_options() == ([] if not _users_switches()[0] else  # unless the user set it
                            list(conftest.QUICK_XLA_OPTIONS))
  assert conftest.run_child(_CHILD) == _users_switches()



@pytest.mark.slow  # it empties the worker's caches: kept out of the fast set's time
def test_a_change_of_effort_empties_the_in_memory_caches():
  """Programs compiled with one effort are not reused with the other (they round apart)."""
  f = jax.jit(lambda x: jax.numpy.tanh(x) * 3.0)
  f(1.0)
  now = {variable: os.environ.get(variable) for variable, _ in conftest.QUICK_COMPILE.values()}
  other = {variable: None if value else '1' for variable, value in now.items()}
  set_compile = conftest._set_compile  # pylint: disable=protected-access
  set_compile(now)
  assert f._cache_size() == 1  # the same effort: kept  # pylint: disable=protected-access
  try:
    set_compile(other)
    assert f._cache_size() == 0  # pylint: disable=protected-access
  finally:
    set_compile(now)
