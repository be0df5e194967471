"""The layer rule (ARCHITECTURE.md), read from the source: imports point only down.

algorithm <- integration <- research <- scripts. The algorithm layer imports jax, flax and
numpy only; scripts import the installed library, never each other, and leave sys.path
alone; the public shims (specdec_t5x/{network,...}.py) only re-export. Inside the library
no module imports another that imports it back (the module graph is acyclic), and no module
(nor script) reaches for another module's private names.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'specdec_t5x'
LAYERS = ('algorithm', 'integration', 'research')
SHIMS = ('network', 'drafts', 'checkpoints', 'tasks', 'models', 'infer')
HEAVY = ('seqio', 'gin', 'tensorflow', 'tensorflow_datasets', 't5x', 'torch', 'transformers')


def _imports(path: pathlib.Path):
  """Absolute module names a file imports (any depth: function-level imports count)."""
  tree = ast.parse(path.read_text(encoding='utf-8'))
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      assert node.level == 0, f'{path}: relative import'
      out.append(node.module)
      out += [f'{node.module}.{a.name}' for a in node.names]
  return out


def _layer_of(module: str):
  parts = module.split('.')
  if parts[0] != 'specdec_t5x' or len(parts) < 2:
    return None
  return parts[1]


def _modules(layer):
  """A layer's modules, its subpackages' included."""
  return sorted((PACKAGE / layer).rglob('*.py'))


@pytest.mark.parametrize('layer', LAYERS)
def test_layers_import_only_downwards(layer):
  allowed = LAYERS[:LAYERS.index(layer) + 1]
  bad = []
  for path in _modules(layer):
    for name in _imports(path):
      target = _layer_of(name)
      if target is None:
        continue
      if target not in allowed:
        bad.append(f'{path.relative_to(ROOT)} imports {name}')
  assert not bad, '\n'.join(bad)


def test_algorithm_imports_no_heavy_frameworks():
  bad = [f'{p.relative_to(ROOT)} imports {n}' for p in _modules('algorithm')
         for n in _imports(p) if n.split('.')[0] in HEAVY]
  assert not bad, '\n'.join(bad)


def test_algorithm_layer_loads_without_tf_seqio_gin_torch():
  code = ('import sys, importlib, pkgutil\n'
          'import specdec_t5x.algorithm as a\n'
          'for m in pkgutil.walk_packages(a.__path__, "specdec_t5x.algorithm."):\n'
          '  importlib.import_module(m.name)\n'
          f'print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       cwd=ROOT, check=True).stdout.strip().splitlines()[-1]
  assert out == '[]', f'importing the algorithm layer loaded {out}'


def test_library_modules_live_in_a_layer():
  loose = sorted(p.stem for p in PACKAGE.glob("*.py"))
  assert set(loose) == set(SHIMS) | {'__init__'}, loose


def test_research_is_folders_by_purpose():
  """research/ holds subpackages only (train, data, measure, predict, results, experiments):
  a module's folder says what it is for."""
  loose = sorted(p.name for p in (PACKAGE / 'research').glob('*.py'))
  assert loose == ['__init__.py'], loose
  assert all((d / '__init__.py').exists() for d in (PACKAGE / 'research').iterdir()
             if d.is_dir() and d.name != '__pycache__')


@pytest.mark.parametrize('shim', SHIMS)
def test_public_shims_only_reexport(shim):
  tree = ast.parse((PACKAGE / f'{shim}.py').read_text(encoding='utf-8'))
  for node in tree.body:
    if isinstance(node, ast.ImportFrom):
      assert _layer_of(node.module) in LAYERS, node.module
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
      continue  # docstring
    elif isinstance(node, ast.Assign):
      assert [t.id for t in node.targets] == ['__all__']
    elif isinstance(node, ast.If):  # `if __name__ == '__main__': main()`
      assert ast.unparse(node.test) == "__name__ == '__main__'"
    else:
      raise AssertionError(f'{shim}.py: {ast.unparse(node)[:80]}')


def test_nothing_imports_the_shims():
  """The library, scripts and tests import layered modules; the shims are for outside code
  (tests/test_public_api.py checks them)."""
  shims = {f'specdec_t5x.{s}' for s in SHIMS}
  files = [p for layer in LAYERS for p in _modules(layer)] + sorted((ROOT / 'scripts').glob('*.py'))
  files += [p for p in sorted((ROOT / 'tests').glob('*.py')) if p.name != 'test_public_api.py']
  bad = [f'{p.relative_to(ROOT)} imports {n}' for p in files for n in _imports(p) if n in shims]
  assert not bad, '\n'.join(bad)


def test_scripts_import_no_script_and_leave_sys_path_alone():
  scripts = sorted((ROOT / 'scripts').glob('*.py'))
  names = {p.stem for p in scripts}
  bad = []
  for path in scripts:
    text = path.read_text(encoding='utf-8')
    if 'sys.path' in text:
      bad.append(f'{path.name} edits sys.path')
    for name in _imports(path):
      if name.split('.')[0] in names | {'scripts'}:
        bad.append(f'{path.name} imports {name}')
  assert not bad, '\n'.join(bad)


