"""No figure typed by hand: every measurement or prediction that README.md, ARCHITECTURE.md,
docs/*.md and the comments of configs/**/*.gin quote stands inside a rendered block (the
README's speedup box, or `<!-- rendered: NAME -->` ... `<!-- end -->`), and every rendered
block is what results/*.json holds now. The paper's own figures may be quoted where the
word "paper" stands shortly before them (e.g. "paper: alpha 0.75", "the paper's 3.4x")."""

import pathlib
import re

import pytest

from specdec_t5x.research.results import reproduce

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = str(REPO / 'results')
PAGES = [pathlib.Path(p) for p in reproduce.doc_pages(str(REPO))]
GIN_FILES = sorted((REPO / 'configs').rglob('*.gin'))

_NUM = r'(?<![\w.\-/=])\d+(?:\.\d+)?'  # a number that is not part of a word, path or flag
# What a typed measurement or prediction looks like (configuration values such as gamma 4,
# batch 8, 2 cores, 512 tokens or version numbers do not match).
RULES = {
    'speedup or ratio': re.compile(_NUM + r'(?:-\d+(?:\.\d+)?)?x\b'),
    'milliseconds': re.compile(_NUM + r'\s?ms\b'),
    'throughput': re.compile(_NUM + r'\s?(?:tok/s|tokens/s|tokens per second)'),
    'alpha or acceptance value': re.compile(
        r'\b(?:alpha|acceptance rate|acceptance_rate|beta|agreement)\W{0,3}(?:of |is |= ?)?'
        r'\d?\.\d+'),
    'BLEU or ROUGE score': re.compile(r'\b(?:BLEU|ROUGE(?:-\w+)?)\W{0,3}(?:of )?\d+(?:\.\d+)?'),
    'percentage': re.compile(_NUM + r'\s?%(?! (?:interval|CI|confidence))'),
    'cost in steps': re.compile(r'(?<![\w.\-/=])\d+\.\d+\s(?:one-token\s)?steps?\b'),
    'figure with two decimals': re.compile(r'(?<![\w.\-/=])\d+\.\d{2,}(?![\w.])'),
}
PAPER_CONTEXT = 80  # characters before a figure in which "paper" makes it the paper's
VERSION = re.compile(r'(?:Python|JAX|jax|version|transformers|CUDA)\s*$')  # "Python 3.10"


def _outside_rendered_blocks(text: str) -> str:
  """`text` with the speedup box and every rendered block blanked (their figures are
  checked against the JSON by the test below)."""
  if reproduce.BOX_BEGIN in text:
    head, rest = text.split(reproduce.BOX_BEGIN, 1)
    text = head + ' ' + rest.split(reproduce.BOX_END, 1)[1]
  return reproduce.BLOCK.sub(' ', text)


def _gin_comments(text: str) -> str:
  """The comment text of a gin file (after each '#'), one line per line."""
  return '\n'.join(line.split('#', 1)[1] if '#' in line else '' for line in text.splitlines())


def typed_figures(text: str):
  """(rule, figure, context) of every measured-looking figure in `text` that is not the
  paper's."""
  flat = ' '.join(text.split())
  found = []
  for rule, pattern in RULES.items():
    for m in pattern.finditer(flat):
      before = flat[max(0, m.start() - PAPER_CONTEXT):m.start()]
      if 'paper' not in before.lower() and not VERSION.search(before):
        found.append((rule, m.group(0), flat[max(0, m.start() - 40):m.end() + 10]))
  return found


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_pages_quote_no_figure_outside_rendered_blocks(page):
  typed = typed_figures(_outside_rendered_blocks(page.read_text('utf-8')))
  assert not typed, (f'{page.relative_to(REPO)} types figures that belong to results/*.json '
                     f'(render them in a <!-- rendered: NAME --> block, or drop them): {typed}')


@pytest.mark.parametrize('gin', GIN_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_gin_comments_quote_no_measured_figure(gin):
  typed = typed_figures(_gin_comments(gin.read_text('utf-8')))
  assert not typed, f'{gin.relative_to(REPO)} comments type measured figures: {typed}'


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_rendered_block_is_what_the_results_hold(page):
  text = page.read_text('utf-8')
  assert text.count('<!-- rendered:') == len(reproduce.BLOCK.findall(text)), (
      f'{page.relative_to(REPO)}: a rendered block without its <!-- end -->')
  render = reproduce.render_readme if page == REPO / 'README.md' else reproduce.render_blocks
  assert render(text, RESULTS) == text, (
      f'{page.relative_to(REPO)} quotes other figures than results/*.json: run '
      'python scripts/reproduce_results.py --index --docs')


def test_the_rules_see_typed_figures_and_let_the_papers_pass():
  planted = ('The demo printed 1.38x (0.96-1.10x before), 12.4 ms a batch, 1413 tokens/s, '
             'alpha 0.64 and acceptance rate 0.51, BLEU 9.45, 40% of positions, a call of '
             '2.21 steps; efficiency 0.99.')
  rules = [rule for rule, _, _ in typed_figures(planted)]
  for rule in RULES:
    assert rule in rules, rule
  assert typed_figures('the paper reports alpha 0.75 and 3.4x; gamma 4, batch 8, 2 cores, '
                       'Python 3.10, 512 tokens, x86-64, a 95% interval, `g7+w4+n11+c4`') == []


def test_a_planted_figure_fails_the_page_check_and_a_rendered_one_passes():
  page = (REPO / 'docs' / 'demo.md').read_text('utf-8')
  assert typed_figures(_outside_rendered_blocks(page)) == []
  assert typed_figures(_outside_rendered_blocks(page + '\nIt ran 1.38x faster.\n'))
  block = '<!-- rendered: headline:demo_speedup_runs --><!-- end -->'
  rendered = reproduce.render_blocks(block, RESULTS)
  assert rendered != block and typed_figures(rendered)  # figures, inside the block
  assert typed_figures(_outside_rendered_blocks(rendered)) == []
  assert reproduce.render_blocks(rendered, RESULTS) == rendered
  stale = rendered.replace('identical', 'DIFFERENT')
  assert reproduce.render_blocks(stale, RESULTS) != stale
