"""The gin files under configs/: every paper-row config parses and matches the paper's
Table 2 (specdec_t5x/research/predict/paper.py, which also renders the row files).

Parsing uses the real runner's gin set-up (specdec_t5x.infer.parse_gin); nothing is run.
"""
import os
import pathlib
import re
import sys

import gin
import pytest

from specdec_t5x.integration import infer
from specdec_t5x.algorithm import network
from specdec_t5x.research.predict import paper
from specdec_t5x.integration import tasks

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'
CKPT = 'gs://t5-data/pretrained_models/t5x/t5_1_1_{}/checkpoint_1000000'
ROW_MACROS = {'DRAFT_CONFIG', 'DRAFT_CHECKPOINT', 'GAMMA', 'TEMPERATURE'}

# Leviathan et al. (2023), Table 2 (specdec_t5x.paper): file -> (task, draft, temperature, gamma).
TABLE_2 = {r.config: (r.task, r.draft, r.temperature, r.gamma) for r in paper.TABLE_2}
TASKS = {'EnDe': tasks.WMT_ENDE, 'CNNDM': tasks.CNN_DAILYMAIL}
# (emb_dim, num_heads, layers, mlp_dim, head_dim, activations, tied logits), T5X's size files / T5.
T5_1_1 = network.T5_1_1_SIZES  # checked against T5X's own size files in test_finetune_configs
T5_1_0 = {'small': (512, 8, 6, 2048, 64), 'base': (768, 12, 12, 3072, 64),
          'large': (1024, 16, 24, 4096, 64), '3B': (1024, 32, 24, 16384, 128),
          '11B': (1024, 128, 24, 65536, 128)}


def _macro(name):
  value = gin.query_parameter(f'%{name}')
  if isinstance(value, gin.config.ConfigurableReference):
    return value.scoped_configurable_fn() if value.evaluate else value.scoped_configurable_fn
  return value


@pytest.fixture(autouse=True)
def _clean_gin():
  yield
  gin.clear_config()


def test_every_table_2_row_has_a_config_and_nothing_else_is_unaccounted():
  rows = {p.name for p in CONFIGS.glob('spec_*.gin')} - {'spec_tiny_test.gin'}
  assert rows == set(TABLE_2)
  assert len(set(TABLE_2.values())) == 12


@pytest.mark.parametrize('name', sorted(TABLE_2))
def test_paper_row_config_matches_table_2(name):
  task, draft, temperature, gamma = TABLE_2[name]
  text = (CONFIGS / name).read_text()
  header = text.split('from __gin__')[0]
  assert f'python -m t5x.infer --gin_file=configs/{name}' in header
  assert '`python -m specdec_t5x.infer` takes the same flags' in header
  assert f'T5-{draft}, temperature {temperature}, gamma {gamma}' in header
  infer.parse_gin([f'configs/{name}'], ["INFER_OUTPUT_DIR = '/tmp/unused'"])
  assert _macro('MIXTURE_OR_TASK_NAME') == TASKS[task]
  assert _macro('TEMPERATURE') == float(temperature)
  assert _macro('GAMMA') == gamma
  assert _macro('BATCH_SIZE') == 1
  assert _macro('TARGET_CHECKPOINT') == CKPT.format('xxl')
  assert _macro('DRAFT_CHECKPOINT') == CKPT.format(draft)
  for macro, size in (('TARGET_CONFIG', 'xxl'), ('DRAFT_CONFIG', draft)):
    cfg = _macro(macro)
    emb, heads, layers, mlp = T5_1_1[size]
    assert (cfg.emb_dim, cfg.num_heads, cfg.num_encoder_layers, cfg.num_decoder_layers,
            cfg.mlp_dim, cfg.head_dim) == (emb, heads, layers, layers, mlp, 64)
    assert cfg.vocab_size == 32128 and cfg.mlp_activations == ('gelu', 'linear')
    assert not cfg.logits_via_embedding and cfg.dtype == 'bfloat16'
  # The runner's model settings come from these macros (not evaluated: no data or weights).
  assert gin.query_parameter('config.DecodeConfig.gamma') is not None
  lengths = _macro('TASK_FEATURE_LENGTHS')
  assert set(lengths) == {'inputs', 'targets'}


@pytest.mark.parametrize('row', paper.TABLE_2, ids=lambda r: r.config)
def test_paper_row_file_is_its_rendered_row(row):
  """One source: each row file is paper.config_text of its TABLE_2 row, a header and the
  row's macros over the task's shared base (paper.write_configs rewrites them)."""
  text = (CONFIGS / row.config).read_text()
  assert text == paper.config_text(row), (
      f'{row.config} differs from specdec_t5x/research/predict/paper.py; '
      'regenerate with: python -c '
      '"from specdec_t5x.research.predict import paper; paper.write_configs(\'configs\')"')
  body = text.split('from __gin__')[1]
  assert set(re.findall(r'^(\w+) = ', body, re.M)) == ROW_MACROS
  assert re.findall(r"^include '([^']+)'", body, re.M) == [
      'configs/models/t5_1_1_xxl.gin', f'configs/models/t5_1_1_{row.draft}.gin',
      paper.BASES[row.task]]
  assert len([line for line in body.splitlines() if line.strip()]) <= 10  # a few lines


