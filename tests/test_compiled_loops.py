"""The compiled decode loops copy no cache or weight per step (research/measure/hlo_loops.py).

XLA's dot path (as accelerators get it) on 8 fake CPU devices, with T5X's partitioning
(num_partitions 8: one head per device; 1: data parallel), batch 1 and 8, autoregressive,
speculative and over draft trees (static and dynamic), with a draft model or a feature
head: the while bodies may copy or transpose per-call activations, never a buffer as large
as a cache the loop carries or a weight.
"""
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_child

from specdec_t5x.algorithm import api, layers, network
from specdec_t5x.algorithm.cpu import packing
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import hlo_loops

pytestmark = pytest.mark.slow  # audits for speed: not an exactness guard


_CHILD = textwrap.dedent('''
    import json, os
    # Compiled to be read, never run: LLVM's optimisation of the CPU code is skipped (the
    # optimised HLO audited here is XLA's, the same at every backend level).
    os.environ['XLA_FLAGS'] += ' --xla_backend_optimization_level=0'
    import jax, jax.numpy as jnp, numpy as np
    from specdec_t5x.algorithm import api, feature_draft, network
    from specdec_t5x.algorithm.cpu import packing
    from specdec_t5x.algorithm.config import DecodeConfig
    from specdec_t5x.integration import partitioning
    from specdec_t5x.research.measure import hlo_loops
    assert jax.device_count() == 8, jax.devices()

    def model(emb, seed):
      cfg = network.T5Config(vocab_size=256, emb_dim=emb, num_heads=8, num_encoder_layers=1,
                             num_decoder_layers=1, head_dim=16, mlp_dim=2 * emb,
                             mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
      module, dummy = network.Transformer(cfg), jnp.ones((1, 4), jnp.int32)
      return module, module.init(jax.random.PRNGKey(seed), dummy, dummy)['params']

    target, draft = model(64, 0), model(48, 1)
    head_config = feature_draft.FeatureDraftConfig(vocab_size=256, target_emb_dim=64,
                                                   emb_dim=64, num_heads=8, head_dim=16,
                                                   mlp_dim=128)
    head = (feature_draft.FeatureDraft(head_config),
            feature_draft.init_params(head_config, jax.random.PRNGKey(2), target[1]))
    out = {}
    for batch in (1, 8):
      for parts in (8, 1):
        part = partitioning.PjitPartitioner(num_partitions=parts)
        x = part.shard_batch(
            np.random.RandomState(0).randint(2, 256, size=(batch, 16)).astype(np.int32))
        # The smallest cache leaf on one device: its rows, its heads, head_dim and the
        # autoregressive cache's slots (max_len positions, one more, and position -1).
        rows = x.sharding.shard_shape(x.shape)[0]
        cache = rows * (8 // parts) * 16 * (32 + 2)
        # the chain, a draft tree (chain + copy branch + a sibling: static_tree.py), the
        # draft's dynamic tree (its tree calls: dynamic_tree.py), with a copy branch grafted
        # onto it (a mixed tree), and the feature head's
        # chain, tree and dynamic tree (the target's features gathered along the accepted
        # path; the head's tree calls)
        tree = DecodeConfig(gamma=3, copy_branch=2, draft_siblings=1)
        for name, drafted, config in (
            ('ar', None, DecodeConfig(gamma=3)), ('spec', draft, DecodeConfig(gamma=3)),
            ('tree', draft, tree), ('dynamic', draft, DecodeConfig(gamma=3, draft_tree_width=2)),
            ('mixed', draft, DecodeConfig(gamma=3, draft_tree_width=2, copy_branch=2)),
            ('head', head, DecodeConfig(gamma=3)), ('head_tree', head, tree),
            ('head_dynamic', head, DecodeConfig(gamma=3, draft_tree_width=2))):
          fn = api.compiled_program(target[0], drafted and drafted[0], max_len=32, config=config)
          args = (packing.decode_variables(target[0], part.shard_params(target[1])),
                  drafted and packing.decode_variables(drafted[0], part.shard_params(drafted[1])),
                  x, jax.random.PRNGKey(0), jnp.int32(1))
          hlo = fn.lower(*args).compile().as_text()
          out[f'{name}_b{batch}_p{parts}'] = hlo_loops.loop_traffic(hlo, cache).summary()
    print('RESULT ' + json.dumps(out))
''')


