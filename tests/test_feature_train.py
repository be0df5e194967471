"""Training and storing a feature-reading draft head: the loss falls, an interrupted run
resumes to the same parameters, changed settings are refused, and the exported model
directory loads back as a head (config kind, parameter tree) that decodes."""
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import load_script, make_model, tiny_config
from test_training import data_dir, small_cfg  # noqa: F401  (the npz fixture)
from specdec_t5x import generate
from specdec_t5x.algorithm import feature_draft
from specdec_t5x.algorithm.network import Transformer
from specdec_t5x.integration import checkpoints, model_dir
from specdec_t5x.research.measure import evaluation, forcing
from specdec_t5x.research.train import feature_head as feature_train
from specdec_t5x.research.train.data import load_split, validation_batches

pytestmark = pytest.mark.slow  # training runs

VOCAB = 64


@pytest.fixture(scope='module')
def target_dir(tmp_path_factory):
  config = tiny_config(vocab=VOCAB, emb=32, v11=False)
  path = str(tmp_path_factory.mktemp('target'))
  model_dir.save(make_model(config, seed=3)[1], path, config, 0)
  return path


HEAD = feature_draft.FeatureDraftConfig(vocab_size=VOCAB, target_emb_dim=32, emb_dim=16,
                                        num_heads=2, head_dim=8, mlp_dim=32)


def _log(workdir):
  with open(os.path.join(workdir, 'log.jsonl'), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def _agreement(target_dir, data_dir, head_cfg, params, cfg, passes):
  """Each pass's validation agreement counted here: over every target position of the
  validation batches, how often the head's argmax (read through its draft ids) is the
  target's argmax, both teacher forced (untrimmed batches, the target's own call)."""
  target_cfg, target_params = model_dir.load(target_dir)
  target, head = Transformer(target_cfg), feature_draft.FeatureDraft(head_cfg)
  ids = np.asarray(head_cfg.draft_vocab or range(head_cfg.vocab_size))
  right, positions = np.zeros(passes), 0
  for _, batch in validation_batches(load_split(data_dir, 'validation', VOCAB),
                                     cfg.batch_size, cfg.num_val_examples):
    enc, dec_in, tgt = (batch[k] for k in ('encoder_input_tokens', 'decoder_input_tokens',
                                          'decoder_target_tokens'))
    best = np.asarray(target.apply({'params': target_params}, enc, dec_in, tgt)).argmax(-1)
    _, features, encoded = target.apply({'params': target_params}, enc, dec_in, tgt,
                                        method='features')
    before = np.pad(np.asarray(features)[:, :-1], ((0, 0), (1, 0), (0, 0)))
    outs = head.apply({'params': params}, encoded, enc, dec_in, before, tgt, passes=passes)
    for j, (logits, _) in enumerate(outs):
      right[j] += ((ids[np.asarray(logits).argmax(-1)] == best) & (tgt > 0)).sum()
    positions += int((tgt > 0).sum())
  return right / positions


def _flat(params):
  return {k: np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_loss_falls_and_resume_is_exact(target_dir, data_dir, tmp_path):  # noqa: F811
  cfg = small_cfg(steps=12, log_every=3, eval_every=6, save_every=3)
  whole, end = feature_train.train_head(target_dir, data_dir, str(tmp_path / 'a'), HEAD, cfg,
                                        passes=2)
  log = [r for r in _log(tmp_path / 'a') if 'train_loss' in r]
  assert log[-1]['train_loss'] < log[0]['train_loss']
  assert end['done'] and set(end['val']) == {'ce_1', 'agree_1', 'ce_2', 'agree_2'}
  # Stopped after its first step by the time budget, then resumed to the end.
  feature_train.train_head(target_dir, data_dir, str(tmp_path / 'b'), HEAD,
                           small_cfg(steps=12, log_every=3, eval_every=6, save_every=3,
                                     max_seconds=0), passes=2)
  resumed, end_b = feature_train.train_head(target_dir, data_dir, str(tmp_path / 'b'), HEAD,
                                            cfg, passes=2)
  assert end_b['step'] == 12
  a, b = _flat(whole), _flat(resumed)
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  with pytest.raises(ValueError, match='other settings'):
    feature_train.train_head(target_dir, data_dir, str(tmp_path / 'b'), HEAD, cfg, passes=3)


def test_exported_head_loads_and_decodes(target_dir, tmp_path):
  params = feature_draft.init_params(HEAD, jax.random.PRNGKey(0))
  feature_train.export(params, HEAD, str(tmp_path / 'head'), 7)
  config, loaded = model_dir.load(str(tmp_path / 'head'))
  assert config == HEAD
  module, _ = evaluation.load_model('head', root=str(tmp_path))
  assert isinstance(module, feature_draft.FeatureDraft)
  wrong = feature_draft.FeatureDraftConfig(**{**HEAD.__dict__, 'mlp_dim': 48})
  with pytest.raises(ValueError, match='mlp'):
    checkpoints.load_params(str(tmp_path / 'head' / 'checkpoint_7'), config=wrong)
  target = (make_model(tiny_config(vocab=VOCAB, emb=32, v11=False), seed=3))
  enc = np.array([[5, 6, 7, 1]], np.int32)
  ar = generate(target, enc, max_decode_length=8)
  spec = generate(target, enc, draft=(module, loaded), gamma=3, max_decode_length=8)
  np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens))


