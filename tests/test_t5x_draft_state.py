"""The draft's weights under T5X (integration/draft_state.py): restored with the target by
T5X's own checkpoint manager, partitioned by the draft's logical axes, and passed to the
compiled predict program as arguments, never as constants.

Runs T5X's machinery as `t5x.infer` does (TrainStateInitializer over the model's initial
variables, create_checkpoint_manager_and_restore with the state transformation that
configs/runs/infer.gin binds, the infer step partitioned as t5x.utils.get_infer_fn
partitions it) on 8 host devices with PjitPartitioner(num_partitions=8), in a subprocess.
"""
import textwrap

import pytest
from conftest import run_child

pytest.importorskip('t5x', reason='T5X is not installed (not on PyPI; see docs/t5x.md)')
# pylint: disable=g-import-not-at-top,g-bad-import-order
import jax
import numpy as np
from t5x import models as t5x_models
from t5x.examples.t5 import network as t5x_network

from specdec_t5x.integration import draft_state, models
from specdec_t5x.algorithm.network import T5Config


_CHILD = textwrap.dedent('''
    import dataclasses, functools, json, re
    import jax, jax.numpy as jnp, numpy as np
    from t5x import checkpoints, partitioning, train_state, utils
    from t5x.examples.t5 import network as t5x_network
    from specdec_t5x import generate
    from specdec_t5x.algorithm import network
    from specdec_t5x.algorithm.config import DecodeConfig
    from specdec_t5x.integration import checkpoints as our_checkpoints, draft_state, models
    assert jax.device_count() == 8, jax.devices()
    root = {root!r}

    def config(emb):
      return dict(vocab_size=64, emb_dim=emb, num_heads=8, num_encoder_layers=1,
                  num_decoder_layers=1, head_dim=16, mlp_dim=2 * emb, dropout_rate=0.0,
                  mlp_activations=('gelu', 'linear'), logits_via_embedding=False)

    def save(cfg, seed, name):  # a checkpoint written by T5X's own Checkpointer
      dummy = jnp.ones((1, 4), jnp.int32)
      variables = t5x_network.Transformer(t5x_network.T5Config(**cfg)).init(
          jax.random.PRNGKey(seed), dummy, dummy, dummy)
      state = train_state.InferenceState.create(variables)
      checkpoints.Checkpointer(state, partitioning.PjitPartitioner(num_partitions=1),
                               f'{{root}}/{{name}}').save(state)
      return f'{{root}}/{{name}}/checkpoint_0'

    target_path, draft_path = save(config(64), 0, 'target'), save(config(128), 1, 'draft')
    draft_cfg = network.T5Config(**config(128))
    model = models.SpeculativeEncoderDecoderModel(
        module=t5x_network.Transformer(t5x_network.T5Config(**config(64))),
        input_vocabulary=None, output_vocabulary=None, optimizer_def=None,
        draft_config=draft_cfg, draft_checkpoint=draft_path,
        decode_config=DecodeConfig(gamma=3))
    partitioner = partitioning.PjitPartitioner(num_partitions=8)
    shapes = dict(encoder_input_tokens=(1, 16), decoder_input_tokens=(1, 12),
                  decoder_target_tokens=(1, 12), decoder_loss_weights=(1, 12))
    initializer = utils.TrainStateInitializer(
        optimizer_def=None, init_fn=model.get_initial_variables, input_shapes=shapes,
        input_types={{k: jnp.int32 for k in shapes}}, partitioner=partitioner)
    restore_cfg = utils.RestoreCheckpointConfig(
        path=target_path, mode='specific', strict=False, dtype='float32',
        state_transformation_fns=[functools.partial(
            draft_state.restore_draft, checkpoint=draft_path, config=draft_cfg,
            dtype='float32')])
    state, _ = utils.create_checkpoint_manager_and_restore(
        initializer, partitioner, restore_cfg, target_path, None, use_orbax=True)
    axes = initializer.train_state_axes
    step = partitioner.partition(
        lambda p, b, r, m: model.predict_batch_with_aux(p, b, r, flax_mutables=m),
        in_axis_resources=(axes.params, partitioner.data_partition_spec, None,
                           axes.flax_mutables),
        out_axis_resources=None)
    enc = np.random.RandomState(0).randint(2, 64, size=(1, 16)).astype(np.int32)
    batch = dict(encoder_input_tokens=enc, decoder_input_tokens=np.zeros((1, 12), np.int32))
    rng = jax.random.PRNGKey(0)
    compiled = step.lower(state.params, batch, rng, state.flax_mutables).compile()
    hlo = compiled.as_text()
    constants = [int(np.prod([int(d) for d in dims.split(',') if d] or [1])) * {{'f32': 4,
                 'bf16': 2, 's32': 4, 'u32': 4, 'pred': 1}}.get(t, 4)
                 for t, dims in re.findall(r'= (\\w+)\\[([\\d,]*)\\]\\S* constant\\(', hlo)]
    kernel = state.flax_mutables['draft']['decoder']['layers_0']['mlp']['wi_0']['kernel']
    decodes, _ = step(state.params, batch, rng, state.flax_mutables)
    restored = our_checkpoints.load_params(draft_path, config=draft_cfg)
    ours = model.target_module
    ref = generate((ours, jax.device_get(state.params)), enc,
                   draft=(model.draft_module, restored), gamma=3, max_decode_length=12)
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree_util.tree_leaves(jax.device_get(state.flax_mutables['draft'])),
        jax.tree_util.tree_leaves(restored)))
    print('RESULT ' + json.dumps(dict(
        largest_constant=max(constants or [0]),
        draft_kernel_spec=[str(a) for a in kernel.sharding.spec],
        draft_kernel_devices=len({{s.device for s in kernel.addressable_shards}}),
        draft_kernel_shard=list(kernel.addressable_shards[0].data.shape),
        restored_equal=same,
        decodes_equal=bool(np.array_equal(np.asarray(decodes), np.asarray(ref.tokens))))))
''')