@pytest.mark.slow  # a subprocess on 8 host devices
def test_no_whole_buffer_copies_in_the_decode_loops_on_8_devices():
  out = run_child(_CHILD, host_devices=8, timeout=900, SPECDEC_CPU_KERNELS='0')
  assert len(out) == 32
  for key, found in out.items():
    assert found['whole_buffer'] == [], (key, found)


def test_tied_logits_with_xla_dot_copy_no_embedding_per_step_on_cpu():
  """XLA:CPU transposes and copies a tied embedding on every one-row logits call; the
  decode variables carry it transposed once (layers.TRANSPOSED), with the same tokens."""
  cfg = network.T5Config(vocab_size=512, emb_dim=32, num_heads=4, num_encoder_layers=1,
                         num_decoder_layers=1, head_dim=8, mlp_dim=64, dropout_rate=0.0,
                         logits_via_embedding=True)
  module = network.Transformer(cfg)
  x = jnp.asarray(np.random.RandomState(0).randint(2, 512, size=(1, 6)), jnp.int32)
  params = module.init(jax.random.PRNGKey(0), x, x)['params']
  decode = packing.decode_variables(module, params, 'xla')
  assert decode[layers.TRANSPOSED]['token_embedder']['embedding'].shape == (32, 512)
  assert packing.decode_variables(module, params, 'xla')[layers.TRANSPOSED] is decode[layers.TRANSPOSED]
  for draft in (None, module):
    fn = api.compiled_program(module, draft, max_len=16, config=DecodeConfig(gamma=3, cpu_kernels='xla'))
    found = {}
    for label, variables in (('plain', {'params': params}), ('decode', decode)):
      args = (variables, draft and variables, x, jax.random.PRNGKey(0), jnp.int32(1))
      found[label] = hlo_loops.loop_traffic(fn.lower(*args).compile().as_text(), 512 * 32)
      found[label + '_tokens'] = np.asarray(fn(*args)[0])
    assert found['plain'].whole_buffer, 'XLA:CPU no longer copies the table: drop TRANSPOSED'
    assert found['decode'].whole_buffer == [], found['decode'].summary()
    np.testing.assert_array_equal(found['plain_tokens'], found['decode_tokens'])


_LOOP = '''
%body (p: (s32[], f32[1,8,16,29], f32[64,128])) -> (s32[], f32[1,8,16,29], f32[64,128]) {
  %p = (s32[], f32[1,8,16,29]{3,2,1,0}, f32[64,128]{1,0}) parameter(0)
  %c = f32[1,8,16,29]{3,2,1,0} get-tuple-element(%p), index=1
  %w = f32[64,128]{1,0} get-tuple-element(%p), index=2
  %copy.1 = f32[1,8,16,29]{3,2,1,0} copy(%c)
  %transpose.2 = f32[128,64]{0,1} transpose(%w), dimensions={1,0}
  %copy.3 = f32[1,8,4,16]{3,2,1,0} copy(%c)
  %fusion = f32[1,8,16,29]{3,2,1,0} fusion(%copy.1), kind=kLoop, calls=%fused
}

%fused (x: f32[1,8,16,29]) -> f32[1,8,16,29] {
  %x = f32[1,8,16,29]{3,2,1,0} parameter(0)
  %copy.4 = f32[1,8,16,29]{3,2,1,0} copy(%x)
}

ENTRY %main (a: f32[1,8,16,29]) -> f32[1,8,16,29] {
  %w.0 = (s32[], f32[1,8,16,29]{3,2,1,0}, f32[64,128]{1,0}) while(%t), condition=%cond, body=%body
  %copy.9 = f32[1,8,16,29]{3,2,1,0} copy(%a)
}
'''


def test_loop_traffic_finds_copies_of_carried_buffers():
  found = hlo_loops.loop_traffic(_LOOP, 8 * 16 * 29)
  # The cache copies in the body and in a computation it calls, the weight's transpose;
  # not the activation-sized copy, nor the copy outside the loop.
  assert sorted(op for op, _ in found.whole_buffer) == ['copy', 'copy', 'transpose']
  assert sum(found.ops.values()) == 4
  with pytest.raises(ValueError, match='no while loop'):
    hlo_loops.loop_traffic('ENTRY %main (a: f32[2]) -> f32[2] {\n}\n', 1)