def test_a_reduced_vocabulary_head_starts_from_an_exported_head(target_dir, data_dir,  # noqa: F811
                                                                tmp_path):
  """commonest_ids counts the data's targets; start_from takes every weight of the exported
  head and its output columns for the new ids; training it resumes from there."""
  ids = feature_train.commonest_ids(data_dir, 20, VOCAB)
  counts = np.zeros(VOCAB, np.int64)
  for name in ('ende_train.npz', 'summarize_train.npz'):
    with np.load(os.path.join(data_dir, name)) as z:
      t = z['targets']
    counts += np.bincount(t[t > 0], minlength=VOCAB)
  assert len(ids) == 20 and list(ids) == sorted(ids)
  assert counts[list(ids)].min() >= np.delete(counts, list(ids)).max()
  with pytest.raises(ValueError, match='does not fit'):
    feature_train.commonest_ids(data_dir, VOCAB + 1, VOCAB)
  full = feature_draft.init_params(HEAD, jax.random.PRNGKey(4))
  feature_train.export(full, HEAD, str(tmp_path / 'full'), 1)
  small_head = feature_draft.FeatureDraftConfig(**{**HEAD.__dict__, 'draft_vocab': ids})
  start = feature_train.start_from(feature_draft.init_params(small_head, jax.random.PRNGKey(0)),
                                   small_head, str(tmp_path / 'full'))
  _, stored = model_dir.load(str(tmp_path / 'full'))
  np.testing.assert_array_equal(start['logits_dense']['kernel'],
                                np.asarray(stored['logits_dense']['kernel'])[:, list(ids)])
  np.testing.assert_array_equal(start['feature_in']['kernel'], stored['feature_in']['kernel'])
  feature_train.export(start, small_head, str(tmp_path / 'small'), 1)
  with pytest.raises(ValueError, match='lacks'):  # the reduced head cannot give back all ids
    feature_train.start_from(full, HEAD, str(tmp_path / 'small'))
  other = feature_draft.FeatureDraftConfig(**{**HEAD.__dict__, 'emb_dim': 24})
  with pytest.raises(ValueError, match='not a head of these sizes'):
    feature_train.start_from(feature_draft.init_params(other, jax.random.PRNGKey(0)), other,
                             str(tmp_path / 'full'))
  cfg = small_cfg(steps=6, log_every=3, eval_every=6, save_every=3)
  tuned, end = feature_train.train_head(target_dir, data_dir, str(tmp_path / 'ft'), small_head,
                                        cfg, passes=2, init_from=str(tmp_path / 'full'))
  agree = _agreement(target_dir, data_dir, small_head, tuned, cfg, passes=2)
  assert end['done'] and 0 < max(agree) < 1  # the comparison can tell a wrong count
  for j, value in enumerate(agree, 1):  # logged to 4 places
    assert end['val'][f'agree_{j}'] == pytest.approx(value, abs=5e-5), j
  with pytest.raises(ValueError, match='other settings'):
    feature_train.train_head(target_dir, data_dir, str(tmp_path / 'ft'), small_head, cfg,
                             passes=2)


