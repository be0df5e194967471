"""An independent T5X-style greedy loop (reference.py) produces our greedy tokens."""

import jax
import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x import generate
from specdec_t5x.research.measure import reference


@pytest.mark.parametrize('v11', [True, False], ids=['v1.1', 'v1.0'])
def test_reference_greedy_equals_generate(v11):
  config = tiny_config(v11=v11)
  model = make_model(config, seed=21, logit_scale=3.0)
  enc = random_inputs(3, 8, 40, seed=22)
  ref = jax.jit(reference.greedy_decode, static_argnums=(0, 3, 4))(config, model[1], enc, 12, 5)
  ours = generate(model, enc, max_decode_length=12, eos_id=5).tokens
  np.testing.assert_array_equal(np.asarray(ref), np.asarray(ours))
