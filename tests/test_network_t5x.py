"""Our Transformer under real T5X: T5X's module signature, params_axes, and T5X's logits.

T5X (google-research/t5x) is required here; CI installs it. The other network tests
(test_network.py) do not import it.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
from flax import traverse_util
from t5x import adafactor, models, partitioning, train_state
from t5x.examples.t5 import network as t5x_network

from conftest import jit_apply
from specdec_t5x.algorithm import network
VOCAB = 40
BASE = dict(vocab_size=VOCAB, emb_dim=32, num_heads=4, num_encoder_layers=2,
            num_decoder_layers=2, head_dim=8, mlp_dim=64, dropout_rate=0.0)
VERSIONS = {
    'v1.1': dict(mlp_activations=('gelu', 'linear'), logits_via_embedding=False),
    'v1.0': dict(mlp_activations=('relu',), logits_via_embedding=True),
}
FEATURES = ('encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens',
            'encoder_segment_ids', 'decoder_segment_ids', 'encoder_positions',
            'decoder_positions')


def _modules(version, **overrides):
  kw = dict(BASE, **VERSIONS[version], **overrides)
  return (network.Transformer(network.T5Config(**kw)),
          t5x_network.Transformer(t5x_network.T5Config(**kw)))


def _t5x_model(module):
  vocab = seqio.PassThroughVocabulary(VOCAB)
  return models.EncoderDecoderModel(module, vocab, vocab, adafactor.Adafactor())


def _packed_batch():
  """Two rows: row 0 packs examples A (enc 4, dec 3) and B (enc 3, dec 4); row 1 is one
  example; both padded. Returns (T5X batch [batch, length] arrays, example B alone)."""
  rs = np.random.RandomState(0)
  tok = lambda n: rs.randint(2, VOCAB, size=n).astype(np.int32)
  enc_a, enc_b, enc_c = tok(4), tok(3), tok(6)
  tgt_a, tgt_b, tgt_c = tok(3), tok(4), tok(5)
  enc_len, dec_len = 9, 9
  def row(parts, length):
    tokens, seg, pos = (np.zeros(length, np.int32) for _ in range(3))
    i = 0
    for s, p in enumerate(parts, 1):
      tokens[i:i + len(p)], seg[i:i + len(p)], pos[i:i + len(p)] = p, s, np.arange(len(p))
      i += len(p)
    return tokens, seg, pos
  def shift(tgt, seg):  # T5X's packed shift: 0 at the start of every segment.
    out = np.concatenate([[0], tgt[:-1]]).astype(np.int32)
    out[np.concatenate([[True], seg[1:] != seg[:-1]])] = 0
    return out * (seg > 0)
  rows = []
  for encs, tgts in (([enc_a, enc_b], [tgt_a, tgt_b]), ([enc_c], [tgt_c])):
    e, es, ep = row(encs, enc_len)
    t, ds, dp = row(tgts, dec_len)
    rows.append(dict(zip(FEATURES, (e, shift(t, ds), t, es, ds, ep, dp))))
  batch = {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in FEATURES}
  alone = (jnp.asarray(enc_b[None]), jnp.asarray(shift(tgt_b, np.ones(4, np.int32))[None]),
           jnp.asarray(tgt_b[None]))
  return batch, alone


@pytest.mark.parametrize('version', sorted(VERSIONS))
def test_t5x_get_initial_variables_matches_t5x_network(version):
  ours, theirs = _modules(version)
  shapes = {k: (2, 6) for k in FEATURES}
  types = {k: jnp.int32 for k in FEATURES}
  rng = jax.random.PRNGKey(0)
  v_ours = _t5x_model(ours).get_initial_variables(rng, shapes, types)
  v_theirs = _t5x_model(theirs).get_initial_variables(rng, shapes, types)
  assert set(v_ours) == set(v_theirs) == {'params', 'params_axes'}
  shape_of = lambda v: {k: x.shape for k, x in traverse_util.flatten_dict(v['params']).items()}
  assert shape_of(v_ours) == shape_of(v_theirs)
  axes = lambda v: {k: x.names for k, x in traverse_util.flatten_dict(v['params_axes']).items()}
  assert axes(v_ours) == axes(v_theirs)
  assert len(axes(v_ours)) == len(shape_of(v_ours))  # every parameter has logical axes
  # T5X's partitioner maps them to mesh axes (as t5x.infer / t5x.train do).
  mesh_axes = partitioning.PjitPartitioner(num_partitions=1).get_mesh_axes(
      train_state.InferenceState.create(v_ours))
  specs = traverse_util.flatten_dict(mesh_axes.params)
  assert specs[('token_embedder', 'embedding')] == partitioning.PartitionSpec('model', None)
  assert specs[('encoder', 'layers_0', 'mlp', 'wo', 'kernel')] == partitioning.PartitionSpec(
      'model', None)


@pytest.mark.parametrize('version', sorted(VERSIONS))
def test_teacher_forced_logits_equal_t5x_network_with_packing(version):
  ours, theirs = _modules(version)
  batch, alone = _packed_batch()
  params = ours.init(jax.random.PRNGKey(1), batch['encoder_input_tokens'],
                     batch['decoder_input_tokens'], batch['decoder_target_tokens'])['params']
  args = [batch[k] for k in FEATURES]
  for packed in (False, True):
    call_args = args if packed else args[:3]
    got = ours.apply({'params': params}, *call_args, enable_dropout=False)
    want = theirs.apply({'params': params}, *call_args, enable_dropout=False)
    assert got.dtype == jnp.float32 and got.shape == (2, 9, VOCAB)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # Packing is real: example B inside row 0 (decoder slots 3..6) == B decoded alone.
  packed = ours.apply({'params': params}, *args, enable_dropout=False)
  single = ours.apply({'params': params}, *alone, enable_dropout=False)
  np.testing.assert_allclose(packed[0, 3:7], single[0], rtol=1e-5, atol=1e-5)
  # Through T5X's model class (which passes every feature by keyword): equal losses.
  loss_ours = _t5x_model(ours).loss_fn(params, batch, dropout_rng=None)[0]
  loss_theirs = _t5x_model(theirs).loss_fn(params, batch, dropout_rng=None)[0]
  np.testing.assert_allclose(loss_ours, loss_theirs, rtol=1e-6)


@pytest.mark.parametrize('float32_attention_logits', [False, True])
@pytest.mark.parametrize('version', sorted(VERSIONS))
def test_bfloat16_teacher_forced_logits_equal_t5x_bitwise(version, float32_attention_logits):
  """Same casts as T5X in bfloat16 (LayerNorm, attention logits and bias, softmax, float32
  logits layer / tied logits, embedding), so equal bits, not just close values."""
  ours, theirs = _modules(version, dtype=jnp.bfloat16,
                          float32_attention_logits=float32_attention_logits)
  batch, _ = _packed_batch()
  params = ours.init(jax.random.PRNGKey(1), batch['encoder_input_tokens'],
                     batch['decoder_input_tokens'], batch['decoder_target_tokens'])['params']
  # As t5x.infer restores them with dtype bfloat16.
  params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
  args = [batch[k] for k in FEATURES]
  for call_args in (args[:3], args):  # unpacked, packed
    got = ours.apply({'params': params}, *call_args, enable_dropout=False)
    want = theirs.apply({'params': params}, *call_args, enable_dropout=False)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)
  # The bfloat16 computation is real: float32 activations give other logits.
  f32, _ = _modules(version, float32_attention_logits=float32_attention_logits)
  got_f32 = f32.apply({'params': params}, *args, enable_dropout=False)
  assert not np.array_equal(got, got_f32)
  np.testing.assert_allclose(got, got_f32, atol=0.1)


@pytest.mark.parametrize('tokens_per_call', [1, 3])
@pytest.mark.parametrize('version', sorted(VERSIONS))
def test_bfloat16_cached_decode_equals_t5x_teacher_forced(version, tokens_per_call):
  """encode / init_cache / extend use the teacher-forced path's casts: in bfloat16 the
  cached logits (1 or 3 tokens per call) equal T5X's teacher-forced logits bit for bit at
  these sizes. (At larger sizes XLA's CPU dot can round a bfloat16 output differently
  with the number of rows in the call, so speculative verification can differ from
  one-token calls in the last bit; compare_decodes.py --experiment=bf16_agreement
  measures it.)"""
  ours, theirs = _modules(version, dtype=jnp.bfloat16)
  rs = np.random.RandomState(2)
  enc = jnp.asarray(rs.randint(2, VOCAB, (3, 11)), jnp.int32).at[1, 7:].set(0)
  targets = jnp.asarray(rs.randint(2, VOCAB, (3, 9)), jnp.int32)
  dec = jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))
  params = ours.init(jax.random.PRNGKey(3), enc, dec, targets)['params']
  want = jit_apply(theirs, {'params': params}, enc, dec, targets, enable_dropout=False)
  encoded = jit_apply(ours, {'params': params}, enc, method='encode')
  cache = jit_apply(ours, {'params': params}, encoded, enc, 12, method='init_cache')
  got = []
  for start in range(0, dec.shape[1], tokens_per_call):
    positions = jnp.full((3,), start, jnp.int32)
    logits, cache = jit_apply(ours, {'params': params}, cache,
                              dec[:, start:start + tokens_per_call], positions, method='extend')
    got.append(logits)
  np.testing.assert_array_equal(jnp.concatenate(got, axis=1), want)


def test_t5x_decode_mode_raises_clear_error():
  ours, _ = _modules('v1.1')
  d = jnp.ones((1, 4), jnp.int32)
  params = ours.init(jax.random.PRNGKey(0), d, d, d)['params']
  with pytest.raises(NotImplementedError, match='specdec_t5x.generate'):
    ours.apply({'params': params}, d, d, d, decode=True)
  encoded = ours.apply({'params': params}, d, method='encode')
  with pytest.raises(NotImplementedError, match='init_cache / extend'):
    ours.apply({'params': params}, encoded, d, d, d, decode=True, max_decode_length=4,
               method='decode')
  with pytest.raises(NotImplementedError, match='prefill=True'):
    ours.apply({'params': params}, encoded, d, d, d, decode=True, prefill=True,
               prefill_lengths=jnp.ones((1,), jnp.int32), method='decode')


def test_encoder_segment_ids_need_decoder_segment_ids():
  ours, _ = _modules('v1.1')
  d = jnp.ones((1, 4), jnp.int32)
  params = ours.init(jax.random.PRNGKey(0), d, d, d)['params']
  with pytest.raises(ValueError, match='decoder_segment_ids'):
    ours.apply({'params': params}, d, d, d, encoder_segment_ids=d)
