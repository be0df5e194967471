"""compare_decodes.py's decode comparisons (research/measure/compare.py): the decode-spec
grammar, the result rows against independent counts, and the script end to end on the demo
checkpoints."""

import json

import numpy as np
import pytest

from conftest import load_script, random_inputs
from specdec_t5x.algorithm import api
from specdec_t5x.algorithm.config import DecodeConfig, GammaPolicy
from specdec_t5x.research import experiments as registry
from specdec_t5x.research.measure import compare as experiments, grid
from specdec_t5x.research.results import harness

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path


@pytest.mark.parametrize('spec, settings, draft', [
    ('g3', dict(gamma=3), 'demo_draft_m'),
    ('g2+c3+s2.1', dict(gamma=2, copy_branch=3, draft_siblings=(2, 1)), 'demo_draft_m'),
    ('g4+block@bigram', dict(gamma=4, verifier='block'), 'bigram'),
    ('g6+conf0.3', dict(gamma=6, gamma_policy=GammaPolicy('confidence', threshold=0.3)),
     'demo_draft_m'),
    ('g4+conf@copy', dict(gamma=4, gamma_policy=GammaPolicy('confidence')), 'copy'),
    ('g6+ra0.2@copy:bigram',
     dict(gamma=6, gamma_policy=GammaPolicy('running_alpha', cost_ratio=0.2)), 'copy:bigram'),
    ('g4+l0.5', dict(gamma=4, lenience=0.5), 'demo_draft_m'),
    ('g3+w2@demo_draft_s', dict(gamma=3, draft_tree_width=2), 'demo_draft_s'),
    ('g3+w2+n3', dict(gamma=3, draft_tree_width=2, draft_tree_nodes=3), 'demo_draft_m'),
    ('g3+w2s', dict(gamma=3, draft_tree_width=2, draft_tree_sampled=True), 'demo_draft_m'),
    ('g7+w4+n11+c4', dict(gamma=7, draft_tree_width=4, draft_tree_nodes=11, copy_branch=4),
     'demo_draft_m'),
])
def test_a_spec_names_its_settings_and_draft(spec, settings, draft):
  assert experiments.parse_decode(spec) == (settings, draft)
  assert experiments.is_chain(spec) == (spec == 'g3')


@pytest.mark.parametrize('spec, says', [
    ('4', 'a decode is g<gamma>'), ('g2@', 'a decode is g<gamma>'),
    ('g2+x1', "unknown part 'x1'"), ('g2+c1+c2', 'twice'),
    ('g2+conf0.5+ra0.2', 'twice'),
    ('g2+s1+block', 'block'),  # DecodeConfig refuses siblings with the block verifier
    ('g2+w2+s1', 'draft_tree_width'),  # the draft's own tree holds its runner-ups
    ('g2+w2+n5', 'draft_tree_nodes'),  # more than the 4 grown
    ('g2+w2s+n3', 'draft_tree_sampled'),  # drawn levels are verified whole
    ('g0', 'gamma'),
])
def test_a_bad_spec_is_refused_with_its_reason(spec, says):
  with pytest.raises(ValueError, match=says):
    experiments.parse_decode(spec)


def test_every_preset_parses_and_names_a_chain_to_compare_with():
  for name, exp in registry.PRESETS.items():
    specs = exp.decodes.split(',')
    for spec in specs:
      experiments.parse_decode(spec)
    assert any(experiments.is_chain(s) for s in specs), name
    assert exp.precise % 16 == 0, name


def _timings(target, draft, enc, decodes, temperature=0.0, batch=1):
  fns = {experiments.BASE: grid.Decoder(target, None, enc, 10,
                                         DecodeConfig(temperature=temperature), batch=batch)}
  for spec in decodes:
    settings, _ = experiments.parse_decode(spec)
    fns[spec] = grid.Decoder(target, draft, enc, 10,
                              DecodeConfig(temperature=temperature, **settings), batch=batch)
  return harness.interleaved(fns, 1)


