"""The design card's command under real T5X: `python -m t5x.infer` with the paper-row gin
files, checked against stock T5X greedy decoding on checkpoints that T5X itself wrote.

configs/spec_t5_small_xxl.gin runs unchanged; the command line overrides only the
checkpoints (written here by T5X's Orbax checkpoint manager and by its legacy
msgpack+tensorstore Checkpointer), the model sizes (tiny, float32), the task (the offline
demo task over 6 committed sentences) and its vocabulary. T5X is not on PyPI: CI installs
it (.ci/run runs ../shared/install_t5x.sh); without it this module is skipped.
"""
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_child

pytest.importorskip('t5x', reason='T5X is not installed (not on PyPI; see docs/t5x.md)')
# pylint: disable=g-import-not-at-top,g-bad-import-order
from t5x import checkpoints as t5x_checkpoints
from t5x import partitioning as t5x_partitioning
from t5x import train_state as t5x_train_state
from t5x.examples.t5 import network as t5x_network
import seqio

from specdec_t5x.algorithm import network
from specdec_t5x.integration import demo, tasks
from specdec_t5x.research.predict import paper
from specdec_t5x.research.measure import t5x_reference

pytestmark = pytest.mark.slow  # python -m t5x.infer subprocesses on T5X checkpoints

REPO = pathlib.Path(__file__).resolve().parents[1]
TASK = 'demo_ende'
OUTPUT = f'{TASK}-predict_with_aux.jsonl-00000-of-00001'
LENGTHS = {'inputs': 32, 'targets': 12}
NUM_EXAMPLES = 6
SIZES = dict(emb_dim=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64)
COMMON = dict(vocab_size=8064, dtype='float32', head_dim=8)  # the demo vocabulary, padded
CONFIG = t5x_network.T5Config(**SIZES, **COMMON, mlp_activations=('gelu', 'linear'),
                              dropout_rate=0.0, logits_via_embedding=False)


def _t5x_variables(seed):
  """params and params_axes from T5X's own network (the tree ours shares)."""
  dummy = jnp.ones((1, 4), jnp.int32)
  return t5x_network.Transformer(CONFIG).init(
      jax.random.PRNGKey(seed), dummy, dummy, dummy, enable_dropout=False)


def _noisy(variables, seed, scale=0.1):
  """The draft: the target with noise, so that 0 < alpha < 1."""
  params = variables['params']
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return dict(variables, params=jax.tree_util.tree_unflatten(tree, noisy))


def _t5x_save(variables, model_dir, orbax):
  """Writes checkpoint_1 under model_dir with T5X's own checkpointer, as t5x.train does
  (a train state holding an Adafactor optimizer over the params)."""
  from t5x import adafactor  # pylint: disable=g-import-not-at-top
  state = t5x_train_state.FlaxOptimTrainState.create(adafactor.Adafactor(), variables)
  state = state.replace_step(jnp.asarray(1, jnp.int32))
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  model_dir.mkdir(parents=True)
  if orbax:
    manager = t5x_checkpoints.OrbaxCheckpointManagerInterface(
        str(model_dir), state, partitioner)
    manager.save(state)
    manager.close()  # waits for the asynchronous write
  else:
    t5x_checkpoints.Checkpointer(state, partitioner, str(model_dir)).save(state)
  path = model_dir / 'checkpoint_1'
  assert path.is_dir(), sorted(os.listdir(model_dir))
  return str(path)


def _stock_t5x_greedy(params, vocab, examples):
  """Stock T5X greedy decoding (t5x_reference: EncoderDecoderModel + temperature_sample at
  0), decoded to text as t5x.infer does."""
  enc = np.zeros((len(examples), LENGTHS['inputs']), np.int32)
  for r, ex in enumerate(examples):
    enc[r, :len(ex['inputs'])] = ex['inputs']
  ours = network.T5Config(**{f.name: getattr(CONFIG, f.name)
                             for f in dataclasses.fields(network.T5Config)})
  decodes = t5x_reference.greedy_decoder(ours, LENGTHS['targets'])(params, enc)
  return [vocab.decode_tf(np.asarray(d)[None]).numpy()[0].decode('utf-8') for d in decodes]


