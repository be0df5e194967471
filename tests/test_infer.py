"""End-to-end tests of `python -m specdec_t5x.infer` with the paper's EnDe config.

configs/spec_t5_small_xxl.gin runs unchanged except for command-line overrides: tiny
target/draft sizes, checkpoints saved here from random weights, a tiny SentencePiece
model trained here, and the real TFDS WMT builder under `tfds.testing.mock_data` fed
with the fixture sentence pairs. `infer.main` is called in-process (same flags as the
command line) so that one jit compilation serves all runs.
"""
import json
import os
import pathlib
import subprocess
import sys

import gin
import jax
import jax.numpy as jnp
import pytest
from conftest import train_tiny_spm
import tensorflow as tf
import tensorflow_datasets as tfds

from specdec_t5x.integration import checkpoints, infer, models, tasks
from specdec_t5x.algorithm import stats
from specdec_t5x.algorithm.network import T5Config, Transformer

pytestmark = pytest.mark.slow  # the runner end to end

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = pathlib.Path(__file__).parent / 'data' / 'tasks' / 'corpus' / 'ende'
VOCAB = 160
TARGET = dict(emb_dim=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64)
DRAFT = TARGET  # The draft is the target with noisy weights: 0 < alpha < 1.
COMMON = dict(vocab_size=VOCAB, dtype='float32', head_dim=8, mlp_activations=('gelu', 'linear'),
              dropout_rate=0.0, logits_via_embedding=False)
OUTPUT = 'specdec_wmt_t2t_ende_v003-predict_with_aux.jsonl-00000-of-00001'
NUM_EXAMPLES = 8  # 4 batches of 2, 2 chunks of 2 batches


def _pairs():
  pairs = []
  for path in sorted(FIXTURES.glob('*.tsv')):
    pairs += [tuple(l.split('\t')) for l in path.read_text('utf-8').splitlines() if l.strip()]
  return pairs[:NUM_EXAMPLES]


def _train_vocab(path, texts):
  return train_tiny_spm(path, texts)


