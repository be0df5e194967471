"""Greedy equivalence, known-answer stubs, and input validation for generate()."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x import generate
from specdec_t5x.algorithm.drafts import BigramDraft


def _bigram(table):
  module = BigramDraft(table.shape[0])
  return module, {'logits': jnp.asarray(table, jnp.float32)}


def _eos_mid_batch(target, enc, max_len):
  """An EOS id that ends some rows early and not others (found from the AR output; never
  the padding id 0, which fills a row after its own EOS)."""
  toks = np.asarray(generate(target, enc, max_decode_length=max_len).tokens)
  for tok in np.setdiff1d(toks[:, 1:max_len // 2], [0]):
    first = [np.argmax(r == tok) if (r == tok).any() else max_len for r in toks]
    if len(set(first)) > 1 and min(first) < max_len - 2:
      return int(tok)
  return 1


@pytest.mark.parametrize('batch', [1, 4])
def test_greedy_speculative_equals_greedy_target(target_and_draft, batch):
  target, draft = target_and_draft
  max_len = 14
  for seed in range(3):
    enc = random_inputs(batch, 9, 40, seed=seed)
    eos = _eos_mid_batch(target, enc, max_len) if batch > 1 else 1
    ar = generate(target, enc, max_decode_length=max_len, eos_id=eos)
    for gamma in (1, 3, 8):  # one draft call, the paper's size, more than most rows have room for
      sp = generate(target, enc, draft=draft, gamma=gamma, max_decode_length=max_len, eos_id=eos)
      np.testing.assert_array_equal(sp.tokens, ar.tokens, err_msg=f'gamma={gamma} seed={seed}')
      np.testing.assert_array_equal(sp.stats['generated_tokens'], ar.stats['generated_tokens'])
    if batch > 1:  # EOS really did end rows at different times, one before max_len.
      lengths = np.asarray(ar.stats['generated_tokens'])
      assert len(set(lengths.tolist())) > 1 and lengths.min() < max_len, (seed, eos, lengths)
      assert all(row[n - 1] == eos for row, n in zip(np.asarray(ar.tokens), lengths) if n < max_len)


def test_draft_equal_to_target_accepts_everything(target_and_draft):
  target, _ = target_and_draft
  enc = random_inputs(3, 9, 40, seed=4)
  for temperature in (0.0, 1.0):
    out = generate(target, enc, draft=target, gamma=4, max_decode_length=13,
                   temperature=temperature, eos_id=-1, rng=jax.random.PRNGKey(5))
    s = {k: np.asarray(v) for k, v in out.stats.items()}
    np.testing.assert_array_equal(s['accepted_tokens'], s['drafted_tokens'])
    # 13 tokens = 5 + 5 + (2 drafted near the limit + 1): three target calls.
    np.testing.assert_array_equal(s['target_calls'], [3, 3, 3])
    np.testing.assert_array_equal(s['generated_tokens'], [13, 13, 13])
    assert s['accepted_length_histogram'][4] == 6 and s['accepted_length_histogram'][2] == 3


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_always_wrong_draft_gives_one_token_per_target_call(temperature):
  vocab = 12
  rs = np.random.RandomState(0)
  # Target bigram supported on even tokens, draft on odd ones: disjoint supports.
  target_table = np.where(np.arange(vocab)[None] % 2 == 0, rs.randn(vocab, vocab), -1e9)
  draft_table = np.where(np.arange(vocab)[None] % 2 == 1, rs.randn(vocab, vocab), -1e9)
  enc = random_inputs(5, 6, vocab, seed=1)
  out = generate(_bigram(target_table), enc, draft=_bigram(draft_table), gamma=3,
                 temperature=temperature, max_decode_length=10, eos_id=-1)
  s = {k: np.asarray(v) for k, v in out.stats.items()}
  np.testing.assert_array_equal(s['target_calls'], s['generated_tokens'])
  np.testing.assert_array_equal(s['accepted_tokens'], 0)
  assert np.all(np.asarray(out.tokens) % 2 == 0)  # every token came from the target


def test_bigram_draft_with_transformer_target_is_exact_greedy(target_and_draft):
  target, _ = target_and_draft
  table = np.random.RandomState(3).randn(40, 40)
  enc = random_inputs(3, 7, 40, seed=9)
  ar = generate(target, enc, max_decode_length=11)
  sp = generate(target, enc, draft=_bigram(table), gamma=4, max_decode_length=11)
  np.testing.assert_array_equal(sp.tokens, ar.tokens)


def test_tokens_are_zero_after_eos(target_and_draft):
  target, draft = target_and_draft
  enc = random_inputs(4, 9, 40, seed=0)
  eos = _eos_mid_batch(target, enc, 14)
  out = generate(target, enc, draft=draft, gamma=3, max_decode_length=14, eos_id=eos)
  toks, n = np.asarray(out.tokens), np.asarray(out.stats['generated_tokens'])
  for row, length in zip(toks, n):
    assert np.all(row[length:] == 0)
    if length < 14:
      assert row[length - 1] == eos and eos not in row[:length - 1]


@pytest.mark.parametrize('kwargs,match', [
    (dict(gamma=0), 'gamma'),
    (dict(temperature=-0.5), 'temperature'),
    (dict(topk=3, topp=0.9, temperature=1.0), 'at most one of topk'),
    (dict(max_decode_length=0), 'max_decode_length'),
    (dict(lenience=0.0), 'lenience'),
])
def test_bad_arguments_raise_clear_errors(target_and_draft, kwargs, match):
  target, draft = target_and_draft
  args = dict(draft=draft, max_decode_length=4)
  args.update(kwargs)
  with pytest.raises(ValueError, match=f'(?i){match}'):
    generate(target, random_inputs(1, 4, 40), **args)


def test_bad_inputs_raise_clear_errors(target_and_draft):
  target, draft = target_and_draft
  with pytest.raises(ValueError, match='2-D'):
    generate(target, np.array([3, 4, 5]), draft=draft, max_decode_length=4)
  with pytest.raises(ValueError, match='integer'):
    generate(target, np.ones((1, 3), np.float32), draft=draft, max_decode_length=4)
  other_vocab = make_model(tiny_config(vocab=48), seed=2)
  with pytest.raises(ValueError, match='vocabulary sizes differ'):
    generate(target, random_inputs(1, 4, 40), draft=other_vocab, max_decode_length=4)
