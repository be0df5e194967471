"""The temperature and the top-p mass are run-time arguments of a compiled decode program
(SamplingConfig.values, api.compiled_program): one program serves every value, a sweep over them
compiles nothing new, and each value decodes bitwise as a program that holds it as a
constant (api.decode_program with sampling=None) does."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_inputs
from specdec_t5x import generate
from specdec_t5x.algorithm import api, sampling
from specdec_t5x.algorithm.cpu import packing
from specdec_t5x.algorithm.config import DecodeConfig

MAX_LEN = 8


def test_one_program_serves_every_temperature_and_top_p(target_and_draft, monkeypatch):
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  target, draft = target_and_draft
  enc, rng = random_inputs(3, 7, 40, seed=4), jax.random.PRNGKey(5)
  outs = [np.asarray(generate(target, enc, draft=draft, max_decode_length=MAX_LEN, rng=rng,
                              eos_id=-1, gamma=3, **kw).tokens)
          for kw in (dict(temperature=0.6), dict(temperature=1.4),
                     dict(temperature=0.8, topp=0.6), dict(temperature=1.2, topp=0.95))]
  # one program for temperature alone, one with top-p: the values are not in the key
  assert len(api._COMPILED) == 2  # pylint: disable=protected-access
  assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[2], outs[3])


@pytest.mark.parametrize('mode', ['packed', 'xla'])
@pytest.mark.parametrize('kw', [dict(temperature=0.6), dict(temperature=0.8, topp=0.6)],
                         ids=['t0.6', 'topp0.6'])
def test_run_time_values_decode_as_constants_do(target_and_draft, mode, kw):
  """generate's program (the values as arguments) against one built with config's values
  as constants, in each kernel mode (the packed row softmax reads 1 / T as an operand)."""
  target = target_and_draft[0]
  enc, rng = random_inputs(3, 7, 40, seed=4), jax.random.PRNGKey(5)
  config = DecodeConfig(cpu_kernels=mode, **kw)
  out = generate(target, enc, max_decode_length=MAX_LEN, rng=rng, eos_id=-1,
                 cpu_kernels=mode, **kw)
  baked = jax.jit(api.decode_program(target[0], None, max_len=MAX_LEN, config=config))
  tokens = baked(packing.decode_variables(*target, mode), None, enc, rng, jnp.int32(-1))[0]
  np.testing.assert_array_equal(out.tokens, tokens)


def test_the_program_key_keeps_what_shapes_the_program():
  """Greedy or not, top-k and top-p on or off make different programs; the values do not."""
  key = lambda **kw: DecodeConfig(gamma=2, **kw).program_key()
  assert key(temperature=0.3) == key(temperature=2.0) == key(temperature=1.0)
  assert key(temperature=0.5, topp=0.2) == key(temperature=1.5, topp=0.9)
  assert len({key(), key(temperature=0.5), key(temperature=0.5, topk=3),
              key(temperature=0.5, topk=4), key(temperature=0.5, topp=0.5)}) == 5


def test_values_hold_the_temperature_its_inverse_and_top_p():
  np.testing.assert_array_equal(sampling.SamplingConfig(0.5, topp=0.9).values(),
                                np.float32([0.5, 2.0, 0.9]))
  assert sampling.SamplingConfig(1e-45).values()[1] == np.inf  # below float's range: 1/T inf
  np.testing.assert_array_equal(sampling.SamplingConfig().values(), np.zeros(3, np.float32))
