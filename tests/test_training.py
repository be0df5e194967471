"""Training: one step moves the params, loss falls, resume is exact, the time budget saves."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from specdec_t5x.algorithm.network import Transformer
from specdec_t5x.integration import model_dir
from specdec_t5x.integration.checkpoints import load_params
from specdec_t5x.research.train import (distill, config as train_config, data as train_data,
                                        objective as train_objective, optim as train_optim,
                                        state as train_state, loop as training)

pytestmark = pytest.mark.slow  # training runs

VOCAB = 64


def tiny_model(**kw):
  return train_config.model_config('tiny', vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8,
                               mlp_dim=32, **kw)


def _examples(rs, n, in_len=12, tgt_len=8):
  """Random 0-padded rows ending in EOS 1, like the corpus npz files."""
  inputs, targets = np.zeros((n, in_len), np.int32), np.zeros((n, tgt_len), np.int32)
  for arr in (inputs, targets):
    for row in arr:
      k = rs.randint(2, arr.shape[1] + 1)
      row[:k - 1], row[k - 1] = rs.randint(2, VOCAB, size=k - 1), 1
  return {'inputs': inputs, 'targets': targets}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp('npz')
  rs = np.random.RandomState(0)
  for task, n in (('ende', 40), ('summarize', 24)):
    np.savez(d / f'{task}_train.npz', **_examples(rs, n))
    np.savez(d / f'{task}_validation.npz', **_examples(rs, 6))
  return str(d)


def small_cfg(**kw):
  base = dict(steps=6, batch_size=4, learning_rate=1e-2, warmup_steps=2, log_every=2,
              eval_every=4, save_every=100, num_val_examples=6)
  return train_config.TrainConfig(**{**base, **kw})


def _flat(params):
  return {k: np.asarray(v) for k, v in
          jax.tree_util.tree_flatten_with_path(params)[0]}


def test_presets_and_overrides():
  cfg = train_config.model_config('demo_target', layers=4, dtype='bfloat16')
  assert (cfg.num_encoder_layers, cfg.num_decoder_layers, cfg.dtype) == (4, 4, jnp.bfloat16)
  assert cfg.vocab_size == 8192 and tuple(cfg.mlp_activations) == ('gelu', 'linear')
  with pytest.raises(ValueError, match='Unknown model'):
    train_config.model_config('nope')


def test_mixture_is_deterministic_and_proportional(data_dir):
  tasks = train_data.load_split(data_dir, 'train')
  a, b = (train_data.Mixture(tasks, 32, seed=3) for _ in range(2))
  ca = cb = np.zeros(2, np.int64)
  for step in range(40):
    (ba, ca), (bb, cb) = a.batch(step, ca), b.batch(step, cb)
    assert all(np.array_equal(ba[k], bb[k]) for k in ba)
  np.testing.assert_allclose(ca / ca.sum(), [40 / 64, 24 / 64], atol=0.05)
  np.testing.assert_array_equal(ba['decoder_input_tokens'][:, 1:],
                                ba['decoder_target_tokens'][:, :-1])
  assert not ba['decoder_input_tokens'][:, 0].any()  # BOS 0.


def test_one_step_changes_params(data_dir, tmp_path):
  p0, _ = training.train(tiny_model(), data_dir, str(tmp_path / 'a'), small_cfg(steps=0))
  p1, summary = training.train(tiny_model(), data_dir, str(tmp_path / 'b'), small_cfg(steps=1))
  assert np.isfinite(summary['val_loss'])
  f0, f1 = _flat(p0), _flat(p1)
  assert f0.keys() == f1.keys()
  assert all(not np.array_equal(f0[k], f1[k]) for k in f0)  # Every parameter moved.


@pytest.mark.parametrize('optimizer', ['adamw', 'adafactor'])
def test_loss_decreases_on_a_repeated_batch(data_dir, optimizer):
  peak = {'adamw': 1e-2, 'adafactor': 5e-2}[optimizer]  # Adafactor's is relative.
  cfg = small_cfg(optimizer=optimizer, learning_rate=peak)
  train_step, _, tx = train_objective.make_steps(tiny_model(), optimizer, cfg.weight_decay,
                                          cfg.z_loss)
  batch = train_data.Mixture(train_data.load_split(data_dir, 'train'), 4).batch(0, [0, 0])[0]
  dummy = jnp.ones((1, 4), jnp.int32)
  params = Transformer(tiny_model()).init(jax.random.PRNGKey(0), dummy, dummy)['params']
  opt_state, losses = tx.init(params), []
  for step in range(30):
    lr = np.float32(train_optim.learning_rate(step, cfg, 30))
    params, opt_state, m = train_step(params, opt_state, batch, lr, jax.random.key(0, impl='rbg'),
                                      np.int32(step))
    losses.append(float(m['ce_sum'] / m['count']))
  assert np.all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize('schedule', ['cosine', 'rsqrt'])
def test_resume_is_exact(data_dir, tmp_path, schedule):
  cfg = small_cfg(schedule=schedule, save_every=2, keep=2)
  straight, _ = training.train(tiny_model(), data_dir, str(tmp_path / 'once'), cfg)
  work = str(tmp_path / 'parts')
  if schedule == 'rsqrt':  # The schedule ignores the total: 3 steps, then 3 more.
    training.train(tiny_model(), data_dir, work, small_cfg(schedule=schedule, steps=3))
    assert train_state.latest_step(work) == 3
  else:  # Interrupted by the time budget (one step per call), then run to the end.
    for want in (1, 2):
      _, summary = training.train(tiny_model(), data_dir, work, small_cfg(max_seconds=0.0))
      assert not summary['done'] and train_state.latest_step(work) == want
  resumed, summary = training.train(tiny_model(), data_dir, work, cfg)
  assert summary['step'] == 6 and summary['done']
  f0, f1 = _flat(straight), _flat(resumed)
  for k in f0:
    np.testing.assert_array_equal(f1[k], f0[k], err_msg=str(k))  # Bitwise.
  kept = sorted(f for f in os.listdir(work) if f.startswith('checkpoint_'))
  assert kept == ['checkpoint_4', 'checkpoint_6']  # Only the latest two.


def test_time_budget_stops_and_saves(data_dir, tmp_path):
  work = str(tmp_path / 'w')
  params, summary = training.train(tiny_model(), data_dir, work,
                                   small_cfg(steps=1000, max_seconds=0.0))
  assert not summary['done'] and summary['step'] == 1
  saved = load_params(f'{work}/checkpoint_1')
  np.testing.assert_array_equal(saved['decoder']['logits_dense']['kernel'],
                                params['decoder']['logits_dense']['kernel'])
  records = [json.loads(line) for line in open(f'{work}/log.jsonl')]
  assert records[-1]['event'] == 'end' and np.isfinite(records[-1]['val_loss'])


def test_script_trains_several_models_and_exports(data_dir, tmp_path):
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'scripts'))
  import train as train_script  # pylint: disable=g-import-not-at-top
  train_script.main([
      '--model', 'tiny,demo_draft_s', '--data', data_dir, '--workdir', str(tmp_path / 'r'),
      '--steps', '2,3', '--batch_size', '4', '--final_export', str(tmp_path / 'x'),
      '--override', f'vocab_size={VOCAB},emb_dim=16,num_heads=2,head_dim=8,mlp_dim=32',
      '--no_progress'])
  for name, step in (('tiny', 2), ('demo_draft_s', 3)):
    assert train_state.latest_step(str(tmp_path / 'r' / name)) == step
    exported = load_params(str(tmp_path / 'x' / name / f'checkpoint_{step}'))
    assert exported['token_embedder']['embedding'].dtype == jnp.bfloat16
    with open(tmp_path / 'x' / name / 'config.json') as f:
      expected = train_config.model_config(name, vocab_size=VOCAB, emb_dim=16, num_heads=2,
                                       head_dim=8, mlp_dim=32)
      assert json.load(f) == model_dir.config_to_dict(expected)


def test_init_from_starts_a_fresh_run_at_the_given_params(data_dir, tmp_path):
  params, _ = training.train(tiny_model(), data_dir, str(tmp_path / 'a'), small_cfg(steps=2))
  ckpt = model_dir.save(params, str(tmp_path / 'x'), tiny_model(), 2)
  started, _ = training.train(tiny_model(), data_dir, str(tmp_path / 'b'),
                              small_cfg(steps=0, init_from=ckpt))
  f0, f1 = _flat(params), _flat(started)
  for k in f0:  # Exported in bf16: equal up to bf16 rounding.
    np.testing.assert_allclose(f1[k], f0[k], rtol=1e-2, atol=1e-2, err_msg=str(k))
  other = train_config.model_config('tiny', vocab_size=VOCAB, emb_dim=24, num_heads=2, head_dim=8,
                                mlp_dim=32)
  with pytest.raises(ValueError, match='does not match the model'):
    training.train(other, data_dir, str(tmp_path / 'c'), small_cfg(steps=0, init_from=ckpt))


def test_kd_loss_is_the_kl_to_the_teacher():
  model = Transformer(tiny_model())
  rs = np.random.RandomState(0)
  batch = train_data.make_batch(rs.randint(2, VOCAB, (2, 6)).astype(np.int32),
                              rs.randint(1, VOCAB, (2, 5)).astype(np.int32))
  params = model.init(jax.random.PRNGKey(0), batch['encoder_input_tokens'],
                      batch['decoder_input_tokens'])['params']
  own = model.apply({'params': params}, batch['encoder_input_tokens'],
                    batch['decoder_input_tokens'])
  loss = jax.jit(lambda t, w: train_objective.loss_fn(params, model, batch, 0.0, None, t, w)[0])
  ce_only = loss(own, 0.0)  # kd_weight 0: cross-entropy only.
  same = loss(own, 1.0)
  assert abs(float(same)) < 1e-5  # KL(q || q) = 0.
  half = loss(own, 0.5)
  np.testing.assert_allclose(float(half), 0.5 * float(ce_only), rtol=1e-5)
  other = own + jnp.asarray(rs.randn(*own.shape), own.dtype)
  kl = float(loss(other, 1.0))
  p = jax.nn.softmax(other, -1)
  want = jnp.sum(p * (jax.nn.log_softmax(other, -1) - jax.nn.log_softmax(own, -1)), -1).mean()
  np.testing.assert_allclose(kl, float(want), rtol=1e-4)


def test_teacher_step_trains_toward_the_teacher(data_dir):
  teacher_cfg = train_config.model_config('tiny', vocab_size=VOCAB, emb_dim=24, num_heads=2,
                                      head_dim=8, mlp_dim=32, dropout_rate=0.0)
  dummy = jnp.ones((1, 4), jnp.int32)
  teacher = Transformer(teacher_cfg).init(jax.random.PRNGKey(1), dummy, dummy)['params']
  train_step, _, tx = train_objective.make_steps(tiny_model(), 'adamw', 0.0, 0.0, teacher_cfg, 1.0)
  batch = train_data.Mixture(train_data.load_split(data_dir, 'train'), 4).batch(0, [0, 0])[0]
  params = Transformer(tiny_model()).init(jax.random.PRNGKey(0), dummy, dummy)['params']
  opt_state, losses = tx.init(params), []
  for step in range(25):
    params, opt_state, m = train_step(params, opt_state, batch, np.float32(1e-2),
                                      jax.random.key(0, impl='rbg'), np.int32(step), teacher)
    losses.append(float(m['loss']))  # Pure KL (kd_weight 1, no z-loss).
  assert losses[-1] < 0.5 * losses[0], losses


def test_distill_targets_are_the_greedy_decodes():
  from specdec_t5x.algorithm import api  # pylint: disable=g-import-not-at-top
  cfg = train_config.model_config('tiny', vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8,
                              mlp_dim=32, dropout_rate=0.0)
  model = Transformer(cfg)
  dummy = jnp.ones((1, 4), jnp.int32)
  params = model.init(jax.random.PRNGKey(2), dummy, dummy)['params']
  inputs = _examples(np.random.RandomState(3), 5)['inputs']
  got = distill.distill_targets(model, params, inputs, max_len=7, batch_size=2)
  want = np.asarray(api.generate((model, params), inputs, max_decode_length=7).tokens)
  np.testing.assert_array_equal(got, want)


def _closed_form(step, cfg, total):
  """The schedule as training.py computed it in Python floats before optax."""
  import math  # pylint: disable=g-import-not-at-top
  peak, warm = cfg.learning_rate, max(cfg.warmup_steps, 1)
  if step < warm:
    return peak * (step + 1) / warm
  if cfg.schedule == 'rsqrt':
    return peak * math.sqrt(warm / (step + 1))
  if not total:
    return peak
  frac = min(max((step - warm) / max(total - warm, 1), 0.0), 1.0)
  low = cfg.final_lr_fraction
  return peak * (low + (1 - low) * 0.5 * (1 + math.cos(math.pi * frac)))


@pytest.mark.parametrize('schedule,peak,warmup,total', [
    ('cosine', 2e-3, 300, 5000), ('cosine', 6e-4, 200, 1234), ('cosine', 1e-2, 2, 6),
    ('cosine', 5e-3, 1, 10), ('cosine', 5e-3, 0, 10), ('cosine', 3e-3, 500, 400),
    ('cosine', 2e-3, 50, None), ('rsqrt', 1e-2, 100, None), ('rsqrt', 1e-2, 1, 50)])
def test_optax_schedule_gives_the_closed_form_bitwise(schedule, peak, warmup, total):
  cfg = small_cfg(schedule=schedule, learning_rate=peak, warmup_steps=warmup)
  lr = train_optim.LearningRate(cfg, total)
  steps = range((total or 600) + 5)
  got = np.array([lr(s) for s in steps])
  want = np.array([_closed_form(s, cfg, total) for s in steps], np.float32)
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, want)
  assert train_optim.learning_rate(3, cfg, total) == float(want[3])


def test_workdir_checkpoints_are_orbax_steps_readable_as_t5x(data_dir, tmp_path):
  work = str(tmp_path / 'w')
  params, _ = training.train(tiny_model(), data_dir, work, small_cfg(steps=3, save_every=2))
  assert sorted(f for f in os.listdir(work) if f.startswith('checkpoint_')) == [
      'checkpoint_2', 'checkpoint_3']
  assert {'meta', 'state'} <= set(os.listdir(f'{work}/checkpoint_3'))
  with train_state.checkpoint_manager(work, read_only=True) as manager:
    meta = manager.restore(3, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  assert meta['total_steps'] == 3 and sum(meta['cursors']) == 3 * 4
  for k, v in _flat(load_params(work)).items():  # The parent: its highest step.
    np.testing.assert_array_equal(v, _flat(params)[k])
  with pytest.raises(ValueError, match='older version'):
    open(f'{tmp_path}/train_state_2.msgpack', 'wb').close()
    training.train(tiny_model(), data_dir, str(tmp_path), small_cfg(steps=1))
