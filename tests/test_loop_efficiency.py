"""compare_decodes.py --experiment=loop_efficiency (research/measure/loop_efficiency.py) at
tiny sizes, research/measure/loop_profile.py's attribution,
and the timing grid's row decoders and rows (research/measure/grid.py).

The script's greedy decodes are checked against research/measure/reference.py's T5X-style greedy
loop (written apart from generate()), and its loop iterations against target calls
counted from those tokens alone."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import load_script, random_inputs
from specdec_t5x.algorithm import api
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import grid, loop_profile, reference


_PROGRAM = '''
%body (p: (s32[], f32[1,8])) -> (s32[], f32[1,8]) {
  %p = (s32[], f32[1,8]{1,0}) parameter(0)
  %x = f32[1,8]{1,0} get-tuple-element(%p), index=1
  %custom-call.1 = f32[1,8]{1,0} custom-call(%x), custom_call_target="mm", metadata={op_name="jit(run)/while/body/target_call/Transformer.extend/dense"}
  %dot.2 = f32[1,8]{1,0} dot(%custom-call.1, %x), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  %fusion.3 = f32[1,8]{1,0} fusion(%x), kind=kLoop, calls=%fused, metadata={op_name="jit(run)/while/body/draft_call/Transformer.extend/mul"}
  %reduce.4 = f32[1]{0} reduce(%dot.2, %fusion.3), dimensions={1}, to_apply=%add, metadata={op_name="jit(run)/while/body/reduce_max"}
  %copy.5 = f32[1,8]{1,0} copy(%x)
  ROOT %tuple.6 = (s32[], f32[1,8]{1,0}) tuple(%p, %copy.5)
}

%fused (y: f32[1,8]) -> f32[1,8] {
  %y = f32[1,8]{1,0} parameter(0)
  ROOT %mul.7 = f32[1,8]{1,0} multiply(%y, %y)
}

ENTRY %main (a: f32[1,8]) -> f32[1,8] {
  %a = f32[1,8]{1,0} parameter(0)
  %fusion.8 = f32[1,8]{1,0} fusion(%a), kind=kLoop, calls=%fused, metadata={op_name="jit(run)/Transformer.encode/mul"}
  %while.9 = (s32[], f32[1,8]{1,0}) while(%t), condition=%cond, body=%body
}
'''


def _record_decoders(monkeypatch):
  """The list every grid.Decoder the script makes joins (its tokens and iterations are
  read after the run)."""
  made = []

  class Recorded(grid.Decoder):
    def __post_init__(self):
      super().__post_init__()
      made.append(self)
  monkeypatch.setattr(grid, 'Decoder', Recorded)
  return made


def _greedy(dec):
  """The target's greedy tokens [N, max_len] for the decoder's rows (zeros after EOS),
  from reference.py's one-token loop."""
  module, params = dec.target
  return np.asarray(jax.jit(reference.greedy_decode, static_argnums=(0, 3, 4))(
      module.config, params, jnp.asarray(dec.enc), dec.max_len, dec.eos_id))


def _lengths(tokens, eos_id):
  """Generated tokens per row, EOS included."""
  return [int(np.argmax(r == eos_id)) + 1 if (r == eos_id).any() else len(r) for r in tokens]


def _target_calls(dec, greedy):
  """Target calls per row of a greedy decode, counted from the tokens: one per token
  without a draft; with one, each step keeps the draft's next tokens while they are the
  target's (the draft teacher forced on the target's tokens, at most gamma) plus one."""
  lengths = _lengths(greedy, dec.eos_id)
  if dec.draft is None:
    return lengths
  module, params = dec.draft
  dec_in = np.pad(greedy[:, :-1], ((0, 0), (1, 0)))
  guess = np.asarray(module.apply({'params': params}, jnp.asarray(dec.enc), dec_in)).argmax(-1)
  calls = []
  for y, d, n in zip(greedy, guess, lengths):
    done = steps = 0
    while done < n:
      run = 0
      while run < min(dec.config.gamma, n - done) and d[done + run] == y[done + run]:
        run += 1
      done, steps = done + run + 1, steps + 1
    calls.append(steps)
  return calls


