"""The committed demo family loads (T5X native, bf16 storage) and computes fixed logits."""

import os

import numpy as np
import pytest

from specdec_t5x import evaluation

ROOT = os.path.join(os.path.dirname(__file__), '..', 'checkpoints', 'demo')
ENC = np.array([[13, 250, 9, 77, 1024, 5, 1]], np.int32)
DEC = np.array([[0, 100, 200, 300]], np.int32)
# Recorded when the checkpoints were committed: argmax ids and logits[:, :3] per position.
EXPECTED = {
    'demo_target': ([1024, 8, 2505, 58], [[1.9483, 1.88, -0.8761], [-1.6241, 2.7632, 0.0824],
                                          [-0.7469, 4.2061, -2.3706], [0.0015, 2.3101, -0.4344]]),
    'demo_draft_m': ([1024, 8, 2505, 58], [[2.4344, 2.6001, 0.105], [1.6541, 4.1294, 3.3917],
                                           [-1.647, 3.1518, -0.4322], [-1.8529, 4.2828, 1.0078]]),
    'demo_draft_s': ([347, 8, 42, 58], [[3.7536, 2.4114, 0.7086], [-1.6229, 3.5105, 1.7887],
                                        [0.1066, 3.7818, 1.232], [-0.3142, 6.0697, 1.0109]]),
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
