"""specdec_t5x.partitioning: T5X-style partition specs, and sharded == unsharded decoding.

The decoding check runs in a subprocess with 8 fake CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before JAX starts).
"""
import textwrap

import jax
import pytest
from conftest import run_child
from jax.sharding import PartitionSpec as P

from specdec_t5x.integration import partitioning
from specdec_t5x.algorithm.network import T5Config, Transformer

pytestmark = pytest.mark.slow  # subprocesses with several XLA devices



def _params(v11=True, layers=1):
  cfg = T5Config(vocab_size=64, emb_dim=16, num_heads=2, num_encoder_layers=layers,
                 num_decoder_layers=layers, head_dim=8, mlp_dim=32, dropout_rate=0.0,
                 mlp_activations=('gelu', 'linear') if v11 else ('relu',),
                 logits_via_embedding=not v11)
  dummy = jax.numpy.ones((1, 3), jax.numpy.int32)
  return jax.eval_shape(Transformer(cfg).init, jax.random.PRNGKey(0), dummy, dummy)['params']


def test_t5x_partition_specs_of_every_parameter():
  specs = partitioning.param_partition_specs(_params())
  enc, dec = specs['encoder'], specs['decoder']
  assert specs['token_embedder']['embedding'] == P('model', None)
  for block in (enc['layers_0']['attention'], dec['layers_0']['self_attention'],
                dec['layers_0']['encoder_decoder_attention']):
    for name in ('query', 'key', 'value'):
      assert block[name]['kernel'] == P(None, 'model')
    assert block['out']['kernel'] == P('model', None)
  for mlp in (enc['layers_0']['mlp'], dec['layers_0']['mlp']):
    assert mlp['wi_0']['kernel'] == mlp['wi_1']['kernel'] == P(None, 'model')
    assert mlp['wo']['kernel'] == P('model', None)
  assert dec['logits_dense']['kernel'] == P(None, 'model')
  assert enc['relpos_bias']['rel_embedding'] == P(None, None)
  assert enc['encoder_norm']['scale'] == dec['layers_0']['pre_mlp_layer_norm']['scale'] == P(None)
  flat = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, P))
  assert all(isinstance(s, P) for s in flat)


def test_v1_0_tree_and_rules():
  specs = partitioning.param_partition_specs(_params(v11=False))
  assert specs['decoder']['layers_0']['mlp']['wi']['kernel'] == P(None, 'model')
  assert 'logits_dense' not in specs['decoder']  # tied to the embedding
  rules = dict(partitioning.standard_logical_axis_rules())
  assert rules['batch'] == 'data' and rules['embed'] is None and rules['kv'] is None
  assert {rules[k] for k in ('vocab', 'mlp', 'heads', 'joined_kv')} == {'model'}


def test_indivisible_dims_are_replicated():
  # 'model' of size 3 divides neither 64 (vocab) nor 16 (2 heads x 8): all replicated.
  specs = partitioning.param_partition_specs(_params(), mesh_shape={'data': 1, 'model': 3})
  assert specs['token_embedder']['embedding'] == P(None, None)
  assert specs['decoder']['layers_0']['mlp']['wo']['kernel'] == P(None, None)
  assert partitioning.logical_to_mesh_spec(('vocab', 'vocab'), [('vocab', 'model')], (4, 4),
                                           {'model': 2}) == P('model', None)


def test_batch_spec_on_one_device():
  part = partitioning.PjitPartitioner()
  assert part.batch_spec(3) == P('data') and part.data_parallel_size == 1
  with pytest.raises(ValueError, match='must divide'):
    _ = partitioning.PjitPartitioner(num_partitions=3).mesh


_CHILD = textwrap.dedent('''
    import json
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from specdec_t5x import generate
    from specdec_t5x.integration import partitioning
    from specdec_t5x.algorithm.network import T5Config, Transformer
    assert jax.device_count() == 8, jax.devices()

    def model(emb, layers, seed):
      cfg = T5Config(vocab_size=64, emb_dim=emb, num_heads=4, num_encoder_layers=layers,
                     num_decoder_layers=layers, head_dim=8, mlp_dim=2 * emb,
                     mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
      module, dummy = Transformer(cfg), jax.numpy.ones((1, 4), jax.numpy.int32)
      return module, module.init(jax.random.PRNGKey(seed), dummy, dummy)['params']

    target, draft = model(32, 2, 0), model(16, 1, 1)
    rs = np.random.RandomState(0)
    x = rs.randint(2, 64, size=(4, 12)).astype(np.int32)
    x[1, 7:] = 0
    x[3, 3:] = 0
    out = {}
    for parts in (2, 8):  # mesh (data 4, model 2) and (data 1, model 8)
      part = partitioning.PjitPartitioner(num_partitions=parts)
      tp, dp, xs = (part.shard_params(target[1]), part.shard_params(draft[1]),
                    part.shard_batch(x))
      q = tp['decoder']['layers_1']['self_attention']['query']['kernel']
      out[f'query_{parts}'] = [list(q.sharding.spec), len({s.device for s in q.addressable_shards})]
      out[f'batch_{parts}'] = list(xs.sharding.spec)
      for name, ref_draft, sh_draft in (('ar', None, None), ('spec', draft, (draft[0], dp))):
        if name == 'ar' and parts == 8:
          continue  # one model-parallel-only case suffices (compilation time)
        kw = dict(gamma=3, max_decode_length=10, temperature=0.0)
        ref = generate(target, x, draft=ref_draft, **kw)
        got = generate((target[0], tp), xs, draft=sh_draft, **kw)
        out[f'{name}_{parts}'] = {
            'tokens': bool(np.array_equal(np.asarray(ref.tokens), np.asarray(got.tokens))),
            'stats': all(np.array_equal(np.asarray(ref.stats[k]), np.asarray(got.stats[k]))
                         for k in ref.stats),
            'nonzero': int(np.count_nonzero(np.asarray(ref.tokens))),
            'gathered': bool(np.array_equal(  # what infer.py does with the outputs
                multihost_utils.process_allgather(got.tokens, tiled=True), ref.tokens))}
    print('RESULT ' + json.dumps(out))
''')


def test_sharded_equals_unsharded_on_8_devices():
  out = run_child(_CHILD, host_devices=8)
  assert out['query_2'] == out['query_8'] == [[None, 'model'], 8]
  assert out['batch_2'] == out['batch_8'] == ['data']  # 'data' has size 1 in the second
  for key in ('ar_2', 'spec_2', 'spec_8'):
    assert out[key]['tokens'] and out[key]['stats'] and out[key]['gathered'], (key, out[key])
    assert out[key]['nonzero'] > 0