@pytest.fixture(scope='module')
def env(tmp_path_factory):
  root = tmp_path_factory.mktemp('t5x_infer')
  lines = pathlib.Path(tasks.demo_tsv_path('ende', 'test')).read_text('utf-8').splitlines()
  (root / 'corpus' / 'ende').mkdir(parents=True)
  (root / 'corpus' / 'ende' / 'test.tsv').write_text('\n'.join(lines[:NUM_EXAMPLES]) + '\n')
  (root / 'tiny_demo_tasks.py').write_text(  # the task override: 6 sentences
      'from specdec_t5x import tasks\n'
      f'tasks.register_tasks(data_dir={str(root / "corpus")!r})\n')
  target = _t5x_variables(0)
  draft = _noisy(target, 1)
  ckpts = {fmt: {name: _t5x_save(v, root / fmt / name, orbax=fmt == 'orbax')
                 for name, v in (('target', target), ('draft', draft))}
           for fmt in ('orbax', 'legacy')}
  tasks.register_tasks(data_dir=str(root / 'corpus'))
  try:
    examples = list(tasks.get_dataset(TASK, 'test', LENGTHS).as_numpy_iterator())
    vocab = seqio.get_mixture_or_task(TASK).output_features['targets'].vocabulary
    stock = _stock_t5x_greedy(target['params'], vocab, examples)
  finally:
    tasks.register_tasks()
  return dict(root=root, ckpts=ckpts, stock=stock, examples=examples, target=target)


def _t5x_infer(env, out, fmt, *extra, output=OUTPUT, gin_file='configs/spec_t5_small_xxl.gin'):
  """`python -m t5x.infer --gin_file=configs/spec_t5_small_xxl.gin` + overrides."""
  ckpt = env['ckpts'][fmt]
  flags = [f"--gin.TARGET_CHECKPOINT='{ckpt['target']}'",
           f"--gin.DRAFT_CHECKPOINT='{ckpt['draft']}'",
           f"--gin.INFER_OUTPUT_DIR='{out}'",
           f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
           "--gin.MIXTURE_OR_TASK_MODULE='tiny_demo_tasks'",
           f"--gin.VOCAB_PATH='{demo.vocab_path(REPO)}'", '--gin.VOCAB_EXTRA_IDS=0',
           f'--gin.TASK_FEATURE_LENGTHS={LENGTHS!r}', "--gin.CHECKPOINT_DTYPE='float32'"]
  flags += [f'--gin.t5_1_1/network.T5Config.{k}={v!r}' for k, v in COMMON.items()]
  flags += [f'--gin.t5_1_1/{size}/network.T5Config.{k}={v}'
            for size in ('xxl', 'small') for k, v in SIZES.items()]
  env_vars = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(env['root']), str(REPO)] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
  proc = subprocess.run(
      [sys.executable, '-m', 't5x.infer', f'--gin_file={gin_file}', *flags, *extra], cwd=REPO, env=env_vars, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-5000:]
  rows = [json.loads(l) for l in (out / output).read_text('utf-8').splitlines()]
  logged = re.findall(r'specdec_t5x: (\d+) examples: alpha ([\d.]+|n/a), acceptance rate '
                      r'([\d.]+|n/a), ([\d.]+) tokens per target call \((\d+) generated tokens, (\d+) target calls, gamma (\w+)\)',
                      proc.stderr)
  return rows, logged


@pytest.fixture(scope='module')
def runs(env):
  """The design card's command on T5X's Orbax checkpoints (gamma 7, the file's), and on
  its legacy checkpoints with --gin.GAMMA=3."""
  return {'orbax': _t5x_infer(env, env['root'] / 'out_orbax', 'orbax'),
          'legacy': _t5x_infer(env, env['root'] / 'out_legacy', 'legacy', '--gin.GAMMA=3')}


@pytest.mark.parametrize('fmt', ['orbax', 'legacy'])
def test_greedy_predictions_equal_stock_t5x(env, runs, fmt):
  rows, _ = runs[fmt]
  assert len(rows) == NUM_EXAMPLES
  assert [r['prediction'] for r in rows] == env['stock']
  assert any(env['stock'])  # the tiny random model says something
  for row, ex in zip(rows, env['examples']):
    assert row['inputs']['inputs_pretokenized'] == ex['inputs_pretokenized'].decode()


def test_speculative_statistics_in_t5x_output_and_log(runs):
  for fmt, gamma in (('orbax', 7), ('legacy', 3)):
    rows, logged = runs[fmt]
    aux = {k: np.array([r['aux'][k] for r in rows]) for k in rows[0]['aux']}
    assert set(aux) == {'target_calls', 'drafted_tokens', 'accepted_tokens',
                        'generated_tokens', 'beta_positions', 'beta_sum', 'scores'}
    assert np.all(aux['scores'] == 0)  # T5X's score of a greedy decode
    assert np.all(aux['accepted_tokens'] <= aux['drafted_tokens'])
    assert np.all(aux['drafted_tokens'] <= gamma * aux['target_calls'])
    assert np.all(aux['generated_tokens'] <= aux['target_calls'] + aux['accepted_tokens'])
    assert np.all(aux['generated_tokens'] >= 1)
    # The log's last line is the whole run's, from the same per-example statistics.
    examples, alpha, rate, per_call, generated, calls, logged_gamma = logged[-1]
    assert int(examples) == NUM_EXAMPLES and logged_gamma == str(gamma)
    assert int(generated) == aux['generated_tokens'].sum()
    assert int(calls) == aux['target_calls'].sum()
    assert float(rate) == pytest.approx(
        aux['accepted_tokens'].sum() / aux['drafted_tokens'].sum(), abs=1e-3)
    assert float(alpha) == pytest.approx(
        aux['beta_sum'].sum() / aux['beta_positions'].sum(), abs=1e-3)
    assert float(per_call) == pytest.approx(int(generated) / int(calls), abs=1e-3)
  assert 0 < float(runs['orbax'][1][-1][2]) < 1  # a noisy draft: some, not all, accepted
  # --gin.GAMMA=3 changed the statistics (the predictions stay the target's greedy ones).
  assert ([r['aux'] for r in runs['orbax'][0]] != [r['aux'] for r in runs['legacy'][0]])