def _name(dec):
  """The script's name of the decoder's draft ('ar' without one)."""
  if dec.draft is None:
    return 'ar'
  if dec.draft is dec.target:
    return 'self'
  return 'head' if api.reads_features(dec.draft[0]) else 'small'


def _check_greedy_decoder(dec):
  """The decoder's tokens are the reference's greedy tokens, and its target calls per row
  and loop iterations (a batch's loop runs until its last row is done) those counted from
  them. Returns (tokens, target calls, loop iterations) as counted."""
  greedy = _greedy(dec)
  lengths = _lengths(greedy, dec.eos_id)
  assert len(dec.tokens) == len(greedy)
  for got, want, n in zip(dec.tokens, greedy, lengths):
    np.testing.assert_array_equal(got, want[:n])
  calls = np.asarray(_target_calls(dec, greedy)).reshape(-1, dec.batch)
  np.testing.assert_array_equal(np.asarray(dec.stats['target_calls']), calls.sum(0))
  iterations = int(calls.max(1).sum())
  assert dec.iterations == iterations
  return sum(lengths), int(calls.sum()), iterations


def test_profile_categories_follow_the_named_model_calls():
  cat, opcode, op_name = loop_profile.categories(_PROGRAM)
  assert cat['custom-call.1'] == 'target_calls' and cat['fusion.3'] == 'draft_calls'
  assert cat['dot.2'] == 'target_calls'  # no metadata: its operand's model call
  assert cat['reduce.4'] == 'loop_work' and cat['copy.5'] == 'loop_work'
  assert cat['fusion.8'] == 'outside' and cat['while.9'] == 'outside'
  assert cat['mul.7'] == 'loop_work'  # inside a fusion the loop calls (never a thunk itself)
  assert opcode['while.9'] == 'while' and opcode['tuple.6'] == 'tuple'
  assert op_name['reduce.4'].endswith('/reduce_max') and 'dot.2' not in op_name


@pytest.mark.slow  # the loop-efficiency script, run end to end
@pytest.mark.timing
def test_tiny_run_writes_the_table_and_keeps_the_tokens(tmp_path, monkeypatch):
  out = tmp_path / 'loop'
  decoders = _record_decoders(monkeypatch)
  # 600 iterations per ladder run (the cheapest rung runs ~10 ms): a tiny model's 16 calls
  # (~0.2 ms) are within the jitter of a 2-core machine running two test workers, and
  # their cost read as 0. Sampled (t = 1), the path with the most loop work; greedy
  # (t = 0), whose tokens are known.
  load_script('compare_decodes').main(['--experiment=loop_efficiency', '--tiny', '--out',
                                       str(out), '--gammas', '2', '--temperatures', '0,1',
                                       '--repeats', '1', '--matmuls', 'packed',
                                       '--ladder_calls', '600'])
  greedy = [d for d in decoders if d.config.temperature == 0]
  assert sorted(_name(d) for d in greedy) == ['ar', 'self', 'small']
  for dec in greedy:  # AR and both drafts: the target's greedy tokens, row by row
    _check_greedy_decoder(dec)
  data = json.loads(out.with_suffix('.json').read_text())
  ladder = data['matmuls']['packed']['ladder_s']
  assert set(ladder) == {'ar', 'small_g2', 'self_g2'}
  assert set(ladder['ar']) == {'alone', 'chained'} and min(ladder['ar'].values()) > 0
  for name in ('small_g2', 'self_g2'):
    assert set(ladder[name]) == {'alone', 'chained', 'interleaved'}
    assert min(ladder[name].values()) > 0
  groups = data['matmuls']['packed']['groups']
  assert [g['temperature'] for g in groups] == [0.0, 1.0]
  for group in groups:
    ar = group['ar_profile']
    assert ar['per_iteration_s']['target_calls'] > 0 and ar['iterations'] > 0
    assert ar['per_iteration_s']['draft_calls'] == 0  # no draft: none of its time
    assert group['ar_loop_s'] > 0
    assert group['ar_copies']['whole_buffer'] == []
    assert {r['draft'] for r in group['rows']} == {'small', 'self'}
    for row in group['rows']:
      part = row['profile']['per_iteration_s']
      assert row['loop_s'] > 0
      assert row['copies']['whole_buffer'] == []
      assert row['speedup_measured'] > 0 and row['efficiency_end_to_end'] > 0
      assert row['efficiency_as_made'] > 0
      assert part['target_calls'] > 0 and part['draft_calls'] > 0 and part['loop_work'] > 0
      # The profiled parts account for the loop (their sum is at least half its unprofiled
      # time; at most a few times it, as the markers weigh on a tiny model's instructions).
      # On the sampled group, the one run before the greedy group joined for its tokens: a
      # ratio of millisecond timings per group is one more draw of the machine's noise.
      if group['temperature'] == 1:
        assert 0.5 < sum(part.values()) / row['loop_s'] < 5.0, (part, row['loop_s'])
      assert row['profile']['top_loop_work'] and row['profile']['outside_s'] > 0
    self_row = next(r for r in group['rows'] if r['draft'] == 'self')
    # draft == target: q == p, so every draft is accepted (up to the last call of a row)
    assert self_row['tokens_per_target_call'] > 2.5
  md = out.with_suffix('.md').read_text()
  assert '| draft | gamma | tokens/call | measured |' in md and 'temperature 1' in md
  assert 'Target: tiny random (emb 32' in md and 'from XLA\'s profiler' in md