def test_the_script_fine_tunes_a_head_keeping_its_draft_vocabulary(target_dir, data_dir,  # noqa: F811
                                                                  tmp_path):
  """--draft_vocab_from keeps an exported head's ids (fine-tuning on other data, whose
  commonest ids differ); with --draft_vocab_size as well it is refused."""
  script = load_script('train')
  ids = (2, 3, 5, 7, 11, 13, 40)
  source = feature_draft.FeatureDraftConfig(vocab_size=VOCAB, target_emb_dim=32, emb_dim=16,
                                            num_heads=2, head_dim=64, mlp_dim=32,
                                            draft_vocab=ids)
  feature_train.export(feature_draft.init_params(source, jax.random.PRNGKey(2)), source,
                       str(tmp_path / 'source'), 1)
  flags = ['--head', '--target', target_dir, '--data', data_dir, '--steps', '2',
           '--batch_size', '4', '--emb_dim', '16', '--mlp_dim', '32', '--num_val_examples', '4',
           '--no_progress', '--draft_vocab_from', str(tmp_path / 'source')]
  end = script.main(flags + ['--workdir', str(tmp_path / 'w'), '--init_from',
                             str(tmp_path / 'source'), '--export', str(tmp_path / 'out')])
  assert end['done'] and end['exported']
  assert model_dir.draft_vocab(str(tmp_path / 'out')) == ids
  assert feature_train.commonest_ids(data_dir, len(ids), VOCAB) != ids  # not the data's own
  with pytest.raises(SystemExit):
    script.main(flags + ['--workdir', str(tmp_path / 'x'), '--draft_vocab_size', '7'])


def test_a_head_reading_more_layers_starts_from_one_reading_the_final_features(  # noqa: F811
    target_dir, data_dir, tmp_path):
  """start_from gives the tapped layers zero input rows and zero predicted-feature columns,
  so the fused head computes what the exported one did; the script trains such a head."""
  feature_train.export(feature_draft.init_params(HEAD, jax.random.PRNGKey(5)), HEAD,
                       str(tmp_path / 'plain'), 1)
  fused = dataclasses.replace(HEAD, feature_layers=(0, 1))
  start = feature_train.start_from(feature_draft.init_params(fused, jax.random.PRNGKey(0)),
                                   fused, str(tmp_path / 'plain'))
  _, plain = model_dir.load(str(tmp_path / 'plain'))
  target_cfg, target_params = model_dir.load(target_dir)
  target = Transformer(target_cfg)
  enc = np.random.RandomState(0).randint(2, VOCAB, (3, 6)).astype(np.int32)
  dec_in = forcing.shift_right(np.random.RandomState(1).randint(2, VOCAB, (3, 5)))
  outs = []
  for cfg, params in ((HEAD, plain), (fused, start)):
    _, _, before, encoded = forcing.features(target, target_params, enc, dec_in, None,
                                             cfg.feature_layers)
    outs.append(feature_draft.FeatureDraft(cfg).apply({'params': params}, encoded, enc, dec_in,
                                                      before, passes=2))
  for (logits, predicted), (got, got_predicted) in zip(*outs):
    np.testing.assert_allclose(got, logits, atol=1e-5)
    np.testing.assert_allclose(got_predicted[..., :32], predicted, atol=1e-5)
    assert got_predicted.shape[-1] == 96 and not np.any(got_predicted[..., 32:])
  feature_train.export(start, fused, str(tmp_path / 'fused'), 1)
  other = dataclasses.replace(HEAD, feature_layers=(1,))  # not the layers it was trained on
  with pytest.raises(ValueError, match='not a head of these sizes'):
    feature_train.start_from(feature_draft.init_params(other, jax.random.PRNGKey(0)), other,
                             str(tmp_path / 'fused'))
  flags = ['--head', '--target', target_dir, '--data', data_dir, '--steps', '2',
           '--batch_size', '4', '--emb_dim', '16', '--mlp_dim', '32', '--num_val_examples', '4',
           '--no_progress']
  script = load_script('train')
  end = script.main(flags + ['--workdir', str(tmp_path / 'w'), '--feature_layers', '0,1',
                             '--export', str(tmp_path / 'out')])
  assert end['done'] and model_dir.load_config(str(tmp_path / 'out')).feature_layers == (0, 1)
  with pytest.raises(SystemExit):
    script.main(flags + ['--workdir', str(tmp_path / 'x'), '--feature_layers', '0,a'])
  with pytest.raises(ValueError, match='2 decoder layers'):
    script.main(flags + ['--workdir', str(tmp_path / 'y'), '--feature_layers', '2'])