def test_a_draft_tree_under_t5x_infer(env, runs):
  """The card command with a copy branch and the draft's siblings set from gin: T5X's
  runner decodes the target's greedy predictions, and each target call verifies up to the
  tree's 3 + 2 + 2 draft tokens."""
  rows, logged = _t5x_infer(env, env['root'] / 'out_tree', 'legacy', '--gin.GAMMA=3',
                            '--gin.config.DecodeConfig.copy_branch=2',
                            '--gin.config.DecodeConfig.draft_siblings=(1, 1)')
  assert [r['prediction'] for r in rows] == env['stock']
  aux = {k: np.array([r['aux'][k] for r in rows]) for k in rows[0]['aux']}
  assert np.all(aux['drafted_tokens'] <= 7 * aux['target_calls'])
  assert np.any(aux['drafted_tokens'] > 3 * aux['target_calls'])  # more than the chain's
  chain_calls = sum(r['aux']['target_calls'] for r in runs['legacy'][0])
  assert aux['target_calls'].sum() <= chain_calls and logged[-1][6] == '3'


def test_score_mode_is_t5x_scoring_with_the_target(env):
  """The same gin file with --gin.infer.mode='score': T5X's score_batch of each example's
  targets under the target model, as stock T5X computes it on the same parameters."""
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  rows, _ = _t5x_infer(env, env['root'] / 'out_score', 'legacy', "--gin.infer.mode='score'",
                       output=f'{TASK}-score.jsonl-00000-of-00001')
  examples = env['examples']
  assert len(rows) == len(examples) == NUM_EXAMPLES
  batch = {k: np.zeros((NUM_EXAMPLES, LENGTHS[f]), np.int32) for k, f in (
      ('encoder_input_tokens', 'inputs'), ('decoder_target_tokens', 'targets'))}
  for r, ex in enumerate(examples):
    batch['encoder_input_tokens'][r, :len(ex['inputs'])] = ex['inputs']
    batch['decoder_target_tokens'][r, :len(ex['targets'])] = ex['targets']
  targets = batch['decoder_target_tokens']
  batch.update(decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
               decoder_loss_weights=(targets > 0).astype(np.int32))
  stock = t5x_models.EncoderDecoderModel(t5x_network.Transformer(CONFIG), None, None, None)
  want = np.asarray(stock.score_batch(env['target']['params'], batch))
  got = np.array([row['score'] for row in rows])
  assert np.all(want < 0)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for row, ex in zip(rows, examples):
    assert row['inputs']['inputs_pretokenized'] == ex['inputs_pretokenized'].decode()


_BUILD_ALL = textwrap.dedent('''
    """Parses each paper-row gin file as `python -m t5x.infer` does and builds what it
    binds: the model (T5X's EncoderDecoderModel subclass), its variables' shapes through
    T5X's get_initial_variables, and T5X's partitioner's mesh axes for them."""
    import json, sys
    import gin, jax
    import jax.numpy as jnp
    from t5x import gin_utils, train_state as train_state_lib
    from t5x import models as t5x_models, partitioning as t5x_partitioning
    from t5x.infer import infer  # gin files bind `__main__.infer` (import __main__)
    out = {}
    for path in sys.argv[1:]:
      gin.clear_config()
      gin_utils.parse_gin_flags(['.'], [path], ["INFER_OUTPUT_DIR = '/tmp/unused'"])
      kw = gin.get_bindings(infer, resolve_references=True)
      model, partitioner = kw['model'], kw['partitioner']
      lengths = kw['dataset_cfg'].task_feature_lengths
      shapes = {'encoder_input_tokens': (1, lengths['inputs']),
                'decoder_input_tokens': (1, lengths['targets']),
                'decoder_target_tokens': (1, lengths['targets'])}
      variables = jax.eval_shape(lambda: model.get_initial_variables(
          jax.random.PRNGKey(0), shapes, {k: jnp.int32 for k in shapes}))
      state = train_state_lib.InferenceState.create(variables)
      axes = partitioner.get_mesh_axes(state).params
      count = sum(x.size for x in jax.tree_util.tree_leaves(variables['params']))
      out[path] = dict(
          t5x_model=isinstance(model, t5x_models.EncoderDecoderModel),
          t5x_partitioner=isinstance(partitioner, t5x_partitioning.PjitPartitioner),
          params=int(count), gamma=model.decode_config.gamma,
          temperature=model.decode_config.temperature,
          draft_emb=model.draft_config.emb_dim, task=kw['dataset_cfg'].mixture_or_task_name,
          query_axes=str(axes['decoder']['layers_0']['self_attention']['query']['kernel']))
    print('RESULT ' + json.dumps(out))
    ''')