@pytest.mark.slow  # a subprocess on 8 host devices under T5X's partitioner
def test_draft_weights_are_sharded_arguments_of_the_t5x_predict_program(tmp_path):
  out = run_child(_CHILD.format(root=str(tmp_path)), host_devices=8, timeout=900)
  assert out['restored_equal']  # the draft checkpoint's weights, restored by T5X
  assert out['largest_constant'] < 4096, out  # no weight baked into the program
  assert out['draft_kernel_spec'] == ['None', 'model'], out  # [embed, mlp] over 8 devices
  assert out['draft_kernel_devices'] == 8 and out['draft_kernel_shard'] == [128, 256 // 8]
  assert out['decodes_equal'], out


def _model(**kw):
  cfg = dict(vocab_size=32, emb_dim=8, num_heads=2, num_encoder_layers=1,
             num_decoder_layers=1, head_dim=4, mlp_dim=16, dropout_rate=0.0)
  return models.SpeculativeEncoderDecoderModel(
      module=t5x_network.Transformer(t5x_network.T5Config(**cfg)), input_vocabulary=None,
      output_vocabulary=None, optimizer_def=None, **kw), T5Config(**cfg)


def test_initial_variables_carry_a_t5_draft_and_its_axes_only():
  shapes = {'encoder_input_tokens': (1, 4), 'decoder_input_tokens': (1, 4)}
  model, cfg = _model(draft_config=None)
  assert draft_state.COLLECTION not in model.get_initial_variables(jax.random.PRNGKey(0), shapes)
  model, cfg = _model(draft_config=cfg)
  variables = model.get_initial_variables(jax.random.PRNGKey(0), shapes)
  assert isinstance(model, t5x_models.EncoderDecoderModel)
  draft, axes = variables['draft'], variables['draft_axes']
  assert (jax.tree_util.tree_structure(draft['decoder']['layers_0']['mlp'])
          == jax.tree_util.tree_structure(variables['params']['decoder']['layers_0']['mlp']))
  names = axes['decoder']['layers_0']['mlp']['wi']['kernel_axes'].names
  assert names == ('embed', 'mlp')


def test_restore_draft_fills_the_state_or_says_what_is_missing(tmp_path):
  from specdec_t5x.integration import checkpoints  # pylint: disable=g-import-not-at-top
  model, cfg = _model(draft_config=None)
  params = models.init_params(model.target_module, jax.random.PRNGKey(3))
  path = checkpoints.save_params(params, str(tmp_path / 'checkpoint_1'), step=1)
  ckpt = {'target': {'x': 1}, 'state': {'step': 1}}
  assert draft_state.restore_draft(ckpt, {'target': {}}, checkpoint=path) == ckpt
  out = draft_state.restore_draft(ckpt, {'flax_mutables': {'draft': {}}}, checkpoint=path,
                                  config=cfg)
  assert out['target'] == ckpt['target']
  got = out['flax_mutables']['draft']['decoder']['layers_0']['mlp']['wi']['kernel']
  assert isinstance(got, np.ndarray)
  np.testing.assert_array_equal(got, params['decoder']['layers_0']['mlp']['wi']['kernel'])
  with pytest.raises(ValueError, match='DRAFT_CHECKPOINT is None'):
    draft_state.restore_draft(ckpt, {'flax_mutables': {'draft': {}}}, checkpoint=None)
