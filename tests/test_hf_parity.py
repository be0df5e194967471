"""Our T5 equals Hugging Face's PyTorch T5 on the same random weights (v1.1 and v1.0)."""

import numpy as np
import pytest
import torch

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x.integration.hf_convert import hf_model_from_params

pytestmark = pytest.mark.slow  # PyTorch / transformers models


@pytest.mark.parametrize('v11', [True, False], ids=['v1.1', 'v1.0'])
def test_matches_hugging_face_t5(v11):
  config = tiny_config(vocab=64, emb=32, layers=2, v11=v11)
  module, params = make_model(config, seed=7)
  hf = hf_model_from_params(params, config)
  enc = random_inputs(3, 11, 64, seed=2, min_len=4)
  dec_in = np.random.RandomState(3).randint(2, 64, size=(3, 20)).astype(np.int32)
  dec_in[:, 0] = 0
  ours_enc = np.asarray(module.apply({'params': params}, enc, method='encode'))
  ours_logits = np.asarray(module.apply({'params': params}, enc, dec_in))
  with torch.no_grad():
    mask = torch.from_numpy((enc > 0).astype(np.int64))
    out = hf(input_ids=torch.from_numpy(enc.astype(np.int64)), attention_mask=mask,
             decoder_input_ids=torch.from_numpy(dec_in.astype(np.int64)))
  hf_enc, hf_logits = out.encoder_last_hidden_state.numpy(), out.logits.numpy()
  valid = enc > 0  # padded encoder positions are never attended to
  np.testing.assert_allclose(ours_enc[valid], hf_enc[valid], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ours_logits, hf_logits, rtol=1e-4, atol=1e-4 * np.abs(hf_logits).max())
  # Log-spaced buckets are exercised: encoder past 8 (bidirectional), decoder past 16.
  assert enc.shape[1] > 8 and dec_in.shape[1] > 16
