"""Shared tiny models for the tests (hermetic: random weights made here), and the `slow`
marker: `pytest -m "not slow"` leaves out the end-to-end runs (runners, training, T5X's
infer, fine-tuning, Hugging Face, the demo checkpoints, checks of speed rather than
exactness) and the results tables' tooling (scripts, experiments, reproduce), and keeps the
exactness and unit tests; README command 2 and .ci/run run everything.

SPECDEC_REQUIRE_T5X=1 (set by .ci/run where it installs T5X): a test or test module that
would be skipped for a missing T5X-stack module (its skip reason names one of T5X_STACK)
fails instead, so that no comparison with stock T5X can silently drop out of a run.

The tests that are neither `slow` nor `timing` compile with XLA's least optimisation
effort (`_compile_quickly`, `_pass_quick_xla_options`); SPECDEC_TEST_QUICK_COMPILE=0
compiles everything as users do."""

import functools
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import jax
from jax._src import compiler as jax_compiler  # pylint: disable=g-direct-jax-src-import
import jax.numpy as jnp
import numpy as np
import pytest

import compile_report
from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.algorithm.network import T5Config, Transformer


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'slow: an end-to-end run (subprocess, runner, training), a results '
      'table\'s tooling or a check of speed, not exactness; deselect with -m "not slow" for '
      'the exactness and unit tests alone')
  config.addinivalue_line(
      'markers', 'timing: asserts on wall-clock timings, so it runs alone: the README\'s test '
      'command runs these after the others, not beside a second worker (two workers on two '
      'cores make a tiny model\'s millisecond timings noise)')
  _share_compiled_programs(config)
  _compile_quickly()
  _pass_quick_xla_options()