def test_every_paper_row_parses_and_builds_under_t5x_infer():
  files = sorted(str(p.relative_to(REPO)) for p in (REPO / 'configs').glob('spec_*.gin')
                 if p.name != 'spec_tiny_test.gin')
  assert len(files) == 12
  built = run_child(_BUILD_ALL, *files, timeout=900, PYTHONPATH=str(REPO))
  rows = {row.config: row for row in paper.TABLE_2}
  assert sorted(rows) == sorted(pathlib.Path(p).name for p in built)
  for path, got in built.items():
    row = rows[pathlib.Path(path).name]
    assert got['t5x_model'] and got['t5x_partitioner']
    assert abs(got['params'] - 11.1e9) / 11.1e9 < 0.05  # T5 v1.1 XXL, built by T5X
    assert got['query_axes'] == str(jax.sharding.PartitionSpec(None, 'model'))
    assert (got['gamma'], got['temperature']) == (row.gamma, row.temperature)
    assert got['draft_emb'] == network.T5_1_1_SIZES[row.draft][0]
    assert got['task'] == {'EnDe': tasks.WMT_ENDE, 'CNNDM': tasks.CNN_DAILYMAIL}[row.task]


_HEAD_GIN = """
from __gin__ import dynamic_registration
from specdec_t5x.algorithm import feature_draft
from specdec_t5x.integration import model_dir
include 'configs/spec_t5_small_xxl.gin'
DRAFT_CONFIG = @feature_draft.FeatureDraftConfig()
feature_draft.FeatureDraftConfig:
  vocab_size = %d
  target_emb_dim = %d
  emb_dim = 16
  num_heads = 2
  head_dim = 8
  mlp_dim = 32
  draft_vocab = @model_dir.draft_vocab()
model_dir.draft_vocab.model_dir = '%s'
"""


def test_a_feature_draft_head_under_t5x_infer(env, tmp_path):
  """A run file that selects a feature-reading head as the draft (two lines over the card's
  file, plus its reduced draft vocabulary read from the head's config.json): T5X restores
  the head (a checkpoint T5X itself wrote) into its state with the target, and the
  predictions stay stock T5X's greedy ones, with the statistics as aux."""
  from specdec_t5x.algorithm import feature_draft  # pylint: disable=g-import-not-at-top
  from specdec_t5x.integration import model_dir  # pylint: disable=g-import-not-at-top
  head_cfg = feature_draft.FeatureDraftConfig(
      vocab_size=CONFIG.vocab_size, target_emb_dim=CONFIG.emb_dim, emb_dim=16, num_heads=2,
      head_dim=8, mlp_dim=32, draft_vocab=tuple(range(0, CONFIG.vocab_size, 3)))
  head = _t5x_save(feature_draft.init_variables(head_cfg, jax.random.PRNGKey(5)),
                   tmp_path / 'head', orbax=True)
  (tmp_path / 'head' / model_dir.CONFIG).write_text(
      json.dumps(model_dir.config_to_dict(head_cfg)), 'utf-8')
  assert model_dir.draft_vocab(str(tmp_path / 'head')) == head_cfg.draft_vocab
  gin_file = tmp_path / 'head.gin'
  gin_file.write_text(_HEAD_GIN % (CONFIG.vocab_size, CONFIG.emb_dim, tmp_path / 'head'))
  rows, logged = _t5x_infer(env, tmp_path / 'out', 'orbax', f"--gin.DRAFT_CHECKPOINT='{head}'",
                            '--gin.GAMMA=3', gin_file=str(gin_file))
  assert [r['prediction'] for r in rows] == env['stock']
  aux = {k: np.array([r['aux'][k] for r in rows]) for k in rows[0]['aux']}
  assert np.all(aux['drafted_tokens'] <= 3 * aux['target_calls'])
  assert int(logged[-1][0]) == NUM_EXAMPLES and logged[-1][-1] == '3'
