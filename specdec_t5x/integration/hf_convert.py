"""Hugging Face T5 <-> T5X parameter trees, and local HF model directories.

`params_from_hf_state_dict` maps a `T5ForConditionalGeneration` state dict onto T5X's tree
(specdec_t5x.integration.param_tree), `hf_state_dict_from_params` maps it back, and
`load_hf_checkpoint` reads a `save_pretrained` directory (safetensors or pytorch_model.bin;
never the hub). torch, safetensors and transformers are imported only by the functions that
need them, so the mapping itself needs numpy alone.
"""

import glob
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from specdec_t5x.algorithm.layers import MAX_DISTANCE, NUM_BUCKETS
from specdec_t5x.integration import extras
from specdec_t5x.integration.param_tree import (ATTENTION_BLOCKS, PROJECTIONS, Params, Path,
                                                 mlp_in_names, num_layers, validate_params)

# HF's module for each T5X attention module, and its short projection names.
_HF_ATTENTION = {'attention': 'SelfAttention', 'self_attention': 'SelfAttention',
                 'encoder_decoder_attention': 'EncDecAttention'}
_HF_PROJECTION = {'query': 'q', 'key': 'k', 'value': 'v', 'out': 'o'}


def _hf_pairs(config: Any) -> list[tuple[str, Path, bool]]:
  """(HF key, T5X path, transpose?) for every parameter; torch Linear is [out, in]."""
  pairs = [('shared.weight', ('token_embedder', 'embedding'), False)]
  for stack, blocks in ATTENTION_BLOCKS.items():
    pairs.append((f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
                  (stack, 'relpos_bias', 'rel_embedding'), True))  # [buckets, heads]
    for i in range(num_layers(config, stack)):
      hf, layer = f'{stack}.block.{i}.layer', (stack, f'layers_{i}')
      for j, (name, norm) in enumerate(blocks):  # HF sub-layer j of the layer
        module = _HF_ATTENTION[name]
        pairs += [(f'{hf}.{j}.{module}.{_HF_PROJECTION[proj]}.weight',
                   layer + (name, proj, 'kernel'), True) for proj in PROJECTIONS]
        pairs.append((f'{hf}.{j}.layer_norm.weight', layer + (norm, 'scale'), False))
      j = len(blocks)
      pairs += [(f'{hf}.{j}.DenseReluDense.{w}.weight', layer + ('mlp', w, 'kernel'), True)
                for w in mlp_in_names(config) + ('wo',)]
      pairs.append((f'{hf}.{j}.layer_norm.weight', layer + ('pre_mlp_layer_norm', 'scale'),
                    False))
    pairs.append((f'{stack}.final_layer_norm.weight', (stack, f'{stack}_norm', 'scale'), False))
  if not config.logits_via_embedding:
    pairs.append(('lm_head.weight', ('decoder', 'logits_dense', 'kernel'), True))
  return pairs


def _to_numpy(x: Any) -> np.ndarray:
  """Torch tensor or array -> numpy, keeping bfloat16 bit-exact."""
  if hasattr(x, 'detach'):
    x = x.detach().cpu()
    if str(x.dtype) == 'torch.bfloat16':
      import torch  # pylint: disable=g-import-not-at-top
      return x.view(torch.int16).numpy().view(jnp.bfloat16)
    return x.numpy()
  return np.asarray(x)


# Keys that HF state dicts carry as aliases of others (tied) or that HF itself ignores.
_HF_ALIASES = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight', 'lm_head.weight',
               'decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight')


def params_from_hf_state_dict(state_dict: Mapping[str, Any], config: Any) -> Params:
  """Maps a HF `T5ForConditionalGeneration` state dict (torch or numpy) onto T5X's tree.

  Tied keys may be absent (as in `save_pretrained` files): a missing `lm_head.weight` is
  `shared.weight`. `config.logits_via_embedding` picks tied (v1.0) or logits_dense (v1.1).
  Returns numpy arrays in HF's dtype (bfloat16 kept bit-exact).
  """
  sd = dict(state_dict)
  if 'lm_head.weight' not in sd and 'shared.weight' in sd:
    sd['lm_head.weight'] = sd['shared.weight']
  flat, used = {}, set()
  for hf_key, path, transpose in _hf_pairs(config):
    if hf_key not in sd:
      raise ValueError(f'HF state dict lacks {hf_key!r} (needed for {"/".join(path)})')
    arr = _to_numpy(sd[hf_key])
    flat[path] = np.ascontiguousarray(arr.T) if transpose else arr
    used.add(hf_key)
  if config.logits_via_embedding and not np.array_equal(
      _to_numpy(sd['lm_head.weight']), flat[('token_embedder', 'embedding')]):
    raise ValueError('config ties logits to the embedding (logits_via_embedding=True) but '
                     'lm_head.weight differs from shared.weight')
  unused = sorted(set(sd) - used - set(_HF_ALIASES))
  if unused:
    raise ValueError(f'HF state dict has keys the config does not account for: {unused[:5]}')
  params = traverse_util.unflatten_dict(flat)
  validate_params(params, config)
  return params


