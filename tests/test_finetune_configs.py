"""configs/finetune/ under real T5X: fine-tune with `python -m t5x.train`, decode the result.

Every fine-tuning file is parsed as `python -m t5x.train` parses it (T5X's gin search
paths and its own t5x/configs/runs/finetune.gin and size files) and checked against T5X's
recipe and the paper-row configs. One of them, configs/finetune/ende_xxl.gin, then runs
end to end in subprocesses of the real entry points on mocked TFDS data
(tests/mock_tfds_main.py: the real WMT builder under `tfds.testing.mock_data`, the tasks
on a tiny SentencePiece model trained here):

1. T5X's own Checkpointer writes a tiny random "pretrained" checkpoint at step 1_000_000,
   in T5X's native format as the public T5 v1.1 checkpoints are.
2. `python -m t5x.train --gin_file=configs/finetune/ende_xxl.gin` fine-tunes it for 2
   steps (TRAIN_STEPS = 1_000_002) with only the model size, vocabulary, batch size and
   lengths overridden, on 8 host devices so that the file's 8-way model parallelism runs
   as written; T5X evaluates (loss and BLEU) and writes checkpoint_1000002 (Orbax).
3. `python -m <runner> --gin_file=configs/spec_t5_small_xxl.gin` decodes the WMT task with
   the fine-tuned target and the pretrained checkpoint as the draft, overriding only the
   checkpoints, model sizes and vocabulary.
"""
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
from conftest import train_tiny_spm
import seqio

from specdec_t5x.integration import checkpoints
from specdec_t5x.algorithm import network
from specdec_t5x.integration import tasks

t5x = pytest.importorskip('t5x', reason='T5X (github.com/google-research/t5x, not on PyPI) '
                          'runs these configs; CI installs it')
# pylint: disable=g-import-not-at-top,g-bad-import-order
from t5x import adafactor
from t5x import checkpoints as t5x_checkpoints
from t5x import models as t5x_models
from t5x import partitioning as t5x_partitioning
from t5x import train_state as t5x_train_state
from t5x.examples.t5 import network as t5x_network

# pylint: enable=g-import-not-at-top,g-bad-import-order

pytestmark = pytest.mark.slow  # python -m t5x.train fine-tuning runs

REPO = pathlib.Path(__file__).resolve().parents[1]
FINETUNE = REPO / 'configs' / 'finetune'
T5X_GIN_ROOT = os.path.dirname(os.path.dirname(t5x.__file__))  # as t5x.train's default
PRETRAINED = 'gs://t5-data/pretrained_models/t5x/t5_1_1_{}/checkpoint_1000000'
TASKS = {'ende': tasks.WMT_ENDE, 'cnndm': tasks.CNN_DAILYMAIL}
# The sizes fine-tuned, (emb_dim, num_heads, layers, mlp_dim) from the project's one table
# (network.T5_1_1_SIZES), which the parse test below checks against T5X's own size files.
SIZES = {size: network.T5_1_1_SIZES[size] for size in ('small', 'base', 'large', 'xxl')}

# The tiny model: 8 heads so that 8-way model parallelism divides every sharded dimension.
TINY = dict(vocab_size=160, emb_dim=16, num_heads=8, head_dim=2, num_encoder_layers=1,
            num_decoder_layers=1, mlp_dim=32, dtype='float32')
NUM_EXAMPLES = 4  # per mocked split
PRETRAIN_STEPS = 1_000_000
FINETUNE_STEPS = 2
LENGTHS = "{'inputs': 32, 'targets': 16}"


