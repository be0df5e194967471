"""DecodeConfig (one validated decode configuration), DecodeStats (one set of stats names)
and their use by generate, the T5X-facing model and gin."""

import collections
import dataclasses
import os
import subprocess
import sys

import gin
import numpy as np
import pytest

from conftest import random_inputs, run_child
from specdec_t5x import generate
import specdec_t5x
from specdec_t5x.algorithm import api, programs, stats
from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.algorithm.config import DecodeConfig, GammaPolicy
from specdec_t5x.integration import infer, models

DESIGN_KEYS = ('target_calls', 'drafted_tokens', 'accepted_tokens', 'generated_tokens',
               'accepted_length_histogram')  # ARCHITECTURE.md, "Public paths"


@pytest.fixture(autouse=True)
def _clean_gin():
  yield
  gin.clear_config()


@pytest.mark.parametrize('kw,pattern', [
    (dict(gamma=0), r"gamma must be >= 1 or 'auto'"),
    (dict(gamma=2.5), r"gamma must be >= 1 or 'auto'"),
    (dict(gamma='sometimes'), r"gamma must be >= 1 or 'auto'"),
    (dict(gamma=True), r"gamma must be >= 1 or 'auto'"),
    (dict(temperature=float('nan')), 'temperature must be a finite number >= 0'),
    (dict(topk=-1), 'topk must be >= 0'),
    (dict(topk=3, topp=0.9, temperature=1.0), 'at most one of topk'),
    (dict(gamma='auto', gamma_alpha=1.5), r'gamma_alpha .* must be in \[0, 1\]'),
    (dict(lenience=0.0), r'lenience must be in \(0, 1\]'),
    (dict(verifier='tree'), "verifier must be 'token' or 'block'"),
    (dict(verifier='block', lenience=0.5), 'token-wise verifier only'),
    (dict(gamma_policy='sometimes'), 'gamma_policy must be one of'),
    (dict(gamma_policy=3), 'gamma_policy must be a str or GammaPolicy'),
    (dict(gamma_policy='confidence', verifier='block'), 'verified token-wise only'),
    (dict(cpu_kernels='fast'), 'cpu_kernels must be one of'),
])
def test_bad_settings_raise_when_built(kw, pattern):
  with pytest.raises(ValueError, match=pattern):
    DecodeConfig(**kw)


def test_fields_are_normalised_and_hashable():
  config = DecodeConfig(temperature=1, topk=3.0, gamma=5.0, gamma_policy='running_alpha',
                        lenience=1)
  assert (config.temperature, config.topk, config.gamma, config.lenience) == (1.0, 3, 5, 1.0)
  assert config.gamma_policy == GammaPolicy('running_alpha')
  assert config == DecodeConfig(temperature=1.0, topk=3, gamma=5,
                                gamma_policy=GammaPolicy('running_alpha'))
  assert hash(config) == hash(config.replace())
  assert config.sampling.temperature == 1.0 and config.sampling.topk == 3
  assert DecodeConfig(gamma='auto').gamma == 'auto'
  assert specdec_t5x.GammaPolicy is GammaPolicy  # one policy type, also at the public path
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.gamma = 3


def test_describe_adds_new_settings_only_when_used():
  assert DecodeConfig(gamma=3, cpu_kernels='xla').describe() == {
      'gamma': 3, 'temperature': 0.0, 'topk': 0, 'topp': 0.0, 'lenience': 1.0,
      'lossy': False, 'verifier': 'token', 'cpu_kernels': 'xla'}
  d = DecodeConfig(gamma='auto', gamma_alpha=0.4,
                   gamma_policy=GammaPolicy('confidence', threshold=0.3)).describe()
  assert d['gamma_alpha'] == 0.4 and d['gamma_policy']['kind'] == 'confidence'
  assert d['gamma_policy']['threshold'] == 0.3


def test_generate_takes_a_config_or_the_settings(target_and_draft):
  target, draft = target_and_draft
  enc = random_inputs(3, 9, 40, seed=4)
  kw = dict(gamma=3, temperature=1.0, topk=5, gamma_policy='running_alpha')
  a = generate(target, enc, draft=draft, max_decode_length=8, **kw)
  b = generate(target, enc, draft=draft, max_decode_length=8, config=DecodeConfig(**kw))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  for k in a.stats:
    np.testing.assert_array_equal(a.stats[k], b.stats[k], err_msg=k)
  with pytest.raises(ValueError, match=r"not both \(also given: \['gamma'\]\)"):
    generate(target, enc, draft=draft, max_decode_length=8, gamma=2, config=DecodeConfig())
  with pytest.raises(ValueError, match="generate needs an integer gamma"):
    generate(target, enc, draft=draft, max_decode_length=8, config=DecodeConfig(gamma='auto'))