def _share_compiled_programs(config):
  """One JAX compilation cache for the whole run: the first process (the xdist controller,
  or pytest alone) makes a fresh folder and names it in JAX_COMPILATION_CACHE_DIR, which
  the workers and every child Python inherit. A program compiled once (same HLO, options
  and devices) is then read back instead of compiled again by another test, worker or
  child, as T5X users cache compiles across runs. Fresh per run, so a run's timings are a
  clean machine's; removed at exit. SPECDEC_TEST_JAX_CACHE=0 turns it off."""
  if os.environ.get('SPECDEC_TEST_JAX_CACHE') == '0':
    return
  if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    folder = tempfile.mkdtemp(prefix='specdec_jax_cache_')
    os.environ['JAX_COMPILATION_CACHE_DIR'] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
  jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
  jax.config.update('jax_persistent_cache_min_compile_time_secs',
                    float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']))
  jax.config.update('jax_persistent_cache_min_entry_size_bytes',
                    int(os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES']))


# JAX's switches for compiling with the least optimisation effort: {name: (the variable a
# child Python reads it from, its quick value)}. (Not jax_optimization_level O0: with the
# elemental emitters below it saves no compile time, and its unfused programs ran the
# chi-square tests' 20,000-row decodes about 1.5x slower.)
QUICK_COMPILE = {'jax_disable_most_optimizations': ('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')}
_USERS_VARIABLES = 'SPECDEC_TEST_USERS_COMPILE'  # the run's own values, for the workers
QUICK_ENABLED = os.environ.get('SPECDEC_TEST_QUICK_COMPILE') != '0'


# XLA's own options for the least effort, beyond JAX's switch: XLA:CPU's elemental emitters
# instead of its MLIR fusion emitters, whose fixed cost is most of a small program's compile
# at LLVM's level 0 (two chain decode programs and their helpers: 0.9 s instead of 1.6-1.8;
# the same fusions and results to rounding).
QUICK_XLA_OPTIONS = (('xla_cpu_use_fusion_emitters', False),)


def _pass_quick_xla_options():
  """Adds QUICK_XLA_OPTIONS to every compile of this process while JAX's least-effort switch
  is on, i.e. in the quick tests (JAX has no switch for them: they ride on each compile's
  options, as `jax.jit(compiler_options=...)` passes them). Children compile with JAX's
  switch alone. An XLA that lacks the options gets none (test_compile_effort fails)."""
  if not QUICK_ENABLED or not _xla_takes(QUICK_XLA_OPTIONS):
    return
  get = jax_compiler.get_compile_options

  @functools.wraps(get)
  def get_compile_options(*args, **kwargs):
    options = get(*args, **kwargs)
    if jax.config.values['jax_disable_most_optimizations']:
      options.env_option_overrides = (list(options.env_option_overrides)
                                      + list(QUICK_XLA_OPTIONS))
    return options
  jax_compiler.get_compile_options = get_compile_options


def _xla_takes(options) -> bool:
  """Whether this XLA compiles a program with these options."""
  try:
    jax.jit(lambda x: x + 1).lower(1.0).compile(dict(options))
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def _users_compile() -> dict:
  """{variable: value or None}: the compile variables the run started with (the first
  process records them for the xdist workers, which inherit the quick ones)."""
  if _USERS_VARIABLES not in os.environ:
    os.environ[_USERS_VARIABLES] = json.dumps(
        {variable: os.environ.get(variable) for variable, _ in QUICK_COMPILE.values()})
  return json.loads(os.environ[_USERS_VARIABLES])


def _set_compile(variables: dict):
  """Sets the compile variables (None: unset) and JAX's switches to match them. A change of
  effort empties JAX's in-memory caches, which ignore the effort: a program compiled with
  the other effort rounds differently (the elemental emitters' transcendental functions),
  and a test that compares two programs bit for bit must get both from one effort."""
  before = [jax.config.values[name] for name in QUICK_COMPILE]
  for name, (variable, _) in QUICK_COMPILE.items():
    value = variables[variable]
    if value is None:
      os.environ.pop(variable, None)
    else:
      os.environ[variable] = value
    jax.config.update(name, _parse(name, value))
  if [jax.config.values[name] for name in QUICK_COMPILE] != before:
    jax.clear_caches()


def _parse(name: str, value):
  """A switch's value as JAX reads it from its variable (None: JAX's default)."""
  assert name == 'jax_disable_most_optimizations', name  # QUICK_COMPILE's one switch
  return value is not None and value.lower() in ('y', 'yes', 't', 'true', 'on', '1')


def _compile_quickly():
  """The exactness, parity and unit tests compile their programs, and their children
  theirs, with XLA's least optimisation effort: the same HLO semantics and the same results
  to rounding, for about half the compile time that is most of their time. Set for the
  whole run, fixtures and shared laws included; `compile_as_users_do` undoes it for the
  `slow` and `timing` tests (speed, results tables, end-to-end runs), and a run of those
  alone never sets it. SPECDEC_TEST_QUICK_COMPILE=0 turns it off."""
  users = _users_compile()
  _set_compile(dict(QUICK_COMPILE.values()) if QUICK_ENABLED else users)


def _quick(item) -> bool:
  """Whether a test compiles with the least effort: neither `slow` nor `timing`."""
  return QUICK_ENABLED and not any(
      item.get_closest_marker(mark) for mark in ('slow', 'timing'))


def pytest_collection_finish(session):
  """A run that selects no quick test (the README's timing run) compiles as users do
  throughout, its fixtures included."""
  if not any(_quick(item) for item in session.items):
    _set_compile(_users_compile())


@pytest.fixture(autouse=True)
def compile_as_users_do(request):
  """A `slow` or `timing` test, and its children, compile with the run's own settings (and
  compile afresh: `_set_compile` empties the in-memory caches when the effort changes)."""
  if _quick(request.node):
    yield
    return
  quick = {variable: os.environ.get(variable) for variable, _ in QUICK_COMPILE.values()}
  _set_compile(_users_compile())
  yield
  _set_compile(quick)


# T5X and the libraries only T5X's path needs; a skip reason naming one of them is a skip
# for want of T5X.
T5X_STACK = ('t5x', 'orbax', 'seqio', 'flaxformer', 'airio', 'jestimator')
_T5X_SKIP = re.compile(r'\b(%s)\b' % '|'.join(T5X_STACK), re.IGNORECASE)


def _skip_reason(report) -> str:
  """A skipped report's reason (its longrepr is (path, line, reason))."""
  return report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)


def t5x_skip_fails(report) -> bool:
  """Whether `report` (a test's or a collector's) is a skip that SPECDEC_REQUIRE_T5X=1
  turns into a failure: a skip whose reason names a T5X_STACK module."""
  return (os.environ.get('SPECDEC_REQUIRE_T5X') == '1' and report.skipped
          and bool(_T5X_SKIP.search(_skip_reason(report))))


def _fail_t5x_skip(report):
  if t5x_skip_fails(report):
    report.outcome = 'failed'
    report.longrepr = (f'{report.nodeid}: SPECDEC_REQUIRE_T5X=1, but it would have been '
                       f'skipped for a missing T5X-stack module: {_skip_reason(report)}')
  return report


# Named apart from other hooks of the same spec in this file (a second def of one name
# would replace the first); pytest reads only names that start with pytest_.
@pytest.hookimpl(wrapper=True, specname='pytest_runtest_makereport')
def pytest_runtest_makereport_require_t5x(item, call):  # a skipif mark, importorskip in a test
  del item, call
  return _fail_t5x_skip((yield))


@pytest.hookimpl(wrapper=True, specname='pytest_make_collect_report')
def pytest_make_collect_report_require_t5x(collector):  # importorskip at a module's top
  del collector
  return _fail_t5x_skip((yield))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """A test's exact-law samples report the acceptance rule's branches they hit
  (test_distribution.BRANCH_LOG), and each phase its compile seconds (compile_report), as
  user properties, which reach the summary under xdist."""
  outcome = yield
  outcome.get_result().user_properties.append((compile_report.KEY, compile_report.take()))
  log = getattr(sys.modules.get('test_distribution'), 'BRANCH_LOG', None)
  if log is None:
    return
  if call.when == 'call' and log:
    outcome.get_result().user_properties.append(('branches', list(log)))
  if call.when in ('setup', 'call'):
    log.clear()


def pytest_terminal_summary(terminalreporter):
  lines = [f'{r.nodeid}: {value}' for key in ('passed', 'failed')
           for r in terminalreporter.stats.get(key, [])
           for name, value in getattr(r, 'user_properties', ()) if name == 'branches']
  if lines:
    terminalreporter.write_sep('-', 'steps per branch of the acceptance rule, per sample')
    for line in sorted(lines):
      terminalreporter.write_line(line)
  reports = [r for rs in terminalreporter.stats.values() for r in rs  # test phases only
             if getattr(r, 'when', None) in ('setup', 'call', 'teardown')]
  lines = compile_report.summary(reports)
  if lines:
    terminalreporter.write_sep('-', 'where the time went: XLA compiles per test file')
    for line in lines:
      terminalreporter.write_line(line)


REPO = pathlib.Path(__file__).resolve().parents[1]


def load_script(name):
  """scripts/<name>.py imported as a module (the scripts are not a package)."""
  spec = importlib.util.spec_from_file_location(name, REPO / 'scripts' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_child(code, *args, host_devices=None, timeout=600, with_stderr=False, **env):
  """Runs `code` in a fresh Python (cwd: the repository; `host_devices`: that many fake CPU
  devices, set before JAX starts; `env`: more variables) and returns the JSON its last
  'RESULT ' line prints (and its stderr, `with_stderr`); fails with its stderr if it exits
  non-zero or prints none."""
  env = dict(os.environ, **env)
  if host_devices:
    env.update(XLA_FLAGS=f'--xla_force_host_platform_device_count={host_devices}',
               JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-c', code, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  assert proc.returncode == 0 and lines, proc.stderr[-5000:]
  out = json.loads(lines[-1][len('RESULT '):])
  return (out, proc.stderr) if with_stderr else out


def tiny_config(vocab=40, emb=32, layers=2, heads=4, v11=True, **kw):
  return T5Config(vocab_size=vocab, emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
                  num_decoder_layers=layers, head_dim=8, mlp_dim=2 * emb,
                  mlp_activations=('gelu', 'linear') if v11 else ('relu',),
                  dropout_rate=0.0, logits_via_embedding=not v11, **kw)


def make_model(config, seed=0, logit_scale=1.0):
  """(module, params); `logit_scale` sharpens (>1) or flattens (<1) the output."""
  module = Transformer(config)
  dummy = jnp.ones((1, 4), jnp.int32)
  params = module.init(jax.random.PRNGKey(seed), dummy, dummy)['params']
  if logit_scale != 1.0:
    params = jax.tree_util.tree_map(lambda x: x, params)
    dec = dict(params['decoder'])
    dec['decoder_norm'] = {'scale': params['decoder']['decoder_norm']['scale'] * logit_scale}
    params = dict(params, decoder=dec)
  return module, params


def jit_apply(module, variables, *args, method=None, **kwargs):
  """`module.apply(variables, *args, method=method, **kwargs)` as ONE compiled program,
  its None, Python scalars, strings and tuples static: applied eagerly, each of a network's
  hundreds of ops is compiled apart, one small program each, at a real cost in these tests."""
  def static(x):
    return x is None or isinstance(x, (bool, int, float, str, tuple))
  fixed = tuple((i, a) for i, a in enumerate(args) if static(a))
  fixed_kw = tuple(sorted((k, v) for k, v in kwargs.items() if static(v)))
  traced = [a for a in args if not static(a)]
  traced_kw = {k: v for k, v in kwargs.items() if not static(v)}
  return _jitted_apply(module, method, fixed, fixed_kw, len(args), modes.trace_state())(
      variables, traced, traced_kw)


@functools.lru_cache(maxsize=None)
def _jitted_apply(module, method, fixed, fixed_kw, num_args, trace_state):
  del trace_state  # a key only: the kernel switches this program was traced under
  positions = dict(fixed)

  def run(variables, traced, traced_kw):
    rest = iter(traced)
    args = [positions[i] if i in positions else next(rest) for i in range(num_args)]
    return module.apply(variables, *args, method=method, **dict(fixed_kw), **traced_kw)
  return jax.jit(run)


def random_inputs(batch, length, vocab, seed=0, min_len=2):
  """Random encoder inputs [batch, length] with per-row padding and no EOS/pad inside."""
  rs = np.random.RandomState(seed)
  x = rs.randint(2, vocab, size=(batch, length)).astype(np.int32)
  for r in range(batch):
    x[r, rs.randint(min_len, length + 1):] = 0
  return x


@pytest.fixture(scope='session')
def target_and_draft():
  target = make_model(tiny_config(), seed=0, logit_scale=3.0)
  draft = make_model(tiny_config(emb=16, layers=1), seed=1, logit_scale=3.0)
  return target, draft


def train_tiny_spm(path, texts):
  """A ~150-piece SentencePiece model with T5's ids (pad 0, eos 1, unk 2), written to path."""
  import io
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(list(texts) * 5), model_writer=model, vocab_size=150,
      hard_vocab_limit=False, character_coverage=1.0, model_type='unigram',
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
  path.write_bytes(model.getvalue())
  return str(path)