@pytest.mark.slow  # the loop-efficiency script, run end to end at batch 2
@pytest.mark.timing
def test_tiny_batched_run_counts_loop_iterations(tmp_path, monkeypatch):
  out = tmp_path / 'loop'
  decoders = _record_decoders(monkeypatch)
  load_script('compare_decodes').main(['--experiment=loop_efficiency', '--tiny', '--out',
                                       str(out), '--gammas', '2', '--temperatures', '0',
                                       '--repeats', '1', '--matmuls', 'packed',
                                       '--ladder_calls', '600', '--batch', '2'])
  data = json.loads(out.with_suffix('.json').read_text())
  ladder = data['matmuls']['packed']['ladder_s']
  assert min(v for rung in ladder.values() for v in rung.values()) > 0
  group = data['matmuls']['packed']['groups'][0]
  assert group['ar_copies']['whole_buffer'] == []
  # Iterations and calls counted from the greedy tokens: the decoders' (the loop's time
  # per iteration divides by them) and the profiled runs' (loop_profile counts its own).
  assert sorted(_name(d) for d in decoders) == ['ar', 'self', 'small']
  assert all(d.batch == 2 for d in decoders)
  counted = {_name(d): _check_greedy_decoder(d) for d in decoders}
  assert group['ar_profile']['iterations'] == counted['ar'][2]
  assert {r['draft'] for r in group['rows']} == {'small', 'self'}
  for row in group['rows']:
    tokens, calls, iterations = counted[row['draft']]
    assert row['profile']['iterations'] == iterations
    assert row['tokens_per_target_call'] == pytest.approx(tokens / calls)
    assert row['loop_s'] > 0 and row['efficiency_end_to_end'] > 0
    assert row['copies']['whole_buffer'] == []  # no cache copied whole at batch 2 either
    assert row['profile']['per_iteration_s']['draft_calls'] > 0
  assert out.with_suffix('.md').read_text().count('Batch 2.') == 1


def test_batched_decoder_rows_equal_their_batch_of_one_decodes(target_and_draft):
  target, draft = target_and_draft
  enc = random_inputs(4, 9, 40, seed=3)
  config = DecodeConfig(gamma=3)
  one = grid.Decoder(target, draft, enc, 10, config)
  two = grid.Decoder(target, draft, enc, 10, config, batch=2)
  one(), two()
  for a, b in zip(one.tokens, two.tokens):
    np.testing.assert_array_equal(a, b)
  calls = np.asarray(two.stats['target_calls'])  # summed over the two batches, per row slot
  assert one.iterations == int(np.asarray(one.stats['target_calls']).sum())
  assert max(calls) <= two.iterations <= calls.sum()
  with pytest.raises(ValueError, match='batches of 3'):
    grid.Decoder(target, draft, enc, 10, config, batch=3)