def _checkpoints(root):
  module = Transformer(T5Config(**COMMON, **TARGET))
  params = models.init_params(module, jax.random.PRNGKey(0))
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  noisy = [x + 0.1 * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  draft = jax.tree_util.tree_unflatten(tree, noisy)
  return (checkpoints.save_params(params, str(root / 'target' / 'checkpoint_1'), step=1),
          checkpoints.save_params(draft, str(root / 'draft' / 'checkpoint_1'), step=1))


@pytest.fixture(autouse=True)
def _unlock_gin():
  yield
  gin.clear_config()  # main() leaves the config locked, as T5X does.


@pytest.fixture(scope='module')
def env(tmp_path_factory):
  """Vocabulary, checkpoints and mocked WMT data shared by the tests of this module."""
  root = tmp_path_factory.mktemp('infer')
  pairs = _pairs()
  assert len(pairs) == NUM_EXAMPLES
  texts = [tasks.TRANSLATE_PREFIX] + [t for pair in pairs for t in pair]
  vocab = _train_vocab(root / 'tiny.model', texts)
  target, draft = _checkpoints(root)

  def as_dataset(self, split, **unused):
    del self, split
    return tf.data.Dataset.from_tensor_slices(
        {'en': [en for en, _ in pairs], 'de': [de for _, de in pairs]})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    yield dict(root=root, vocab=vocab, target=target, draft=draft)
  tasks.register_tasks()  # Undo task_vocab_path's re-registration.


def _flags(env, out, *extra, output_dir=True):
  flags = ['--gin_file=configs/spec_t5_small_xxl.gin',
           f"--gin.TARGET_CHECKPOINT='{env['target']}'",
           f"--gin.DRAFT_CHECKPOINT='{env['draft']}'",
           f"--gin.VOCAB_PATH='{env['vocab']}'", '--gin.VOCAB_EXTRA_IDS=0',
           '--gin.infer.task_vocab_path=%VOCAB_PATH',
           "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 10}",
           "--gin.CHECKPOINT_DTYPE='float32'", '--gin.BATCH_SIZE=2',
           '--gin.infer.checkpoint_period=2']
  if output_dir:
    flags.append(f"--gin.INFER_OUTPUT_DIR='{out}'")
  for key, value in COMMON.items():
    if key in ('vocab_size', 'dtype', 'head_dim'):
      flags.append(f'--gin.t5_1_1/network.T5Config.{key}={value!r}')
  for scope, dims in (('xxl', TARGET), ('small', DRAFT)):
    flags += [f'--gin.t5_1_1/{scope}/network.T5Config.{k}={v}' for k, v in dims.items()]
  return flags + list(extra)


def _lines(path):
  return [json.loads(line) for line in pathlib.Path(path).read_text('utf-8').splitlines()]


@pytest.fixture(scope='module')
def full_run(env):
  out = env['root'] / 'full'
  metrics = infer.main(_flags(env, out))
  return out, metrics


def test_end_to_end_outputs(env, full_run):
  out, metrics = full_run
  assert sorted(os.listdir(out)) == ['config.gin', 'metrics.json', OUTPUT]  # tmp dir gone
  rows = _lines(out / OUTPUT)
  pairs = _pairs()
  assert len(rows) == NUM_EXAMPLES
  for row, (en, de) in zip(rows, pairs):
    assert row['inputs'] == {'inputs_pretokenized': tasks.TRANSLATE_PREFIX + en,
                             'targets_pretokenized': de}
    assert isinstance(row['prediction'], str)
    aux = row['aux']
    assert set(aux) == set(stats.PER_EXAMPLE_STATS)
    assert 1 <= aux['generated_tokens'] <= 10
    assert aux['accepted_tokens'] <= aux['drafted_tokens'] <= 7 * aux['target_calls']
  assert json.loads((out / 'metrics.json').read_text()) == metrics
  assert set(metrics['metrics']) == {'bleu'}
  for key in stats.PER_EXAMPLE_STATS:
    assert metrics[key] == sum(r['aux'][key] for r in rows)
  assert metrics['acceptance_rate'] == metrics['accepted_tokens'] / metrics['drafted_tokens']
  assert metrics['alpha'] == metrics['beta_sum'] / metrics['beta_positions']
  assert metrics['mean_tokens_per_target_call'] == (
      metrics['generated_tokens'] / metrics['target_calls'])
  hist = metrics['accepted_length_histogram']
  assert len(hist) == 8 and sum(hist) == metrics['target_calls']
  assert sum(k * n for k, n in enumerate(hist)) == metrics['accepted_tokens']
  assert metrics['wall_seconds'] > 0 and metrics['tokens_per_second'] > 0
  assert (metrics['gamma'], metrics['temperature'], metrics['lossy']) == (7, 0.0, False)
  assert 0 < metrics['acceptance_rate'] < 1 and 0 < metrics['alpha'] < 1
  assert metrics['target_config']['emb_dim'] == metrics['draft_config']['emb_dim'] == 32
  assert metrics['target_checkpoint'] == env['target']
  assert metrics['draft_checkpoint'] == env['draft']
  assert metrics['device_kind'] and metrics['num_examples'] == NUM_EXAMPLES
  assert 'git_revision' in metrics and metrics['resumed_chunks'] == 0
  assert metrics['inputs_at_length_limit'] == 0
  assert metrics['accepted_by_source'] == {  # a chain: every accepted token the draft's
      'draft_chain': metrics['accepted_tokens'], 'copy_branch': 0, 'draft_siblings': 0}
  config = (out / 'config.gin').read_text()
  assert 'GAMMA = 7' in config and "MIXTURE_OR_TASK_NAME = 'specdec_wmt_t2t_ende_v003'" in config


def test_interrupted_run_resumes_to_the_identical_file(env, full_run):
  out = env['root'] / 'resumed'
  with pytest.raises(RuntimeError, match='Simulated preemption after 3 batches'):
    infer.main(_flags(env, out, '--gin.infer.preempt_after_batches=3'))
  tmp = out / f'tmp-{tasks.WMT_ENDE}-00000-of-00001'
  progress = json.loads((tmp / 'progress.json').read_text())
  assert list(progress['chunks']) == ['0'] and progress['chunks']['0']['examples'] == 4
  assert not (out / OUTPUT).exists()
  with pytest.raises(ValueError, match=r"other settings \(changed: \['gamma'\]\)"):
    infer.main(_flags(env, out, '--gin.GAMMA=5'))
  metrics = infer.main(_flags(env, out))
  assert (out / OUTPUT).read_bytes() == (full_run[0] / OUTPUT).read_bytes()
  assert metrics['resumed_chunks'] == 1
  for key in stats.PER_EXAMPLE_STATS + ('accepted_length_histogram', 'metrics'):
    assert metrics[key] == full_run[1][key], key
  assert sorted(os.listdir(out)) == ['config.gin', 'metrics.json', OUTPUT]


def test_a_draft_tree_decodes_as_the_chain_and_says_what_it_accepted(env, full_run):
  """A copy branch and the draft's siblings set from gin: the chain run's predictions (both
  greedy), both settings in metrics.json and the run's identity, and the accepted tokens
  split by what proposed them."""
  out = env['root'] / 'tree'
  metrics = infer.main(_flags(env, out, '--gin.config.DecodeConfig.copy_branch=2',
                              '--gin.config.DecodeConfig.draft_siblings=(2, 1)'))
  tree, chain = _lines(out / OUTPUT), _lines(full_run[0] / OUTPUT)
  assert [r['prediction'] for r in tree] == [r['prediction'] for r in chain]
  assert (metrics['copy_branch'], metrics['draft_siblings']) == (2, [2, 1])
  by_source = metrics['accepted_by_source']
  assert sum(by_source.values()) == metrics['accepted_tokens'] and by_source['draft_chain']
  assert metrics['target_calls'] <= full_run[1]['target_calls']
  with pytest.raises(ValueError, match=r"other settings \(changed: \['draft_siblings'\]\)"):
    infer.main(_flags(env, out, '--gin.config.DecodeConfig.copy_branch=2'))


def test_the_drafts_dynamic_tree_decodes_as_the_chain(env, full_run):
  """draft_tree_width set from gin: the chain run's greedy predictions, the setting in
  metrics.json, every accepted token the draft's, more candidates a call than the chain's
  and at most 2 * gamma."""
  out = env['root'] / 'dynamic_tree'
  metrics = infer.main(_flags(env, out, '--gin.config.DecodeConfig.draft_tree_width=2'))
  tree, chain = _lines(out / OUTPUT), _lines(full_run[0] / OUTPUT)
  assert [r['prediction'] for r in tree] == [r['prediction'] for r in chain]
  assert metrics['draft_tree_width'] == 2
  assert metrics['accepted_by_source']['draft_chain'] == metrics['accepted_tokens']
  per_call = lambda m: m['drafted_tokens'] / m['target_calls']
  assert per_call(full_run[1]) < per_call(metrics) <= 2 * metrics['gamma']  # W nodes a level


def test_autoregressive_baseline_equals_greedy_speculative(env, full_run):
  out = env['root'] / 'ar'
  metrics = infer.main(_flags(env, out, '--gin.DRAFT_CONFIG=None',
                              '--gin.DRAFT_CHECKPOINT=None'))
  ar, spec = _lines(out / OUTPUT), _lines(full_run[0] / OUTPUT)
  assert [r['prediction'] for r in ar] == [r['prediction'] for r in spec]
  assert metrics['drafted_tokens'] == 0 and metrics['acceptance_rate'] is None and metrics['alpha'] is None
  assert metrics['mean_tokens_per_target_call'] == 1.0
  assert metrics['draft_config'] is None and metrics['gamma'] is None


@pytest.mark.parametrize('extra,error,pattern', [
    (["--gin.TARGET_CHECKPOINT='/nonexistent/checkpoint_9'"], FileNotFoundError,
     r"Target checkpoint not found: '/nonexistent/checkpoint_9'.*TARGET_CHECKPOINT"),
    (["--gin.DRAFT_CHECKPOINT='/nonexistent/draft_9'"], FileNotFoundError,
     r"Draft checkpoint not found: '/nonexistent/draft_9'.*DRAFT_CHECKPOINT"),
    (['--gin.t5_1_1/small/network.T5Config.vocab_size=192'], ValueError,
     r'vocabulary sizes differ: target vocab_size=160, draft vocab_size=192'),
    (['--gin.DRAFT_VOCABULARY=@draft/seqio.SentencePieceVocabulary()',
      f"--gin.draft/seqio.SentencePieceVocabulary.sentencepiece_model_file="
      f"'{REPO / 'data' / 'vocab' / 'demo_spm.model'}'"], ValueError,
     r'Draft and target use different SentencePiece models'),
    (['--gin.VOCAB_EXTRA_IDS=5'], ValueError, r'Model and task vocabularies differ'),
    (["--gin.MIXTURE_OR_TASK_NAME='wmt_t2t_ende_v003'"], ValueError,
     r"Unknown task 'wmt_t2t_ende_v003'.*'specdec_wmt_t2t_ende_v003'"),
    (["--gin.TASK_FEATURE_LENGTHS={'inputs': 6, 'targets': 10}",
      '--gin.infer.allow_truncation=False'], ValueError,
     r'has \d+ input tokens.*allow_truncation'),
], ids=['target_checkpoint', 'draft_checkpoint', 'vocab_size', 'sentencepiece',
        'model_task_vocab', 'task', 'too_long'])
def test_clear_errors(env, extra, error, pattern):
  out = env['root'] / 'errors'
  with pytest.raises(error, match=pattern):
    infer.main(_flags(env, out, *extra))
  assert not (out / OUTPUT).exists()


def test_long_inputs_are_cut_as_t5x_does_and_counted(env):
  out = env['root'] / 'cut'
  metrics = infer.main(_flags(env, out, "--gin.TASK_FEATURE_LENGTHS={'inputs': 6, 'targets': 4}",
                              '--gin.GAMMA=3'))  # gamma <= the decode length
  assert metrics['inputs_at_length_limit'] == metrics['num_examples'] == NUM_EXAMPLES
  assert len(_lines(out / OUTPUT)) == NUM_EXAMPLES


def test_unset_macro_is_named(env):
  with pytest.raises(ValueError, match=r'Gin macro INFER_OUTPUT_DIR is required but not set: '
                                       r'pass --gin.INFER_OUTPUT_DIR='):
    infer.main(_flags(env, None, output_dir=False))


def test_command_line_names_an_unset_macro():
  proc = subprocess.run([sys.executable, '-m', 'specdec_t5x.infer',
                         '--gin_file=configs/spec_tiny_test.gin'], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert 'Gin macro INFER_OUTPUT_DIR is required but not set' in proc.stderr


def test_tiny_config_runs(tmp_path):
  tasks.register_tasks()  # The demo task with its committed vocabulary.
  metrics = infer.main(['--gin_file=configs/spec_tiny_test.gin',
                        f"--gin.INFER_OUTPUT_DIR='{tmp_path}'"])
  assert metrics['num_examples'] == 8 and metrics['task'] == tasks.DEMO_ENDE
  assert len(_lines(tmp_path / 'demo_ende-predict_with_aux.jsonl-00000-of-00001')) == 8
  assert metrics['target_checkpoint'] is None and metrics['fallback_init_rng'] == 0


def test_compare_baseline_takes_turns_going_first_chunk_by_chunk(tmp_path, monkeypatch):
  """Each chunk's batches run by one decode and then by the other, the first one in turn
  (speculative first in even chunks, the baseline in odd ones), never batch by batch."""
  tasks.register_tasks()
  order = []
  run = infer.BatchRunner.run

  def recording(self, index, rows, info):
    order.append(('spec' if self.model.is_speculative else 'base', index))
    return run(self, index, rows, info)
  monkeypatch.setattr(infer.BatchRunner, 'run', recording)
  infer.main(['--gin_file=configs/spec_tiny_test.gin', f"--gin.INFER_OUTPUT_DIR='{tmp_path}'",
              '--gin.infer.compare_baseline=True', '--gin.infer.num_examples=16',
              '--gin.infer.checkpoint_period=2'])  # 4 batches of 4: 2 chunks of 2 batches
  assert order == [('spec', 0), ('spec', 1), ('base', 0), ('base', 1),
                   ('base', 2), ('base', 3), ('spec', 2), ('spec', 3)]


@pytest.mark.parametrize('tree', [[], ['--gin.config.DecodeConfig.draft_tree_width=2']],
                         ids=['chain', 'dynamic_tree'])
def test_compare_baseline_interleaves_ar_and_matches_greedy(tmp_path, tree):
  """With a draft tree too: the baseline decodes the target alone, without the tree."""
  tasks.register_tasks()
  metrics = infer.main(['--gin_file=configs/spec_tiny_test.gin',
                        f"--gin.INFER_OUTPUT_DIR='{tmp_path}'",
                        '--gin.infer.compare_baseline=True'] + tree)
  assert metrics.get('draft_tree_width', 0) == (2 if tree else 0)
  spec = _lines(tmp_path / 'demo_ende-predict_with_aux.jsonl-00000-of-00001')
  base = _lines(tmp_path / 'demo_ende-predict_with_aux-baseline.jsonl-00000-of-00001')
  assert [r['prediction'] for r in spec] == [r['prediction'] for r in base]  # greedy: exact
  b = metrics['baseline']
  assert b['drafted_tokens'] == 0 and b['target_calls'] == b['generated_tokens']
  assert b['warm_seconds'] > 0 and metrics['walltime_speedup'] > 0
  assert not any(p.name.startswith('tmp-') for p in tmp_path.iterdir())