_PARSE_ALL = textwrap.dedent('''
    """Parses each file as `python -m t5x.train` does (its gin files bind `__main__.train`)
    and prints what the tests check. A process of its own: T5X's size files say
    `network.T5Config`, which is ambiguous in a process whose gin registry also holds
    specdec_t5x.network (the other test modules parse the project's configs)."""
    import json, sys
    import gin
    import t5x
    from t5x import gin_utils
    from t5x.train import train  # pylint: disable=unused-import
    import seqio
    from specdec_t5x.integration import tasks

    def macro(name):
      value = gin.query_parameter(f'%{name}')
      if isinstance(value, gin.config.ConfigurableReference):
        return value.scoped_configurable_fn() if value.evaluate else value.scoped_configurable_fn
      return value

    root, out = sys.argv[1], {}
    for name in sys.argv[2:]:
      gin.clear_config()
      gin_utils.parse_gin_flags(['.', root], [name], ["MODEL_DIR = '/tmp/unused'"],
                                finalize_config=False)
      model = macro('MODEL')
      cfg = model.module.config
      schedule = gin.get_configurable(t5x.utils.create_learning_rate_scheduler)
      tasks.register_tasks()
      task = seqio.get_mixture_or_task(macro('MIXTURE_OR_TASK_NAME'))
      task_vocab = task.output_features['targets'].vocabulary
      out[name] = dict(
          macros={m: macro(m) for m in (
              'MIXTURE_OR_TASK_NAME', 'INITIAL_CHECKPOINT_PATH', 'TRAIN_STEPS', 'BATCH_SIZE',
              'DROPOUT_RATE', 'TASK_FEATURE_LENGTHS', 'USE_CACHED_TASKS',
              'LOSS_NORMALIZING_FACTOR')},
          schedule=gin.get_bindings(schedule),
          encoder_decoder=isinstance(model, t5x.models.EncoderDecoderModel),
          adafactor=isinstance(model.optimizer_def, t5x.adafactor.Adafactor),
          decay_rate=model.optimizer_def.hyper_params.decay_rate,
          dims=[cfg.emb_dim, cfg.num_heads, cfg.num_encoder_layers, cfg.num_decoder_layers,
                cfg.mlp_dim, cfg.head_dim, cfg.vocab_size, list(cfg.mlp_activations),
                cfg.logits_via_embedding, cfg.dropout_rate],
          vocabs_are_task_vocab=all(
              (v.sentencepiece_model_file, v.extra_ids) ==
              (task_vocab.sentencepiece_model_file, task_vocab.extra_ids)
              for v in (model.input_vocabulary, model.output_vocabulary)),
          num_partitions=gin.query_parameter(
              't5x.partitioning.PjitPartitioner.num_partitions'))
    print('RESULT ' + json.dumps(out))
    ''')


@pytest.fixture(scope='module')
def parsed():
  """{file: what it configures}, every fine-tuning file parsed as t5x.train parses it."""
  files = [f'configs/finetune/{task}_{size}.gin' for task in TASKS for size in SIZES]
  return run_child(_PARSE_ALL, T5X_GIN_ROOT, *files, PYTHONPATH=str(REPO))


@pytest.mark.parametrize('size', sorted(SIZES))
@pytest.mark.parametrize('task', sorted(TASKS))
def test_finetune_config_is_t5x_recipe_on_the_project_task(task, size, parsed):
  name = f'configs/finetune/{task}_{size}.gin'
  header = (REPO / name).read_text().split('from __gin__')[0]
  assert f'python -m t5x.train --gin_file={name} \\' in header
  assert f"--gin.MODEL_DIR=\"'/ckpt/{task}_{size}'\"" in header
  got = parsed[name]
  assert got['macros'] == {
      'MIXTURE_OR_TASK_NAME': TASKS[task], 'INITIAL_CHECKPOINT_PATH': PRETRAINED.format(size),
      'TRAIN_STEPS': PRETRAIN_STEPS + 20_000, 'BATCH_SIZE': 128, 'DROPOUT_RATE': 0.1,
      'TASK_FEATURE_LENGTHS': {'inputs': 512, 'targets': 256},  # the paper rows'
      'USE_CACHED_TASKS': False, 'LOSS_NORMALIZING_FACTOR': 2048 * 114}
  assert got['schedule'] == {'factors': 'constant', 'base_learning_rate': 1e-3,
                             'warmup_steps': 1000}
  assert got['encoder_decoder'] and got['adafactor'] and got['decay_rate'] == 0.8
  emb, heads, layers, mlp = SIZES[size]
  assert got['dims'] == [emb, heads, layers, layers, mlp, 64, 32128, ['gelu', 'linear'],
                         False, 0.1]
  # The model's vocabulary is the task's as the project registers it by default (T5X
  # refuses to train otherwise).
  assert got['vocabs_are_task_vocab']
  assert got['num_partitions'] == (8 if size == 'xxl' else 1)


def test_finetune_files_are_the_eight_models():
  # (Their include depth is checked with every other gin file in test_configs.py.)
  names = {p.name for p in FINETUNE.glob('*.gin')} - {'base.gin'}
  assert names == {f'{task}_{size}.gin' for task in TASKS for size in SIZES}


