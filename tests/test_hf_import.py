"""Tests for specdec_t5x.integration.hf_convert: Hugging Face T5 <-> T5X parameter trees.

Hermetic: tiny random `T5ForConditionalGeneration` models built in the test; nothing
is downloaded. (Logits parity against our network lives with the network's tests.)
"""

import json
import types

import numpy as np
import pytest

from specdec_t5x.integration import hf_convert

pytestmark = pytest.mark.slow  # PyTorch / transformers models

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

VARIANTS = {  # name: (feed_forward_proj, tie_word_embeddings)
    'v1_1': ('gated-gelu', False),
    'v1_0': ('relu', True),
}


def tiny_hf_model(variant, seed=0):
  proj, tie = VARIANTS[variant]
  config = transformers.T5Config(
      vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=3,
      num_heads=2, feed_forward_proj=proj, tie_word_embeddings=tie,
      decoder_start_token_id=0)
  torch.manual_seed(seed)
  return transformers.T5ForConditionalGeneration(config).eval()


def our_config(model):
  return types.SimpleNamespace(dtype='float32',
                               **hf_convert.t5_config_from_hf(model.config.to_dict()))


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_config_from_hf(variant):
  cfg = our_config(tiny_hf_model(variant))
  assert (cfg.vocab_size, cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (
      40, 16, 2, 4, 24)
  assert (cfg.num_encoder_layers, cfg.num_decoder_layers) == (2, 3)
  if variant == 'v1_1':
    assert cfg.mlp_activations == ('gelu', 'linear') and not cfg.logits_via_embedding
  else:
    assert cfg.mlp_activations == ('relu',) and cfg.logits_via_embedding


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_state_dict_round_trip(variant):
  model = tiny_hf_model(variant)
  cfg = our_config(model)
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  params = hf_convert.params_from_hf_state_dict(model.state_dict(), cfg)
  back = hf_convert.hf_state_dict_from_params(params, cfg)
  assert back.keys() == sd.keys()
  for key in sd:
    np.testing.assert_array_equal(back[key], sd[key], err_msg=key)
  # The layout T5X expects: kernels [in, out], relative bias [heads, buckets].
  layer = params['decoder']['layers_2']
  np.testing.assert_array_equal(layer['encoder_decoder_attention']['out']['kernel'],
                                sd['decoder.block.2.layer.1.EncDecAttention.o.weight'].T)
  assert params['encoder']['relpos_bias']['rel_embedding'].shape == (2, 32)
  assert layer['mlp']['wo']['kernel'].shape == (24, 16)
  assert ('logits_dense' in params['decoder']) == (variant == 'v1_1')


def test_bfloat16_torch_weights_are_exact():
  model = tiny_hf_model('v1_1').to(torch.bfloat16)
  cfg = our_config(model)
  params = hf_convert.params_from_hf_state_dict(model.state_dict(), cfg)
  kernel = params['encoder']['layers_1']['mlp']['wi_1']['kernel']
  want = model.state_dict()['encoder.block.1.layer.1.DenseReluDense.wi_1.weight'].float()
  assert kernel.dtype.name == 'bfloat16'
  np.testing.assert_array_equal(kernel.astype(np.float32), want.numpy().T)


def test_mismatched_config_is_rejected():
  model = tiny_hf_model('v1_1')
  cfg = our_config(model)
  with pytest.raises(ValueError, match='decoder.block.3'):
    hf_convert.params_from_hf_state_dict(
        model.state_dict(), types.SimpleNamespace(**{**vars(cfg), 'num_decoder_layers': 4}))
  with pytest.raises(ValueError, match='does not account for'):
    hf_convert.params_from_hf_state_dict(
        model.state_dict(), types.SimpleNamespace(**{**vars(cfg), 'num_decoder_layers': 2}))


@pytest.mark.parametrize('variant', sorted(VARIANTS))
@pytest.mark.parametrize('weights', ['safetensors', 'bin'])
def test_load_hf_checkpoint_from_local_dir(tmp_path, variant, weights):
  model = tiny_hf_model(variant)
  cfg = our_config(model)
  if weights == 'safetensors':
    model.save_pretrained(tmp_path)  # Drops tied duplicates (lm_head, embed_tokens).
  else:
    torch.save(model.state_dict(), tmp_path / 'pytorch_model.bin')
    (tmp_path / 'config.json').write_text(json.dumps(model.config.to_dict()))
  params, got_cfg = hf_convert.load_hf_checkpoint(tmp_path, config=cfg)
  assert got_cfg is cfg
  want = hf_convert.params_from_hf_state_dict(model.state_dict(), cfg)
  flat_got = hf_convert.traverse_util.flatten_dict(params)
  flat_want = hf_convert.traverse_util.flatten_dict(want)
  assert flat_got.keys() == flat_want.keys()
  for key in flat_want:
    np.testing.assert_array_equal(flat_got[key], flat_want[key], err_msg=str(key))


def test_load_hf_checkpoint_builds_t5config(tmp_path):
  network = pytest.importorskip('specdec_t5x.network')
  model = tiny_hf_model('v1_1')
  model.save_pretrained(tmp_path)
  params, cfg = hf_convert.load_hf_checkpoint(tmp_path)
  assert isinstance(cfg, network.T5Config)
  assert cfg.mlp_activations == ('gelu', 'linear') and not cfg.logits_via_embedding
  assert params['decoder']['logits_dense']['kernel'].shape == (16, 40)


def test_missing_hf_dir_raises(tmp_path):
  with pytest.raises(FileNotFoundError):
    hf_convert.load_hf_checkpoint(tmp_path / 'nope')
  with pytest.raises(FileNotFoundError, match='model.safetensors'):
    hf_convert.load_hf_checkpoint(tmp_path, config=types.SimpleNamespace())