def test_no_module_past_400_lines():
  """Small single-purpose files: no library module or script grows past 400 lines."""
  files = sorted(PACKAGE.rglob('*.py')) + sorted((ROOT / 'scripts').glob('*.py'))
  long = {str(p.relative_to(ROOT)): n for p in files
          if (n := len(p.read_text(encoding='utf-8').splitlines())) > 400}
  assert not long, long


def _module_name(path: pathlib.Path) -> str:
  """specdec_t5x/algorithm/decode/core.py -> specdec_t5x.algorithm.decode.core (a
  package's __init__.py: the package)."""
  parts = path.relative_to(ROOT).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


LIBRARY = {_module_name(p): p for p in sorted(PACKAGE.rglob('*.py'))}


def _imported_modules(path: pathlib.Path):
  """The library modules a file imports (any depth): for `from m import x`, m.x where it is
  a module, else m."""
  out = set()
  for name in _imports(path):
    while name and name not in LIBRARY:
      name = name.rpartition('.')[0]
    if name:
      out.add(name)
  return out


def _cycle(graph):
  """A cycle of the directed graph {node: successors} as a list of nodes, or None."""
  state, stack = {}, []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for succ in sorted(graph.get(node, ())):
      if state.get(succ) == 'open':
        return stack[stack.index(succ):] + [succ]
      if succ not in state:
        found = visit(succ)
        if found:
          return found
    state[node] = 'done'
    stack.pop()
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_no_import_cycle():
  """The library's modules import one another in one direction: a module never imports,
  directly or through others (function-level imports included), one that imports it."""
  graph = {name: _imported_modules(path) - {name} for name, path in LIBRARY.items()}
  cycle = _cycle(graph)
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_the_cycle_finder_finds_cycles():
  assert _cycle({'a': {'b'}, 'b': {'c'}, 'c': set()}) is None
  assert _cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']


def _private(name: str) -> bool:
  return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def _private_module(dotted: str, path: pathlib.Path):
  """The private module (a leading-underscore part) that `dotted` names, when `path` lies
  outside the package holding it (a package's own modules may share it); else None."""
  parts = dotted.split('.')
  if parts[0] != 'specdec_t5x':
    return None
  for i, part in enumerate(parts):
    if _private(part):
      return None if ROOT.joinpath(*parts[:i]) in path.parents else '.'.join(parts[:i + 1])
  return None


def _private_uses(path: pathlib.Path):
  """`module.name` for each private name of another library module the file reads:
  `from m import _x`, or `m._x` where m is bound by an import (`import a.b as m`,
  `from a import m`) or spelled out (`a.b._x`); and each private module of another package
  it imports (`from a._m import x`)."""
  tree = ast.parse(path.read_text(encoding='utf-8'))
  bound, out = {}, set()  # local name -> library module
  for node in ast.walk(tree):
    names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
             [node.module] if isinstance(node, ast.ImportFrom) else [])
    out.update(m for m in map(lambda n: _private_module(n, path), names) if m)
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.asname and alias.name in LIBRARY:
          bound[alias.asname] = alias.name
    elif isinstance(node, ast.ImportFrom):
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        if full in LIBRARY:
          bound[alias.asname or alias.name] = full
        elif node.module in LIBRARY and _private(alias.name):
          out.add(full)
  for node in ast.walk(tree):
    if not (isinstance(node, ast.Attribute) and _private(node.attr)):
      continue
    parts, value = [], node.value
    while isinstance(value, ast.Attribute):
      parts.append(value.attr)
      value = value.value
    if not isinstance(value, ast.Name):
      continue
    dotted = '.'.join([bound.get(value.id, value.id)] + parts[::-1])
    if dotted in LIBRARY:
      out.add(f'{dotted}.{node.attr}')
  return out


def test_no_private_names_across_modules():
  """A module's private names (a leading underscore) are its own: neither another library
  module nor a script imports them or reads them as attributes (tests may)."""
  files = sorted(PACKAGE.rglob('*.py')) + sorted((ROOT / 'scripts').glob('*.py'))
  found = sorted(f'{p.relative_to(ROOT)} uses {use}' for p in files for use in _private_uses(p))
  assert not found, '\n'.join(found)


def test_the_private_name_check_sees_private_modules_of_other_packages():
  name = 'specdec_t5x.research.experiments._base'
  inside = PACKAGE / 'research' / 'experiments' / 'tree.py'
  outside = PACKAGE / 'research' / 'results' / 'reproduce.py'
  assert _private_module(name, inside) is None  # the package's own modules share it
  assert _private_module(name, outside) == name
  assert _private_module('specdec_t5x.research.experiments', outside) is None


def test_the_private_name_check_sees_both_spellings(tmp_path):
  path = tmp_path / 'user.py'
  path.write_text('from specdec_t5x.algorithm import api as a\n'
                  'from specdec_t5x.algorithm.rows import _HALF\n'
                  'import specdec_t5x.algorithm.rows\n'
                  'a._compiled(); a.generate(); specdec_t5x.algorithm.rows._x\n')
  assert _private_uses(path) == {'specdec_t5x.algorithm.api._compiled',
                                 'specdec_t5x.algorithm.rows._HALF',
                                 'specdec_t5x.algorithm.rows._x'}
