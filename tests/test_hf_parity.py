"""Our T5 equals Hugging Face's PyTorch T5 on the same random weights (v1.1 and v1.0)."""

import numpy as np
import pytest
import torch
import transformers

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x.checkpoints import hf_state_dict_from_params


def _hf_model(config, params):
  v11 = not config.logits_via_embedding
  hf_config = transformers.T5Config(
      vocab_size=config.vocab_size, d_model=config.emb_dim, d_kv=config.head_dim,
      d_ff=config.mlp_dim, num_layers=config.num_encoder_layers,
      num_decoder_layers=config.num_decoder_layers, num_heads=config.num_heads,
      feed_forward_proj='gated-gelu' if v11 else 'relu', dropout_rate=0.0,
      relative_attention_num_buckets=32, relative_attention_max_distance=128,
      layer_norm_epsilon=1e-6, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
      tie_word_embeddings=not v11, scale_decoder_outputs=not v11)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  state = {k: torch.from_numpy(np.array(v, np.float32))
           for k, v in hf_state_dict_from_params(params, config).items()}
  if v11:  # transformers >= 5 ties lm_head to `shared`; v1.1 has its own logits layer.
    model.lm_head.weight = torch.nn.Parameter(state['lm_head.weight'].clone())
  model.load_state_dict(state, strict=True)
  return model


@pytest.mark.parametrize('v11', [True, False], ids=['v1.1', 'v1.0'])
def test_matches_hugging_face_t5(v11):
  config = tiny_config(vocab=64, emb=32, layers=2, v11=v11)
  module, params = make_model(config, seed=7)
  hf = _hf_model(config, params)
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