def test_grid_rows_hold_each_decodes_median_tokens_per_call_and_speedup(target_and_draft):
  """grid.time_grid: AR and every (draft, gamma) timed interleaved; each row's median
  seconds, tokens per target call and per-token speedup are those of its timings and
  decoder, and the speedup's interval comes from the repeats' pairs."""
  target, draft = target_and_draft
  timed = grid.time_grid(target, {'d': draft}, random_inputs(2, 9, 40, seed=4), 8, [1, 2],
                         repeats=2)
  assert list(timed.timings.seconds) == ['ar', 'd_g1', 'd_g2']
  assert all(len(s) == 2 for s in timed.timings.seconds.values())
  for row in timed.rows():
    dec = timed.decoders[('d', row['gamma'])]
    assert row['seconds'] == timed.median[grid.key('d', row['gamma'])]
    assert row['tokens_per_target_call'] == dec.generated_tokens / float(
        dec.stats['target_calls'].sum())
    assert row['speedup'] == pytest.approx(
        timed.median['ar'] / timed.ar.generated_tokens / (row['seconds'] / dec.generated_tokens))
    lo, hi = row['speedup_ci95']
    assert lo <= hi


@pytest.mark.slow  # the loop-efficiency script, run end to end with a feature head
@pytest.mark.timing
def test_tiny_feature_head_runs_every_part_in_float32_and_bfloat16(tmp_path, monkeypatch):
  """The demo's setting at tiny sizes: a feature head (--drafts head) at gamma 1, with the
  float32 packed kernels and with 'packed_bf16' (target and head computing in bfloat16).
  Every part of the audit covers the head: its costs (the re-feed of the verify window),
  the ladder's rungs (fed the target's features), the profile's draft calls and the copies;
  each row's efficiency comes with its 95% interval, rendered."""
  out = tmp_path / 'loop'
  decoders = _record_decoders(monkeypatch)
  load_script('compare_decodes').main(['--experiment=loop_efficiency', '--tiny', '--out',
                                       str(out), '--gammas', '1', '--temperatures', '0',
                                       '--repeats', '2', '--matmuls', 'packed,packed_bf16',
                                       '--drafts', 'head,self', '--ladder_calls', '300'])
  data = json.loads(out.with_suffix('.json').read_text())
  assert data['drafts'] == ['head', 'self'] and list(data['matmuls']) == ['packed', 'packed_bf16']
  by_dtype = {}
  for dec in decoders:
    by_dtype.setdefault(str(np.dtype(dec.target[0].config.dtype)), []).append(dec)
    if dec.draft is not None and dec.draft is not dec.target:
      assert dec.draft[0].config.dtype == dec.target[0].config.dtype  # head as the target
  assert sorted(_name(d) for d in by_dtype['float32']) == ['ar', 'head', 'self']
  assert sorted(_name(d) for d in by_dtype['bfloat16']) == ['ar', 'head', 'self']
  greedy = _greedy(by_dtype['float32'][0])  # float32: every decode the target's greedy tokens
  for dec in by_dtype['float32']:
    n = _lengths(greedy, dec.eos_id)
    for got, want, k in zip(dec.tokens, greedy, n):
      np.testing.assert_array_equal(got, want[:k])
  for matmul, res in data['matmuls'].items():
    assert res['costs_s']['t_draft_refeed_head_g1'] > 0  # the head's 2-position re-feed
    assert res['costs_s']['t_draft_step_head'] > 0
    ladder = res['ladder_s']['head_g1']
    assert set(ladder) == {'alone', 'chained', 'interleaved'} and min(ladder.values()) > 0
    row = next(r for r in res['groups'][0]['rows'] if r['draft'] == 'head')
    assert row['profile']['per_iteration_s']['draft_calls'] > 0, matmul
    assert row['copies']['whole_buffer'] == [] and row['loop_s'] > 0
    for name in ('efficiency_end_to_end', 'efficiency_as_made'):
      lo, hi = row[f'{name}_ci95']
      assert 0 < lo <= hi
      assert row[f'{name}_ci95'] == pytest.approx(
          [x / (row['speedup_measured'] / row[name]) for x in row['speedup_measured_ci95']])
  md = out.with_suffix('.md').read_text()
  assert '## packed_bf16 (target and drafts in bfloat16)' in md and '| head | 1 |' in md
  eff = next(r for r in data['matmuls']['packed']['groups'][0]['rows'] if r['draft'] == 'head')
  lo, hi = eff['efficiency_end_to_end_ci95']
  assert f'{eff["efficiency_end_to_end"]:.2f} ({lo:.2f}-{hi:.2f})' in md
