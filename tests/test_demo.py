"""The demo's locations (specdec_t5x/integration/demo.py): resolved under a root taken from
the argument, $SPECDEC_DEMO_ROOT or the current directory, never from the library's own
location; a missing file is named. The demo tasks follow the same root."""
import os
import pathlib
import subprocess
import sys

import pytest

from specdec_t5x.integration import demo, tasks

pytestmark = pytest.mark.slow  # the demo command end to end

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / 'specdec_t5x'


def test_root_is_the_argument_else_the_environment_else_the_cwd(tmp_path, monkeypatch):
  monkeypatch.delenv(demo.ROOT_ENV, raising=False)
  monkeypatch.chdir(tmp_path)
  assert demo.root() == str(tmp_path)
  monkeypatch.setenv(demo.ROOT_ENV, str(REPO))
  assert demo.root() == str(REPO)
  assert demo.root(tmp_path / 'x') == str(tmp_path / 'x')
  monkeypatch.setenv(demo.ROOT_ENV, 'relative')  # made absolute against the cwd, now
  assert demo.root() == str(tmp_path / 'relative')


def test_layout_under_the_root_matches_the_repository():
  assert demo.vocab_path(REPO) == str(REPO / 'data' / 'vocab' / 'demo_spm.model')
  assert demo.corpus_dir(REPO) == str(REPO / 'data' / 'corpus')
  assert demo.sample_dir(REPO) == str(REPO / 'data' / 'demo')
  assert demo.checkpoints_dir(REPO) == str(REPO / 'checkpoints' / 'demo')
  for path in (demo.vocab_path(REPO), os.path.join(demo.sample_dir(REPO), 'ende_test.tsv'),
               os.path.join(demo.sample_dir(REPO), 'summarize_test.tsv')):
    assert demo.require(path) == path
  assert demo.checkpoint('demo_target', REPO) == str(REPO / 'checkpoints/demo/demo_target')


def test_missing_file_is_named_with_the_way_to_fix_it(tmp_path):
  with pytest.raises(FileNotFoundError, match=(
      rf"demo checkpoint 'demo_target' {tmp_path}/checkpoints/demo/demo_target does not "
      rf'exist.*{demo.ROOT_ENV}')):
    demo.checkpoint('demo_target', tmp_path)
  with pytest.raises(FileNotFoundError, match=r'The demo vocabulary .*demo_spm.model'):
    demo.require(demo.vocab_path(tmp_path), 'demo vocabulary')


def test_demo_tasks_follow_the_root_and_name_what_is_missing(tmp_path):
  try:
    tasks.register_tasks(demo_root=str(tmp_path))  # an empty root: registering reads nothing
    task = tasks.seqio.get_mixture_or_task(tasks.DEMO_ENDE)
    vocab = task.output_features['targets'].vocabulary
    assert vocab.sentencepiece_model_file == demo.vocab_path(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf'{tmp_path}/data/vocab/demo_spm.model'):
      vocab.encode('a house')
    with pytest.raises(FileNotFoundError, match=rf'{tmp_path}/data/demo/ende_test.tsv'):
      tasks.demo_tsv_path('ende', 'test', tasks.demo.corpus_dir(tmp_path),
                          tasks.demo.sample_dir(tmp_path))
    with pytest.raises(FileNotFoundError, match=rf'{tmp_path}/data/corpus/ende/test.tsv'):
      tasks.get_dataset(tasks.DEMO_ENDE, 'test')
  finally:
    tasks.register_tasks()


def test_the_test_split_is_the_committed_sample_even_beside_a_built_corpus(tmp_path):
  """A machine that built the corpus decodes the same demo inputs as a fresh clone."""
  corpus, sample = tasks.demo.corpus_dir(tmp_path), tasks.demo.sample_dir(tmp_path)
  for path in (os.path.join(corpus, 'ende', 'test.tsv'), os.path.join(corpus, 'ende',
                                                                       'train.tsv')):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pathlib.Path(path).write_text('a\tb\n', encoding='utf-8')
  assert tasks.demo_tsv_path('ende', 'test', corpus, sample) == os.path.join(corpus, 'ende',
                                                                             'test.tsv')
  os.makedirs(sample)
  pathlib.Path(sample, 'ende_test.tsv').write_text('c\td\n', encoding='utf-8')
  assert tasks.demo_tsv_path('ende', 'test', corpus, sample) == os.path.join(sample,
                                                                             'ende_test.tsv')
  assert tasks.demo_tsv_path('ende', 'train', corpus, sample) == os.path.join(corpus, 'ende',
                                                                              'train.tsv')
  # A corpus the user names (register_tasks(data_dir=...), --gin.infer.task_data_dir)
  # supplies its own test split.
  assert tasks.demo_tsv_path('ende', 'test', corpus, sample, sample_first=False) == (
      os.path.join(corpus, 'ende', 'test.tsv'))
  try:  # the registered tasks: the default corpus does not, a named one does
    for data_dir, first in ((None, b'c\td'), (corpus, b'a\tb')):
      tasks.register_tasks(data_dir=data_dir, demo_root=str(tmp_path))
      source = tasks.seqio.get_mixture_or_task(tasks.DEMO_ENDE).source
      assert next(iter(source.get_dataset('test'))).numpy() == first
  finally:
    tasks.register_tasks()


def test_import_from_another_directory_registers_under_it(tmp_path):
  """`import specdec_t5x.tasks` (MIXTURE_OR_TASK_MODULE) anywhere: the tasks register
  without reading a file, the demo ones under that directory or $SPECDEC_DEMO_ROOT."""
  code = ('import seqio, specdec_t5x.tasks\n'
          'from specdec_t5x.integration import tasks as t\n'
          'v = seqio.get_mixture_or_task("demo_ende").output_features["inputs"].vocabulary\n'
          'print(v.sentencepiece_model_file, t.demo_tsv_path("ende", "test"))')
  env = {k: v for k, v in os.environ.items() if k != demo.ROOT_ENV}
  env['PYTHONPATH'] = os.pathsep.join([str(REPO), env.get('PYTHONPATH', '')])
  run = lambda **extra: subprocess.run(
      [sys.executable, '-c', code], cwd=tmp_path, env=dict(env, **extra),
      capture_output=True, text=True, timeout=300)
  proc = run()
  assert proc.returncode != 0  # no sample in tmp_path: named, not silently the repo's
  assert f'{tmp_path}/data/demo/ende_test.tsv' in proc.stderr
  proc = run(**{demo.ROOT_ENV: str(REPO)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == [demo.vocab_path(REPO),
                                 str(REPO / 'data' / 'demo' / 'ende_test.tsv')]


def test_the_library_computes_no_path_from_its_own_location():
  """Only run_dir.git_revision looks at where the package is (for its git revision)."""
  users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py')
                 if '__file__' in p.read_text(encoding='utf-8'))
  assert users == ['integration/run_dir.py']
  assert 'REPO_ROOT' not in ''.join(p.read_text(encoding='utf-8')
                                    for p in PACKAGE.rglob('*.py'))


def test_task_prefixes_are_defined_once():
  from specdec_t5x.research.data import corpus  # pylint: disable=g-import-not-at-top
  from specdec_t5x.research.measure import evaluation
  assert tasks.PREFIXES == {'ende': tasks.TRANSLATE_PREFIX, 'summarize': tasks.SUMMARIZE_PREFIX}
  assert corpus.TASK_PREFIXES is tasks.PREFIXES and evaluation.PREFIXES is tasks.PREFIXES
  defined = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py')
             if "'translate English to German: '" in p.read_text(encoding='utf-8')]
  assert defined == ['integration/prefixes.py']
