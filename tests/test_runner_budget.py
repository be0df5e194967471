"""The runner's per-batch work outside the compiled program, counted (not timed): a warm
batch compiles nothing, runs the decode program once, and moves to the device only what
the batch is made of (its input tokens and its key)."""
import collections
import dataclasses

import jax
import numpy as np
import pytest

from specdec_t5x.algorithm import programs
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.network import T5Config, Transformer
from specdec_t5x.integration import infer_run, models

CFG = T5Config(vocab_size=48, emb_dim=16, num_heads=2, num_encoder_layers=1,
               num_decoder_layers=1, head_dim=8, mlp_dim=32, dropout_rate=0.0,
               mlp_activations=('gelu', 'linear'))
DRAFT_CFG = dataclasses.replace(CFG, emb_dim=8, num_heads=1)


class _Vocab:
  def decode(self, ids):
    return ' '.join(map(str, ids))


class _Counts:
  """XLA compiles (jax.monitoring's compile events) and decode-program calls."""

  def __init__(self, monkeypatch):
    self.events = collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: self.events.update([name]))
    call = programs.BoundProgram.__call__

    def counted(program, *args):
      self.events.update(['decode program call'])
      return call(program, *args)
    monkeypatch.setattr(programs.BoundProgram, '__call__', counted)

  def compiles(self):
    return sum(n for name, n in self.events.items() if 'compile' in name)


@pytest.mark.parametrize('speculative', [True, False])
def test_a_warm_batch_compiles_nothing_and_moves_only_its_inputs(monkeypatch, capfd,
                                                                  speculative):
  kw = dict(draft_config=DRAFT_CFG, draft_params=models.init_params(
      Transformer(DRAFT_CFG), jax.random.PRNGKey(1))) if speculative else {}
  model = models.StandaloneSpeculativeModel(
      Transformer(CFG), decode_config=DecodeConfig(gamma=3, temperature=1.0), **kw)
  params = models.init_params(Transformer(CFG), jax.random.PRNGKey(0))
  runner = infer_run.BatchRunner(model, params, None, _Vocab(), input_len=16, max_len=8,
                                 rng=jax.random.PRNGKey(0))
  rows = [{'inputs': np.arange(2, 2 + n, dtype=np.int32)} for n in (7, 4)]
  counts = _Counts(monkeypatch)
  runner.run(0, rows, {})  # compiles
  assert counts.compiles() > 0  # the counter sees compiles
  counts.events.clear()
  capfd.readouterr()
  with jax.transfer_guard_host_to_device('log_explicit'):
    lines = runner.run(1, rows[::-1], {})  # the same bucket: warm
  transfers = capfd.readouterr().err.count('host-to-device transfer')
  assert len(lines) == 2
  assert counts.compiles() == 0, dict(counts.events)
  assert counts.events['decode program call'] == 1
  # The encoder tokens and the batch's key (fold_in of its index): nothing per weight,
  # per setting or per statistic.
  assert transfers == 2, transfers


def test_numpy_params_move_to_the_device_once(capfd):
  """checkpoints.load_params gives numpy arrays: generate places them once per params tree,
  not with every call (each call would otherwise copy every weight to the device)."""
  from specdec_t5x import generate  # pylint: disable=g-import-not-at-top
  params = jax.tree_util.tree_map(
      np.asarray, models.init_params(Transformer(CFG), jax.random.PRNGKey(0)))
  tokens = np.array([[5, 6, 7, 0]], np.int32)
  key = jax.random.PRNGKey(3)
  first = generate((Transformer(CFG), params), tokens, max_decode_length=6, rng=key)
  capfd.readouterr()
  with jax.transfer_guard_host_to_device('log_explicit'):
    again = generate((Transformer(CFG), params), tokens, max_decode_length=6, rng=key)
  transfers = capfd.readouterr().err.count('host-to-device transfer')
  np.testing.assert_array_equal(first.tokens, again.tokens)
  assert transfers == 1, transfers  # the encoder tokens alone
  fresh = jax.tree_util.tree_map(np.copy, params)  # new arrays: placed again, same tokens
  np.testing.assert_array_equal(
      generate((Transformer(CFG), fresh), tokens, max_decode_length=6, rng=key).tokens,
      first.tokens)


def test_constants_first_made_inside_an_outer_trace_do_not_leak_out_of_it():
  """generate under jit (as T5X's infer calls the model) first, then eagerly with the same
  EOS id and sampling values: the constants staged into the trace are not kept for later."""
  from specdec_t5x import generate  # pylint: disable=g-import-not-at-top
  module = Transformer(CFG)
  params = models.init_params(module, jax.random.PRNGKey(0))
  tokens = np.array([[5, 6, 7, 0]], np.int32)
  # An EOS id and a temperature no other test uses: their constants are first made here.
  run = lambda enc: generate((module, params), enc, max_decode_length=5, eos_id=37,
                             temperature=0.6172, rng=jax.random.PRNGKey(1)).tokens
  traced = jax.jit(run)(tokens)
  np.testing.assert_array_equal(run(tokens), traced)


def test_numpy_params_placed_inside_an_outer_trace_do_not_leak_out_of_it():
  """Numpy params closed over by a jitted generate, then the same params eagerly."""
  from specdec_t5x import generate  # pylint: disable=g-import-not-at-top
  module = Transformer(CFG)
  params = jax.tree_util.tree_map(
      np.asarray, models.init_params(module, jax.random.PRNGKey(2)))
  tokens = np.array([[5, 6, 7, 0]], np.int32)
  run = lambda enc: generate((module, params), enc, max_decode_length=5).tokens
  traced = jax.jit(run)(tokens)
  np.testing.assert_array_equal(run(tokens), traced)
