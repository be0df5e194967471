"""The layer rule (ARCHITECTURE.md), read from the source: imports point only down.

algorithm <- integration <- research <- scripts. The algorithm layer imports jax, flax and
numpy only; scripts import the installed library, never each other, and leave sys.path
alone; the public shims (specdec_t5x/{network,...}.py) only re-export.
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
  return sorted((PACKAGE / layer).glob('*.py'))


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
          'for m in pkgutil.iter_modules(a.__path__):\n'
          '  importlib.import_module("specdec_t5x.algorithm." + m.name)\n'
          f'print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       cwd=ROOT, check=True).stdout.strip().splitlines()[-1]
  assert out == '[]', f'importing the algorithm layer loaded {out}'


def test_library_modules_live_in_a_layer():
  loose = sorted(p.stem for p in PACKAGE.glob("*.py"))
  assert set(loose) == set(SHIMS) | {'__init__'}, loose


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