def hf_state_dict_from_params(params: Mapping[str, Any], config: Any) -> dict[str, np.ndarray]:
  """Inverse of `params_from_hf_state_dict`: every key of HF's `model.state_dict()`.

  Note: transformers >= 5 always ties `lm_head` to `shared`; to load a v1.1 tree whose
  logits_dense differs, assign `lm_head.weight` as a fresh parameter after loading.
  """
  flat = traverse_util.flatten_dict(params)
  sd = {}
  for hf_key, path, transpose in _hf_pairs(config):
    arr = np.asarray(flat[path])
    sd[hf_key] = np.ascontiguousarray(arr.T) if transpose else arr
  for alias in ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'):
    sd[alias] = sd['shared.weight']
  sd.setdefault('lm_head.weight', sd['shared.weight'])
  return sd


def t5_config_from_hf(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """T5Config kwargs from a HF T5 `config.json` dict.

  Logits are tied-and-scaled (T5X's logits_via_embedding) when HF scales decoder outputs:
  `scale_decoder_outputs` in transformers >= 5, `tie_word_embeddings` before.
  """
  fixed = (hf_config.get('relative_attention_num_buckets', NUM_BUCKETS),
           hf_config.get('relative_attention_max_distance', MAX_DISTANCE),
           hf_config.get('layer_norm_epsilon', 1e-6))
  if fixed != (NUM_BUCKETS, MAX_DISTANCE, 1e-6):
    raise ValueError(f'T5X fixes (buckets, max distance, layer-norm eps) = (32, 128, 1e-6); '
                     f'this config has {fixed}')
  proj = hf_config.get('feed_forward_proj', 'relu').split('-')
  act = {'gelu_new': 'gelu', 'gelu_pytorch_tanh': 'gelu'}.get(proj[-1], proj[-1])
  scale = hf_config.get('scale_decoder_outputs', hf_config.get('tie_word_embeddings', True))
  return dict(
      vocab_size=hf_config['vocab_size'],
      emb_dim=hf_config['d_model'],
      num_heads=hf_config['num_heads'],
      num_encoder_layers=hf_config['num_layers'],
      num_decoder_layers=hf_config.get('num_decoder_layers') or hf_config['num_layers'],
      head_dim=hf_config['d_kv'],
      mlp_dim=hf_config['d_ff'],
      mlp_activations=(act, 'linear') if proj[0] == 'gated' else (act,),
      dropout_rate=hf_config.get('dropout_rate', 0.1),
      logits_via_embedding=bool(scale),
  )


def _read_hf_weights(path: str) -> dict[str, Any]:
  """Reads model.safetensors (single or sharded) or pytorch_model.bin from `path`."""
  index = os.path.join(path, 'model.safetensors.index.json')
  single = os.path.join(path, 'model.safetensors')
  if os.path.isfile(index) or os.path.isfile(single):
    load_file = extras.need('safetensors.numpy', 'Reading a Hugging Face checkpoint').load_file
    files = [single]
    if os.path.isfile(index):
      with open(index) as f:
        files = sorted({os.path.join(path, v) for v in json.load(f)['weight_map'].values()})
    return {k: v for file in files for k, v in load_file(file).items()}
  bins = sorted(glob.glob(os.path.join(path, 'pytorch_model*.bin')))
  if bins:
    torch = extras.need('torch', 'Reading pytorch_model.bin')
    return {k: v for b in bins
            for k, v in torch.load(b, map_location='cpu', weights_only=True).items()}
  raise FileNotFoundError(f'{path} has no model.safetensors or pytorch_model.bin')


def load_hf_checkpoint(path: str, config: Any = None) -> tuple[Params, Any]:
  """Loads a local HF T5 model directory (never the hub) as (params, config).

  `path` is a `save_pretrained` directory: config.json plus model.safetensors (possibly
  sharded) or pytorch_model.bin. When `config` is None, a `network.T5Config` is built from
  config.json with `t5_config_from_hf`.
  """
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f'HF model directory does not exist: {path}')
  if config is None:
    from specdec_t5x.algorithm.network import T5Config  # pylint: disable=g-import-not-at-top
    with open(os.path.join(path, 'config.json')) as f:
      config = T5Config(**t5_config_from_hf(json.load(f)))
  return params_from_hf_state_dict(_read_hf_weights(path), config), config


def hf_model_from_params(params: Params, config: Any):
  """A Hugging Face `T5ForConditionalGeneration` (PyTorch, eval mode) with our weights.

  Handles v1.1 (own logits layer: transformers >= 5 ties lm_head to `shared` by default,
  so it is untied first) and tied-and-scaled logits (v1.0 / logits_via_embedding).
  Needs torch and transformers (test extras).
  """
  torch = extras.need('torch', 'A Hugging Face model of our weights')
  transformers = extras.need('transformers', 'A Hugging Face model of our weights')
  tied = bool(config.logits_via_embedding)
  hf_config = transformers.T5Config(
      vocab_size=config.vocab_size, d_model=config.emb_dim, d_kv=config.head_dim,
      d_ff=config.mlp_dim, num_layers=config.num_encoder_layers,
      num_decoder_layers=config.num_decoder_layers, num_heads=config.num_heads,
      feed_forward_proj='gated-gelu' if len(config.mlp_activations) == 2 else 'relu',
      dropout_rate=0.0, relative_attention_num_buckets=NUM_BUCKETS,
      relative_attention_max_distance=MAX_DISTANCE,
      layer_norm_epsilon=1e-6, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
      tie_word_embeddings=tied, scale_decoder_outputs=tied)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  state = {k: torch.from_numpy(np.array(v, np.float32))
           for k, v in hf_state_dict_from_params(params, config).items()}
  if not tied:
    model.lm_head.weight = torch.nn.Parameter(state['lm_head.weight'].clone())
  model.load_state_dict(state, strict=True)
  return model