def test_result_rows_count_what_the_decodes_did(target_and_draft):
  target, draft = target_and_draft
  enc = random_inputs(3, 6, 40, seed=4)
  rows = experiments.rows_of(_timings(target, draft, enc, ['g2', 'g3', 'g2+s1']), 'x', 0.0)
  by = {r['decode']: r for r in rows}
  assert list(by) == ['AR', 'g2', 'g3', 'g2+s1']
  for spec in ('g2', 'g3', 'g2+s1'):  # an independent count: each row decoded alone again
    config = DecodeConfig(**experiments.parse_decode(spec)[0])
    outs = [api.generate(target, enc[i:i + 1], draft=draft, config=config,
                         max_decode_length=10) for i in range(3)]
    calls = sum(int(o.stats['target_calls'][0]) for o in outs)
    gen = sum(int(o.stats['generated_tokens'][0]) for o in outs)
    accepted = sum(int(o.stats['accepted_tokens'][0]) for o in outs)
    r = by[spec]
    assert (r['target_calls'], r['generated_tokens'], r['accepted_tokens']) == (
        calls, gen, accepted)
    assert r['mean_tokens_per_target_call'] == gen / calls
    assert sum(r['accepted_by_source'].values()) == accepted
    assert r['equal_to_ar'] is True  # greedy: exact
    assert r['verified_positions'] == 1 + config.tree_nodes
  assert by['g2+s1']['verified_positions'] == 4 and by['AR']['draft_calls'] == 0
  fastest_chain = min(by['g2']['seconds'], by['g3']['seconds'])
  for r in rows:
    assert r['speedup_vs_best_chain'] == pytest.approx(fastest_chain / r['seconds'])
    assert r['speedup_vs_ar'] == pytest.approx(by['AR']['seconds'] / r['seconds'])


def test_a_batched_row_counts_every_row_of_the_batch(target_and_draft):
  target, draft = target_and_draft
  enc = random_inputs(4, 6, 40, seed=5)
  timings = _timings(target, draft, enc, ['g3+l0.2'], temperature=1.0, batch=4)
  rows = experiments.rows_of(timings, 'x', 1.0)
  lossy = rows[1]
  assert lossy['lossy'] is True and rows[0]['lossy'] is False
  per_row = np.asarray(timings.outputs['g3+l0.2'][0].stats['generated_tokens'])
  assert per_row.shape == (4,) and lossy['generated_tokens'] == int(per_row.sum())
  assert lossy['speedup_vs_best_chain'] is None  # no plain chain in this comparison


def test_the_script_writes_a_named_experiment(tmp_path, capsys):
  script = load_script('compare_decodes')
  out = tmp_path / 'tree'
  script.main(['--experiment=tree', '--tasks=ende', '--rows=1', '--max_len=8',
               '--temperatures=0', '--decodes=g2,g2+s1,g2+c2@copy:bigram', '--out', str(out)])
  data = json.loads(out.with_suffix('.json').read_text())
  assert data['command'].startswith('python scripts/compare_decodes.py --experiment=tree')
  assert data['settings']['decodes'] == 'g2,g2+s1,g2+c2@copy:bigram'
  assert data['settings']['repeats'] == registry.PRESETS['tree'].repeats
  assert [r['decode'] for r in data['results']] == ['AR', 'g2', 'g2+s1', 'g2+c2@copy:bigram']
  assert all(r['equal_to_ar'] for r in data['results'])
  assert '| ende | 0 | g2+s1 | 4 |' in out.with_suffix('.md').read_text()
  with pytest.raises(SystemExit):
    script.main(['--experiment=tree', '--decodes=g2+q'])
  assert "unknown part 'q'" in capsys.readouterr().err


class _Recorded(grid.Decoder):
  """A Decoder whose runs return fixed counts and record their seeds (no model)."""
  seeds = []  # of every run, in order

  def __call__(self):
    _Recorded.seeds.append(self.seed)
    stats = {'generated_tokens': np.array([6, 4 + self.seed // 1000]),
             'target_calls': np.array([3, 2])}
    return [type('Out', (), {'stats': stats})()]


@pytest.mark.parametrize('temperature, seeds, expected', [(0.0, [0], [2.0, 2.0]),
                                                           (1.0, [0, 1000, 2000],
                                                            [2.0, 2.0, 2.0, 2.5, 2.0, 3.0])])
def test_precise_tokens_per_call_runs_a_greedy_decoder_once(temperature, seeds, expected):
  """Per-row tokens per call over the seeds' runs, mean and standard error; greedy rows do
  not depend on the rng, so a greedy decoder runs once."""
  _Recorded.seeds = []
  decoder = _Recorded(None, None, np.ones((2, 3), np.int32), 8,
                      DecodeConfig(gamma=2, temperature=temperature))
  mean, stderr = experiments.precise_tokens_per_call(decoder, seeds=3)
  assert _Recorded.seeds == seeds
  assert mean == pytest.approx(np.mean(expected))
  assert stderr == pytest.approx(np.std(expected, ddof=1) / np.sqrt(len(expected)))