def _write_pretrained_checkpoint(model_dir, vocab_path):
  """A tiny random T5 v1.1 train state (Adafactor) at step PRETRAIN_STEPS, by T5X."""
  config = t5x_network.T5Config(mlp_activations=('gelu', 'linear'), dropout_rate=0.0,
                                logits_via_embedding=False, **TINY)
  vocab = seqio.SentencePieceVocabulary(vocab_path)
  optimizer = adafactor.Adafactor(
      decay_rate=0.8, step_offset=0,
      logical_factor_rules=adafactor.standard_logical_factor_rules())
  model = t5x_models.EncoderDecoderModel(t5x_network.Transformer(config), vocab, vocab,
                                         optimizer)
  shapes = {'encoder_input_tokens': (1, 8), 'decoder_input_tokens': (1, 8)}
  variables = model.get_initial_variables(jax.random.PRNGKey(0), shapes)
  state = t5x_train_state.FlaxOptimTrainState.create(optimizer, variables)
  state = state.replace_step(jnp.asarray(PRETRAIN_STEPS, jnp.int32))
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  t5x_checkpoints.Checkpointer(state, partitioner, str(model_dir)).save(state)
  return str(model_dir / f'checkpoint_{PRETRAIN_STEPS}')


def _run_mocked(module, args, env_root, *, devices=1):
  """Runs `python -m module args` via tests/mock_tfds_main.py; returns stdout+stderr."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(REPO), str(REPO / 'tests'), os.environ.get('PYTHONPATH', '')]),
      JAX_PLATFORMS='cpu',
      XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                f'--xla_force_host_platform_device_count={devices}'.strip())
  cmd = [sys.executable, str(REPO / 'tests' / 'mock_tfds_main.py'), env_root['vocab'],
         str(NUM_EXAMPLES), env_root['tfds'], module, *args]
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=900)
  log = proc.stdout + proc.stderr
  assert proc.returncode == 0, f'{module} failed:\n{log[-6000:]}'
  return log


def _finetune(env_root, config, initial_checkpoint, model_dir):
  """`python -m t5x.train --gin_file=<config>` at tiny size for FINETUNE_STEPS steps."""
  sizes = [f'--gin.network.T5Config.{k}={v!r}' for k, v in TINY.items()]
  return _run_mocked('t5x.train', [
      f'--gin_file={config}', f"--gin.MODEL_DIR='{model_dir}'",
      f"--gin.INITIAL_CHECKPOINT_PATH='{initial_checkpoint}'",
      f'--gin.TRAIN_STEPS={PRETRAIN_STEPS + FINETUNE_STEPS}', *sizes,
      f"--gin.VOCAB_PATH='{env_root['vocab']}'", '--gin.VOCAB_EXTRA_IDS=0',
      '--gin.BATCH_SIZE=2', f'--gin.TASK_FEATURE_LENGTHS={LENGTHS}', '--gin.EVAL_STEPS=1',
  ], env_root, devices=8)


def decode_flags(target, draft, output_dir, vocab):
  """Overrides of configs/spec_t5_small_xxl.gin: checkpoints, tiny sizes, vocabulary.

  Sizes: `t5_1_1/network.T5Config` holds what every T5 v1.1 size shares (vocab_size,
  head_dim, dtype); each size's scope (`t5_1_1/xxl/`, `t5_1_1/small/`) sets its own
  emb_dim / num_heads / layers / mlp_dim, which outrank the shared scope, so those are
  overridden per size.
  """
  flags = [f"--gin.TARGET_CHECKPOINT='{target}'", f"--gin.DRAFT_CHECKPOINT='{draft}'",
           f"--gin.INFER_OUTPUT_DIR='{output_dir}'", f"--gin.VOCAB_PATH='{vocab}'",
           '--gin.VOCAB_EXTRA_IDS=0']
  for key in ('vocab_size', 'head_dim'):
    flags.append(f'--gin.t5_1_1/network.T5Config.{key}={TINY[key]!r}')
  for scope in ('xxl', 'small'):
    for key in ('emb_dim', 'num_heads', 'num_encoder_layers', 'num_decoder_layers',
                'mlp_dim'):
      flags.append(f'--gin.t5_1_1/{scope}/network.T5Config.{key}={TINY[key]!r}')
  return flags


def _decode(runner, env_root, target, draft, output_dir):
  return _run_mocked(runner, ['--gin_file=configs/spec_t5_small_xxl.gin',
                              *decode_flags(target, draft, output_dir, env_root['vocab'])],
                     env_root)


def _lines(path):
  return [json.loads(line) for line in pathlib.Path(path).read_text('utf-8').splitlines()]


# Both runners that take the paper-row configs.
RUNNERS = ('specdec_t5x.infer', 't5x.infer')


def test_t5x_train_finetunes_and_a_paper_row_config_decodes_the_result(tmp_path):
  """One test (not a fixture shared by several) so that pytest-xdist fine-tunes once."""
  texts = [tasks.TRANSLATE_PREFIX, tasks.SUMMARIZE_PREFIX]
  for tsv in (REPO / 'tests' / 'data' / 'tasks').rglob('*.tsv'):
    texts += [t for line in tsv.read_text('utf-8').splitlines() for t in line.split('\t')]
  env_root = {'vocab': train_tiny_spm(tmp_path / 'tiny.model', texts),
              'tfds': str(tmp_path / 'tfds')}
  pretrained = _write_pretrained_checkpoint(tmp_path / 'pretrained', env_root['vocab'])
  model_dir = tmp_path / 'ende_xxl'
  _finetune(env_root, 'configs/finetune/ende_xxl.gin', pretrained, model_dir)
  final = model_dir / f'checkpoint_{PRETRAIN_STEPS + FINETUNE_STEPS}'
  _check_finetuned(model_dir, pretrained, final)
  for runner in RUNNERS:
    _check_decoded(runner, env_root, str(final), pretrained, tmp_path / f'decode-{runner}')


def _check_finetuned(model_dir, pretrained, final):
  assert final.is_dir()
  config = re.sub(r'\\\n\s*', '', (model_dir / 'config.gin').read_text())  # join lines
  for line in ("MIXTURE_OR_TASK_NAME = 'specdec_wmt_t2t_ende_v003'",
               f"INITIAL_CHECKPOINT_PATH = '{pretrained}'",
               'partitioning.PjitPartitioner.num_partitions = 8',
               "utils.create_learning_rate_scheduler.factors = 'constant'",
               'DROPOUT_RATE = 0.1', 'LOSS_NORMALIZING_FACTOR = 233472'):
    assert line in config, line
  # T5X evaluated the task's metric on the validation split at the last step.
  evals = _lines(model_dir / 'inference_eval' / f'{tasks.WMT_ENDE}-metrics.jsonl')
  assert evals[-1]['step'] == PRETRAIN_STEPS + FINETUNE_STEPS and 'bleu' in evals[-1]
  # The project's loader reads both checkpoints (T5X native, then T5X's Orbax output) into
  # the same tree, and fine-tuning changed every parameter.
  before = dict(jax.tree_util.tree_flatten_with_path(checkpoints.load_params(pretrained))[0])
  after = dict(jax.tree_util.tree_flatten_with_path(checkpoints.load_params(str(final)))[0])
  assert before.keys() == after.keys()
  assert all(after[k].shape == before[k].shape for k in before)
  assert not any(np.array_equal(np.asarray(before[k]), np.asarray(after[k])) for k in before)


def _check_decoded(runner, env_root, target, draft, out):
  _decode(runner, env_root, target, draft, out)
  rows = _lines(out / f'{tasks.WMT_ENDE}-predict_with_aux.jsonl-00000-of-00001')
  assert len(rows) == NUM_EXAMPLES
  for row in rows:
    assert row['inputs']['inputs_pretokenized'].startswith(tasks.TRANSLATE_PREFIX)
    assert isinstance(row['prediction'], str) and row['prediction']
    aux = row['aux']
    assert 1 <= aux['generated_tokens'] <= 256
    assert aux['accepted_tokens'] <= aux['drafted_tokens'] <= 7 * aux['target_calls']
  if runner == 't5x.infer':  # T5X writes predictions and aux, no metrics.json
    assert not (out / 'metrics.json').exists()
    return
  metrics = json.loads((out / 'metrics.json').read_text())
  assert (metrics['target_checkpoint'], metrics['draft_checkpoint']) == (target, draft)
  assert metrics['gamma'] == 7 and metrics['temperature'] == 0.0
  for key in ('target_config', 'draft_config'):
    assert {k: metrics[key][k] for k in TINY if k != 'dtype'} == {
        k: v for k, v in TINY.items() if k != 'dtype'}
  assert set(metrics['metrics']) == {'bleu'}
