"""Model directories (integration/model_dir): what training exports, evaluation loads."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x.algorithm.network import T5Config, Transformer
from specdec_t5x.integration import model_dir
from specdec_t5x.integration.checkpoints import load_params


def _config(**kw):
  return T5Config(**{**dict(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                            num_encoder_layers=1, num_decoder_layers=2,
                            mlp_activations=('gelu', 'linear'), dtype=jnp.bfloat16), **kw})


def test_config_round_trips_through_json():
  config = _config(logits_via_embedding=True)
  fields = json.loads(json.dumps(model_dir.config_to_dict(config)))
  assert fields['dtype'] == 'bfloat16' and fields['mlp_activations'] == ['gelu', 'linear']
  assert model_dir.config_from_dict(fields, dtype=jnp.dtype(jnp.bfloat16)) == config


def test_save_then_load_gives_the_bf16_params_and_an_inference_config(tmp_path):
  config = _config()
  dummy = jnp.ones((1, 4), jnp.int32)  # [batch, length]
  params = Transformer(config).init(jax.random.PRNGKey(0), dummy, dummy)['params']
  out = str(tmp_path / 'm')
  path = model_dir.save(params, out, config, step=7)
  assert path.endswith('checkpoint_7')
  assert load_params(path)['token_embedder']['embedding'].dtype == jnp.bfloat16
  model_dir.save(params, out, config, step=3)  # The highest step is the one loaded.
  loaded_config, loaded = model_dir.load(out)
  assert loaded_config == _config(dtype=jnp.dtype(jnp.float32), dropout_rate=0.0)
  want = jax.tree_util.tree_map(lambda x: np.asarray(x.astype(jnp.bfloat16), np.float32),
                                params)
  got = jax.tree_util.tree_map(np.asarray, loaded)
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, w)
  assert model_dir.load(out, dtype='bfloat16')[0].dtype == jnp.bfloat16


def test_a_config_that_does_not_fit_the_checkpoint_is_refused(tmp_path):
  config = _config()
  dummy = jnp.ones((1, 4), jnp.int32)
  params = Transformer(config).init(jax.random.PRNGKey(0), dummy, dummy)['params']
  model_dir.save(params, str(tmp_path), config, step=1)
  fields = model_dir.config_to_dict(_config(emb_dim=24))
  (tmp_path / 'config.json').write_text(json.dumps(fields))
  with pytest.raises(ValueError):
    model_dir.load(str(tmp_path))
