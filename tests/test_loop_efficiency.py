"""scripts/loop_efficiency.py at tiny sizes, and research/loop_probe.py's phase accounting."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from conftest import random_inputs
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research import loop_probe, speed

REPO = pathlib.Path(__file__).resolve().parents[1]


def _script():
  spec = importlib.util.spec_from_file_location('loop_efficiency_script',
                                                REPO / 'scripts' / 'loop_efficiency.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_phases_split_each_iteration_between_the_calls():
  t = iter(range(100))
  stamp = lambda label: (label, float(next(t)))
  # Two speculative iterations (a 2-token re-feed draft call, one more draft call, verify).
  records = [stamp(l) for l in ('draft_start', 'draft_end', 'draft_start', 'draft_end',
                                'target_start', 'target_end') * 2]
  got = loop_probe.phases(records)
  assert got['iterations'] == 2 and got['accept_gaps'] == 1
  assert got['draft_calls'] == 4 and got['verify'] == 2  # 1 s per call
  assert got['draft_sampling'] == 4  # draft_end -> draft_start / target_start
  assert got['accept'] == 1 and got['span'] == 11
  ar = loop_probe.phases([stamp(l) for l in ('target_start', 'target_end') * 3])
  assert ar['iterations'] == 3 and ar['verify'] == 3 and ar['accept'] == 2
  assert ar['draft_calls'] == ar['draft_sampling'] == 0


@pytest.mark.slow  # the loop-efficiency script, run end to end
def test_tiny_run_writes_the_table_and_keeps_the_tokens(tmp_path):
  out = tmp_path / 'loop'
  # 600 iterations per ladder run (the cheapest rung runs ~10 ms): a tiny model's 16 calls
  # (~0.2 ms) are within the jitter of a 2-core machine running two test workers, and
  # their cost read as 0. Sampled (t = 1), the path with the most loop work.
  _script().main(['--tiny', '--out', str(out), '--gammas', '2', '--temperatures', '1',
                  '--repeats', '1', '--matmuls', 'packed', '--probe', '--ladder_calls', '600'])
  data = json.loads(out.with_suffix('.json').read_text())
  assert data['callback_overhead_s'] > 0
  ladder = data['matmuls']['packed']['ladder_s']
  assert set(ladder) == {'ar', 'small_g2', 'self_g2'}
  assert set(ladder['ar']) == {'alone', 'chained'} and min(ladder['ar'].values()) > 0
  for name in ('small_g2', 'self_g2'):
    assert set(ladder[name]) == {'alone', 'chained', 'interleaved'}
    assert min(ladder[name].values()) > 0
  groups = data['matmuls']['packed']['groups']
  assert [g['temperature'] for g in groups] == [1.0]
  for group in groups:
    assert group['ar_probe']['probed_tokens_equal'] == 2  # stamps change no token
    assert group['ar_loop_s'] > 0
    assert group['ar_copies']['whole_buffer'] == []
    assert {r['draft'] for r in group['rows']} == {'small', 'self'}
    for row in group['rows']:
      loop = row['probe_s']
      assert loop['probed_tokens_equal'] == 2
      assert row['loop_s'] > 0
      assert row['copies']['whole_buffer'] == []
      assert row['speedup_measured'] > 0 and row['efficiency_end_to_end'] > 0
      assert row['efficiency_chained'] > 0
      assert all(loop[p] >= 0 for p in loop_probe.PHASES) and loop['verify'] > 0
      assert loop['draft_calls'] > 0 and loop['iterations'] > 0
    self_row = next(r for r in group['rows'] if r['draft'] == 'self')
    # draft == target: q == p, so every draft is accepted (up to the last call of a row)
    assert self_row['tokens_per_target_call'] > 2.5
  md = out.with_suffix('.md').read_text()
  assert '| draft | gamma | tokens/call | measured |' in md and 'temperature 1' in md
  assert 'Target: tiny random (emb 32' in md


@pytest.mark.slow  # the loop-efficiency script, run end to end at batch 2
def test_tiny_batched_run_counts_loop_iterations(tmp_path):
  out = tmp_path / 'loop'
  _script().main(['--tiny', '--out', str(out), '--gammas', '2', '--temperatures', '0',
                  '--repeats', '1', '--matmuls', 'packed', '--ladder_calls', '600',
                  '--batch', '2'])
  data = json.loads(out.with_suffix('.json').read_text())
  ladder = data['matmuls']['packed']['ladder_s']
  assert min(v for rung in ladder.values() for v in rung.values()) > 0
  group = data['matmuls']['packed']['groups'][0]
  assert group['ar_copies']['whole_buffer'] == []
  for row in group['rows']:
    assert row['loop_s'] > 0 and row['efficiency_end_to_end'] > 0
    assert row['copies']['whole_buffer'] == []  # no cache copied whole at batch 2 either
  assert out.with_suffix('.md').read_text().count('Batch 2.') == 1
  with pytest.raises(ValueError, match='probe'):
    _script().main(['--tiny', '--out', str(out), '--batch', '2', '--probe'])


def test_batched_decoder_rows_equal_their_batch_of_one_decodes(target_and_draft):
  target, draft = target_and_draft
  enc = random_inputs(4, 9, 40, seed=3)
  config = DecodeConfig(gamma=3)
  one = speed.Decoder(target, draft, enc, 10, config)
  two = speed.Decoder(target, draft, enc, 10, config, batch=2)
  one(), two()
  for a, b in zip(one.tokens, two.tokens):
    np.testing.assert_array_equal(a, b)
  calls = np.asarray(two.stats['target_calls'])  # summed over the two batches, per row slot
  assert one.iterations == int(np.asarray(one.stats['target_calls']).sum())
  assert max(calls) <= two.iterations <= calls.sum()
  with pytest.raises(ValueError, match='batches of 3'):
    speed.Decoder(target, draft, enc, 10, config, batch=3)