def test_a_deeper_head_starts_from_a_shallower_one_with_identity_layers(target_dir,
                                                                      tmp_path):
  """start_from appends the new decoder layers with their residual-writing kernels zeroed:
  the two-layer head computes what the exported one-layer head did, and every new kernel
  is trainable (the zeroed ones get gradients, the others are the fresh init's)."""
  feature_train.export(feature_draft.init_params(HEAD, jax.random.PRNGKey(5)), HEAD,
                       str(tmp_path / 'one'), 1)
  deep = dataclasses.replace(HEAD, num_layers=2)
  fresh = feature_draft.init_params(deep, jax.random.PRNGKey(0))
  start = feature_train.start_from(fresh, deep, str(tmp_path / 'one'))
  _, one = model_dir.load(str(tmp_path / 'one'))
  target_cfg, target_params = model_dir.load(target_dir)
  enc = np.random.RandomState(0).randint(2, VOCAB, (3, 6)).astype(np.int32)
  dec_in = forcing.shift_right(np.random.RandomState(1).randint(2, VOCAB, (3, 5)))
  _, _, before, encoded = forcing.features(Transformer(target_cfg), target_params, enc,
                                           dec_in)
  run = lambda cfg, params: feature_draft.FeatureDraft(cfg).apply(
      {'params': params}, encoded, enc, dec_in, before, passes=2)
  for (logits, predicted), (got, got_predicted) in zip(run(HEAD, one), run(deep, start)):
    np.testing.assert_allclose(got, logits, atol=1e-5)
    np.testing.assert_allclose(got_predicted, predicted, atol=1e-5)
  grads = jax.grad(lambda p: sum(jnp.sum(l ** 2) for l, _ in run(deep, p)))(start)
  new = start['layers_1']
  for block, name in (('self_attention', 'out'), ('encoder_decoder_attention', 'out'),
                      ('mlp', 'wo')):
    assert not np.any(new[block][name]['kernel'])
    assert np.any(grads['layers_1'][block][name]['kernel'])
  np.testing.assert_array_equal(new['mlp']['wi_0']['kernel'],
                                fresh['layers_1']['mlp']['wi_0']['kernel'])
  feature_train.export(start, deep, str(tmp_path / 'two'), 1)
  with pytest.raises(ValueError, match='not a head of these sizes'):  # layers are not dropped
    feature_train.start_from(feature_draft.init_params(HEAD, jax.random.PRNGKey(0)), HEAD,
                             str(tmp_path / 'two'))


def test_distill_data_takes_rows_per_task(target_dir, data_dir, tmp_path):  # noqa: F811
  """build_data.py distill's --max_rows: one count for every file, or one per task."""
  script = load_script('build_data')
  out = tmp_path / 'distilled'
  distill = ['distill', '--target', target_dir, '--data', data_dir, '--out', str(out)]
  summaries = script.main(distill + ['--splits', 'train', '--max_rows', 'ende=3',
                                     '--no_progress'])
  rows = {os.path.basename(s['file']): s['rows'] for s in summaries}
  with np.load(os.path.join(data_dir, 'summarize_train.npz')) as z:
    assert rows == {'ende_train.npz': 3, 'summarize_train.npz': len(z['inputs'])}
  with np.load(out / 'ende_train.npz') as z:
    assert z['inputs'].shape[0] == 3 and z['targets'].shape[0] == 3
  summaries = script.main(distill + ['--splits', 'train', '--max_rows', '2', '--no_progress'])
  assert [s['rows'] for s in summaries] == [2, 2]