def test_stats_are_typed_and_read_as_a_mapping(target_and_draft):
  target, draft = target_and_draft
  enc = random_inputs(3, 9, 40, seed=6)
  out = generate(target, enc, draft=draft, gamma=3, max_decode_length=8)
  assert isinstance(out.stats, stats.DecodeStats)
  assert set(DESIGN_KEYS) <= set(out.stats) and 'histogram' not in out.stats
  assert np.asarray(out.stats['target_calls']).shape == (3,)
  assert np.asarray(out.stats['accepted_length_histogram']).shape == (4,)
  assert out.stats['generated_tokens'] is out.stats.generated_tokens
  assert set(dict(out.stats)) == set(out.stats.keys()) and len(out.stats) == 13
  # A chain's accepted tokens all come from the draft (stats.SOURCES' first entry).
  np.testing.assert_array_equal(out.stats['accepted_by_source'],
                                [np.sum(out.stats['accepted_tokens']), 0, 0])
  with pytest.raises(KeyError):
    out.stats['histogram']  # pylint: disable=pointless-statement
  # The histogram counts one entry per step of each decoding row: its sum is the calls.
  assert int(np.sum(out.stats['accepted_length_histogram'])) == int(
      np.sum(out.stats['target_calls']))
  # The step outcomes split the steps that verified a draft by the rule's branch: a step
  # rejecting its first draft accepted none, one accepting every draft is a full block.
  outcomes, accepted = (np.asarray(out.stats[k]) for k in ('step_outcomes',
                                                            'accepted_length_histogram'))
  drafted = np.asarray(out.stats['draft_length_histogram'])
  assert outcomes.sum() == drafted[1:].sum() and outcomes[0] == accepted[0] - drafted[0]
  assert outcomes[2] >= accepted[3] and not np.any(out.stats['skipped_cache_writes'])


def test_summarize_one_function_for_outputs_and_totals(target_and_draft):
  target, draft = target_and_draft
  out = generate(target, random_inputs(3, 9, 40, seed=7), draft=draft, gamma=2,
                 max_decode_length=8)
  s = stats.summarize(out.stats)
  raw = {k: stats.total(k, out.stats[k]) for k in stats.PER_EXAMPLE_STATS}
  assert {k: s[k] for k in raw} == raw
  assert isinstance(raw['beta_sum'], float) and isinstance(raw['beta_positions'], int)
  assert s['acceptance_rate'] == raw['accepted_tokens'] / raw['drafted_tokens']
  assert s['alpha'] == raw['beta_sum'] / raw['beta_positions']
  assert s['mean_tokens_per_target_call'] == raw['generated_tokens'] / raw['target_calls']
  assert s['accepted_length_histogram'] == np.asarray(
      out.stats['accepted_length_histogram']).tolist()
  # Totals kept as plain numbers (as infer keeps them) summarise to the same.
  assert s['accepted_by_source'] == dict(zip(stats.SOURCES, np.asarray(
      out.stats['accepted_by_source']).tolist()))
  totals = dict(raw, accepted_length_histogram=s['accepted_length_histogram'],
                accepted_by_source=np.asarray(out.stats['accepted_by_source']))
  assert stats.summarize(totals) == s
  assert not hasattr(models, 'summarize_stats')  # one summary: stats.summarize
  assert stats.summarize({})['alpha'] is None
  assert stats.summarize({})['acceptance_rate'] is None


def test_model_holds_one_config(target_and_draft):
  """The model keeps the DecodeConfig it is given and nothing else: no per-field copies,
  keywords or read-back properties; the defaults are DecodeConfig's."""
  (t_module, _), (d_module, d_params) = target_and_draft
  config = DecodeConfig(gamma=5, temperature=1.0, gamma_policy='confidence')
  model = models.StandaloneSpeculativeModel(t_module, draft_module=d_module,
                                            draft_params=d_params, decode_config=config)
  assert model.decode_config is config and model.run_config is config
  for name in ('gamma', 'temperature', 'topk', 'topp', 'lenience', 'verifier', 'gamma_alpha'):
    assert not hasattr(model, name), name
  assert models.StandaloneSpeculativeModel(t_module).decode_config == DecodeConfig()
  with pytest.raises(TypeError, match='Unknown arguments'):
    models.StandaloneSpeculativeModel(t_module, gamma=2)
  with pytest.raises(TypeError, match='must be a DecodeConfig'):
    models.StandaloneSpeculativeModel(t_module, decode_config={'gamma': 2})


