"""The committed demo family loads (T5X native, bf16 storage) and computes fixed logits."""

import os

import numpy as np
import pytest

from specdec_t5x.research.measure import evaluation

pytestmark = pytest.mark.slow  # decodes with the committed demo checkpoints

ROOT = os.path.join(os.path.dirname(__file__), '..', 'checkpoints', 'demo')
ENC = np.array([[13, 250, 9, 77, 1024, 5, 1]], np.int32)
DEC = np.array([[0, 100, 200, 300]], np.int32)
# Recorded when the checkpoints were committed: argmax ids and logits[:, :3] per position.
EXPECTED = {
    'demo_target': ([1024, 77, 2505, 58], [[3.2979, 2.4569, 0.3162], [-1.4856, 1.5497, 0.0227],
                                           [-1.3299, 4.3435, -2.1776], [-0.1574, 2.4962, -0.2537]]),
    'demo_draft_m': ([1024, 8, 10, 58], [[2.7578, 2.5005, -0.1736], [0.9137, 4.9874, 3.1392],
                                         [-1.7696, 2.0696, -1.2056], [-1.4006, 4.4324, 1.4092]]),
    'demo_draft_s': ([1024, 5, 10, 58], [[2.6426, 2.9923, 0.5829], [-1.0023, 4.3356, 1.6412],
                                         [0.8009, 2.4289, 1.1796], [0.879, 6.2979, 0.1085]]),
}


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_committed_checkpoint_gives_recorded_logits(name):
  module, params = evaluation.load_model(name)
  assert params['token_embedder']['embedding'].shape == (8192, module.config.emb_dim)
  logits = np.asarray(module.apply({'params': params}, ENC, DEC))
  ids, head = EXPECTED[name]
  assert logits.argmax(-1)[0].tolist() == ids
  np.testing.assert_allclose(logits[0, :, :3], head, atol=2e-3)


def test_committed_family_fits_the_size_budget():
  total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ROOT) for f in fs)
  assert total <= 40 * 2 ** 20, total
