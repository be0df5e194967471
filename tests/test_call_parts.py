"""The itemization of a runner batch (research/measure/call_parts.py): its arithmetic, and
one run end to end."""
import json
import pathlib
import subprocess
import sys

import pytest

from specdec_t5x.research.measure import call_parts

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_itemize_prices_calls_and_keeps_the_nested_regions_apart():
  seconds = {'runner': 2.0, 'generate': 1.8, 'program': 1.5, 'prefill': 0.3}  # over 2 rows
  counts = {'target_calls': 10, 'drafted_tokens': 8, 'generated_tokens': 30}
  costs = {'t_verify_3': 0.05, 't_draft_step_draft': 0.01, 't_target_step': 0.04}
  row = call_parts.itemize(seconds, counts, costs, 't_verify_3', num_rows=2)
  parts = row['parts']
  assert set(parts) == set(call_parts.PARTS)
  assert parts['prefill'] == pytest.approx(0.15)
  assert parts['target_calls'] == pytest.approx(10 * 0.05 / 2)
  assert parts['draft_calls'] == pytest.approx(8 * 0.01 / 2)
  assert parts['outside_program'] == pytest.approx(0.15)
  assert parts['model_wrapper'] == pytest.approx(0.1)
  # The program is its prefill, its calls and the loop's own work; the batch is all parts.
  assert (parts['prefill'] + parts['target_calls'] + parts['draft_calls']
          + parts['loop_work']) == pytest.approx(row['program_seconds'])
  assert sum(parts.values()) == pytest.approx(row['batch_seconds'])
  # explained: what was measured alone (every part but the loop work) over the batch.
  assert row['explained'] == pytest.approx((1.0 - parts['loop_work']) / 1.0)
  assert row['tokens_per_batch'] == 15 and row['target_calls'] == 10


def test_itemize_prices_an_autoregressive_decode_with_the_one_token_step():
  seconds = {'runner': 1.0, 'generate': 0.9, 'program': 0.8, 'prefill': 0.1}
  counts = {'target_calls': 20, 'drafted_tokens': 0, 'generated_tokens': 20}
  row = call_parts.itemize(seconds, counts, {'t_target_step': 0.03}, 't_target_step', 1)
  assert row['parts']['target_calls'] == pytest.approx(0.6)
  assert row['parts']['draft_calls'] == 0
  assert row['parts']['loop_work'] == pytest.approx(0.1)


@pytest.mark.slow
def test_a_run_file_is_itemized_end_to_end(tmp_path):
  """compare_decodes.py --experiment=demo_parts over a run file (random tiny models): both
  decodes, every part, and the decodes' counts (greedy: the same tokens)."""
  out = tmp_path / 'parts'
  proc = subprocess.run(
      [sys.executable, 'scripts/compare_decodes.py', '--experiment=demo_parts',
       '--num_examples=2', '--repeats=1', '--gin_files=configs/spec_tiny_test.gin',
       '--out', str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (run,) = json.loads(out.with_suffix('.json').read_text())['files']
  assert run['gamma'] == 4 and set(run['rows']) == {'AR', 'speculative'}
  ar, spec = run['rows']['AR'], run['rows']['speculative']
  for row in (ar, spec):
    assert set(row['parts']) == set(call_parts.PARTS) and row['batch_seconds'] > 0
  assert ar['target_calls'] == ar['generated_tokens'] == spec['generated_tokens']
  assert ar['drafted_tokens'] == 0 < spec['drafted_tokens']
  assert spec['target_calls'] <= ar['target_calls']  # random drafts: rarely accepted
  assert 'configs/spec_tiny_test.gin' in out.with_suffix('.md').read_text()