def _model(*bindings):
  configured = infer.parse_gin(['configs/spec_tiny_test.gin'],
                               ["INFER_OUTPUT_DIR = '/tmp/unused'", *bindings])
  return gin.get_bindings(configured, resolve_references=True)['model']


def test_every_field_is_bindable_from_gin():
  model = _model()
  assert model.decode_config == DecodeConfig(gamma=4)
  model = _model("GAMMA_POLICY = 'running_alpha'", 'TOPK = 3', 'TEMPERATURE = 0.5')
  assert model.decode_config.gamma_policy == GammaPolicy('running_alpha')
  assert (model.decode_config.topk, model.decode_config.temperature) == (3, 0.5)
  model = _model("config.GammaPolicy.kind = 'confidence'", 'config.GammaPolicy.threshold = 0.3',
                 'config.DecodeConfig.gamma_alpha = 0.25', "GAMMA = 'auto'")
  assert model.decode_config.gamma_policy == GammaPolicy('confidence', threshold=0.3)
  assert model.decode_config.gamma_alpha == 0.25 and model.decode_config.gamma == 'auto'
  assert model.describe()['gamma_policy']['threshold'] == 0.3
  model = _model("config.DecodeConfig.cpu_kernels = 'packed_f32'")
  assert model.decode_config.cpu_kernels == 'packed_f32'
  assert model.describe()['cpu_kernels'] == 'packed_f32'  # a run's identity (metrics.json)


_DEFAULT_MODE = '''
import json, os
from specdec_t5x.algorithm.config import DecodeConfig
first = DecodeConfig().cpu_kernels
os.environ['SPECDEC_CPU_KERNELS'] = '1'  # read once: a later change is not seen
named = DecodeConfig(cpu_kernels='packed').cpu_kernels
print('RESULT', json.dumps([first, DecodeConfig().cpu_kernels, named]))
'''


@pytest.mark.parametrize('env,mode', [('1', 'packed'), ('f32', 'packed_f32'), ('0', 'xla')])
def test_the_kernel_mode_defaults_from_the_environment_read_once(env, mode):
  assert run_child(_DEFAULT_MODE, SPECDEC_CPU_KERNELS=env) == [mode, mode, 'packed']


def test_a_bad_kernel_mode_in_the_environment_is_named():
  proc = subprocess.run([sys.executable, '-c', _DEFAULT_MODE], capture_output=True, text=True,
                        env=dict(os.environ, SPECDEC_CPU_KERNELS='fast'), timeout=300)
  assert proc.returncode != 0 and 'SPECDEC_CPU_KERNELS must be one of' in proc.stderr


def test_the_kernel_mode_keys_the_compiled_program(target_and_draft, monkeypatch):
  """Each kernel mode decodes with its own program (the memo's key holds the config), traced
  in that mode, and greedy tokens are the same in every mode."""
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  target, draft = target_and_draft
  enc = random_inputs(2, 7, 40, seed=3)
  outs = {mode: generate(target, enc, draft=draft, gamma=2, max_decode_length=6, cpu_kernels=mode)
          for mode in modes.MODES}  # the speculative program: the verify's kernels
  assert [key[-2].cpu_kernels for key in api._COMPILED] == list(modes.MODES)  # pylint: disable=protected-access
  for mode in modes.MODES:
    np.testing.assert_array_equal(outs[mode].tokens, outs['packed'].tokens)


def test_compiled_programs_are_kept_least_recently_used(target_and_draft, monkeypatch):
  """api keeps a bounded number of compiled programs (one per models, length and config)."""
  monkeypatch.setattr(programs, 'PROGRAMS_KEEP', 2)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  target, _ = target_and_draft
  enc = random_inputs(1, 5, 40, seed=1)
  for length in (3, 4, 3, 5):  # autoregressive programs: the cheapest to compile
    generate(target, enc, max_decode_length=length)
  assert [key[2] for key in api._COMPILED] == [3, 5]  # pylint: disable=protected-access
