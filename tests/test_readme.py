"""README.md and docs/ as a new user reads them: short, the commands CI runs, links that
resolve, no speedup figure typed by hand (figures come rendered from results/*.json; every
other kind of figure: tests/test_docs_figures.py), and the Python example runs as written,
on public names only."""

import pathlib
import re
import subprocess
import sys

import pytest

from specdec_t5x.research.results import reproduce

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / 'README.md', REPO / 'ARCHITECTURE.md'] + sorted((REPO / 'docs').glob('*.md'))
# A speedup or cost ratio typed into prose: "0.93x", "1.2-1.4x", "3x".
FIGURE = re.compile(r'(?<![\w.])\d+(\.\d+)?(-\d+(\.\d+)?)?x\b')


def _without_rendered_blocks(text):
  if reproduce.BOX_BEGIN in text:
    head, rest = text.split(reproduce.BOX_BEGIN, 1)
    text = head + rest.split(reproduce.BOX_END, 1)[1]
  return reproduce.BLOCK.sub('', text)


def test_readme_is_short_and_holds_the_two_commands_ci_runs():
  readme = (REPO / 'README.md').read_text('utf-8')
  assert len(readme.splitlines()) <= 150
  ci = (REPO / '.ci' / 'run').read_text('utf-8')
  test_command = [line for line in ci.splitlines() if line.startswith('python -m pytest')]
  assert len(test_command) == 1 and 'pip install -e ".[test]" && ' + test_command[0] in readme
  # Command 1 installs what the demo needs alone; the "test" extra is command 2's.
  assert 'pip install -e . && python -m specdec_t5x.infer --gin_file=configs/demo.gin' in readme


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.name)
def test_pages_quote_no_figure_by_hand_and_their_links_resolve(page):
  text = page.read_text('utf-8')
  typed = [m.group(0) for m in FIGURE.finditer(_without_rendered_blocks(text))]
  assert not typed, f'{page.name} types figures that belong to results/*.json: {typed}'
  for target in re.findall(r'\]\(([^)#\s]+)\)', text):
    if '://' not in target:
      assert (page.parent / target).exists(), f'{page.name} links to a missing {target}'
  for target, anchor in re.findall(r'\]\(([^)#\s]*)#([^)\s]+)\)', text):
    if '://' not in target:
      linked = (page.parent / target) if target else page
      assert anchor in _anchors(linked.read_text('utf-8')), (
          f'{page.name} links to {target}#{anchor}, a heading that is not there')


def _anchors(text):
  """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces
  as hyphens."""
  return {re.sub(r'[^\w\- ]', '', m.group(1).strip().lower()).replace(' ', '-')
          for m in re.finditer(r'^#+ (.*)$', text, re.M)}


def test_readme_has_no_results_table_but_points_to_the_index():
  """The results table lives in results/INDEX.md alone; the README links it."""
  readme = (REPO / 'README.md').read_text('utf-8')
  assert 'results table' not in readme and '| file | headline' not in readme
  assert '`results/INDEX.md`' in readme


def test_the_python_example_uses_public_names_only():
  readme = (REPO / 'README.md').read_text('utf-8')
  example = readme.split('```python\n', 1)[1].split('```', 1)[0]
  imports = re.findall(r'^(?:from|import) (\S+)', example, re.M)
  assert 'specdec_t5x' in imports
  assert not [m for m in imports if m.startswith('specdec_t5x.')], imports
  assert not re.search(r'specdec_t5x\.(?:algorithm|integration|research)\b', example)


def test_the_figure_check_sees_a_typed_figure():
  assert [m.group(0) for m in FIGURE.finditer('printed 0.93x, then 1.2-1.4x and 3x; x86-64')] \
      == ['0.93x', '1.2-1.4x', '3x']


@pytest.mark.slow
def test_the_python_example_runs_as_written():
  readme = (REPO / 'README.md').read_text('utf-8')
  example = readme.split('```python\n', 1)[1].split('```', 1)[0]
  proc = subprocess.run([sys.executable, '-c', example], cwd=REPO, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert float(proc.stdout.strip().splitlines()[-1]) > 1.0  # tokens per target call