@pytest.mark.parametrize('task', paper.TASKS)
def test_paper_base_lists_the_row_macros_and_sets_the_rest(task):
  path = CONFIGS.parent / paper.BASES[task]
  text = path.read_text()
  header = text.split('from __gin__')[0]
  for macro in ROW_MACROS | {'INFER_OUTPUT_DIR'}:
    assert macro in header, macro
  assert re.findall(r"^include '([^']+)'", text, re.M) == ['configs/runs/infer.gin']
  assert set(re.findall(r'^(\w+) = ', text, re.M)) == {
      'MIXTURE_OR_TASK_NAME', 'TASK_FEATURE_LENGTHS', 'BATCH_SIZE', 'TARGET_CONFIG',
      'TARGET_CHECKPOINT'}
  assert f"TARGET_CHECKPOINT = '{CKPT.format(paper.TARGET)}'" in text
  assert f"MIXTURE_OR_TASK_NAME = '{TASKS[task]}'" in text


@pytest.mark.parametrize('version,sizes', [('1_1', T5_1_1), ('1_0', T5_1_0)])
def test_model_size_files(version, sizes):
  for size, dims in sizes.items():
    path = CONFIGS / 'models' / f't5_{version}_{size}.gin'
    assert path.exists(), path
    includes = re.findall(r"^include '([^']+)'", path.read_text(), re.M)
    if size != 'base':
      assert includes == [f'configs/models/t5_{version}_base.gin']  # base + overrides
    gin.clear_config()
    gin.add_config_file_search_path(str(CONFIGS.parent))
    gin.parse_config_files_and_bindings([str(path)], [])
    scope = {'3B': 'xl_3B', '11B': 'xxl_11B'}.get(size, size)  # no leading digits in gin
    cfg = gin.get_configurable(f't5_{version}/{scope}/network.T5Config')()
    emb, heads, layers, mlp = dims[:4]
    assert (cfg.emb_dim, cfg.num_heads, cfg.num_encoder_layers, cfg.mlp_dim) == (
        emb, heads, layers, mlp)
    assert cfg.head_dim == (dims[4] if version == '1_0' else 64)
    assert cfg.vocab_size == 32128
    assert cfg.mlp_activations == (('relu',) if version == '1_0' else ('gelu', 'linear'))
    assert cfg.logits_via_embedding == (version == '1_0')


def test_run_file_lists_its_required_macros():
  text = (CONFIGS / 'runs' / 'infer.gin').read_text()
  header = text.split('from __gin__')[0]
  required = re.findall(r'^(\w+) = %gin\.REQUIRED', text, re.M)
  assert set(required) >= {'TASK_FEATURE_LENGTHS', 'MIXTURE_OR_TASK_NAME', 'TARGET_CHECKPOINT',
                           'DRAFT_CHECKPOINT', 'INFER_OUTPUT_DIR', 'GAMMA'}
  for macro in required:
    assert macro in header, macro


def _included(name):
  """An included gin file: the repository's, else T5X's (configs/finetune/ include T5X's
  own recipe and model files, which t5x.train finds on its search path)."""
  path = CONFIGS.parent / name
  if not path.exists() and name.startswith('t5x/'):
    t5x = pytest.importorskip('t5x', reason='configs/finetune/ include T5X gin files')
    path = pathlib.Path(t5x.__file__).parents[1] / name
  return path


def test_include_chains_are_at_most_two_deep():
  def depth(path):
    includes = re.findall(r"^include '([^']+)'", path.read_text(), re.M)
    return 1 + max((depth(_included(inc)) for inc in includes), default=0)
  for path in CONFIGS.rglob('*.gin'):
    assert depth(path) - 1 <= 2, path


def test_tiny_config_parses():
  infer.parse_gin(['configs/spec_tiny_test.gin'], ["INFER_OUTPUT_DIR = '/tmp/unused'"])
  assert _macro('MIXTURE_OR_TASK_NAME') == tasks.DEMO_ENDE
  assert _macro('TARGET_CONFIG').vocab_size >= 8000


def test_paper_row_parses_from_another_directory_with_search_paths(tmp_path, monkeypatch):
  """As T5X: gin files and includes resolve against the cwd or --gin_search_paths; the
  runner adds no path of its own."""
  monkeypatch.chdir(tmp_path)
  # gin's package-resource reader fails (TypeError) on a path whose first directory is an
  # importable namespace package, as configs/ is while the checkout is on sys.path.
  monkeypatch.setattr(sys, 'path', [p for p in sys.path
                                    if os.path.abspath(p or '.') != str(CONFIGS.parent)])
  bindings = ["INFER_OUTPUT_DIR = '/tmp/unused'"]
  with pytest.raises(FileNotFoundError, match='not found'):
    infer.parse_gin(['configs/spec_t5_small_xxl.gin'], bindings)
  infer.parse_gin(['configs/spec_t5_small_xxl.gin'], bindings, [str(CONFIGS.parent)])
  assert _macro('GAMMA') == 7 and _macro('MIXTURE_OR_TASK_NAME') == tasks.WMT_ENDE
