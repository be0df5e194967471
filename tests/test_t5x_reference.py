"""Stock T5X greedy decoding (t5x_reference.py) on our params gives our greedy tokens.

Needs T5X (installed in CI by .ci/run); skipped with the reason where it is not importable.
"""

import dataclasses

import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x import generate
from specdec_t5x.research.measure import t5x_reference

pytestmark = pytest.mark.skipif(not t5x_reference.available(),
                                reason='t5x is not installed (it is not on PyPI)')


@pytest.mark.parametrize('v11', [True, False], ids=['v1.1', 'v1.0'])
def test_t5x_greedy_equals_our_ar(v11):
  config = tiny_config(v11=v11)
  model = make_model(config, seed=31, logit_scale=3.0)
  enc = random_inputs(3, 8, 40, seed=32)
  for eos_id in (-1, None):  # never stopping; then stopping mid-sequence in row 0
    if eos_id is None:
      eos_id = int(ours[0, 4])  # greedy tokens before EOS do not depend on eos_id
    theirs = np.asarray(t5x_reference.greedy_decoder(config, 12, eos_id)(model[1], enc))
    ours = np.asarray(generate(model, enc, max_decode_length=12, eos_id=eos_id).tokens)
    assert theirs.shape == (3, 12)
    np.testing.assert_array_equal(theirs, ours)
  assert (ours[0, 5:] == 0).all()  # row 0 stopped at its EOS, so padding was compared


def test_t5x_config_rejects_fields_t5x_lacks():
  @dataclasses.dataclass(frozen=True)
  class Wider(type(tiny_config())):
    rotary: bool = False
  base = tiny_config()
  assert t5x_reference.t5x_config(Wider(**dataclasses.asdict(base))).emb_dim == base.emb_dim
  with pytest.raises(ValueError, match='rotary=True'):
    t5x_reference.t5x_config(Wider(**dataclasses.asdict(base), rotary=True))
