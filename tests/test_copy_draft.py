"""CopyDraft (prompt lookup over the encoder input and the decoded prefix): proposes the
copied continuation, stays exact (greedy equivalence, chi-square on the full distribution)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import jit_apply, random_inputs
from specdec_t5x import generate
from specdec_t5x.algorithm import sampling
from specdec_t5x.algorithm.drafts import BigramDraft, CopyDraft

import test_distribution as td


def _greedy_next(module, params, enc, dec_inputs):
  """Argmax of the draft's logits at each decoder position (cached path, one call)."""
  variables = {'params': params}
  cache = jit_apply(module, variables, jit_apply(module, variables, enc, method='encode'),
                    enc, 16, method='init_cache')
  logits, _ = jit_apply(module, variables, cache, dec_inputs,
                        jnp.zeros((enc.shape[0],), jnp.int32), method='extend')
  return np.asarray(jnp.argmax(logits, -1)), np.asarray(jnp.max(jax.nn.softmax(logits), -1))


def test_proposes_the_copied_continuation():
  m = CopyDraft(20, max_ngram=3)
  enc = jnp.array([[5, 6, 7, 8, 9, 6, 4, 1, 0, 0]], jnp.int32)
  # Decoder inputs: BOS, 3, 5, 6 (-> 7 by the 2-gram "5 6"), 9, 6 (-> 4: "9 6" beats "6 -> 7").
  nxt, conf = _greedy_next(m, {}, enc, jnp.array([[0, 3, 5, 6, 9, 6]], jnp.int32))
  assert nxt[0, 2] == 6 and nxt[0, 3] == 7 and nxt[0, 5] == 4
  assert conf[0, 3] == 1.0  # one-hot q on a match
  assert conf[0, 1] < 0.1  # "3" occurs nowhere earlier: uniform fallback
  # A match in the decoded prefix: 11 12 13 ... 11 -> 12; padding (0) never matches.
  nxt, _ = _greedy_next(m, {}, jnp.array([[2, 0, 0, 0]], jnp.int32),
                        jnp.array([[0, 11, 12, 13, 11]], jnp.int32))
  assert nxt[0, 4] == 12


def test_fallback_draft_is_used_without_a_match():
  table = np.random.RandomState(0).randn(20, 20).astype(np.float32)
  m = CopyDraft(20, fallback=BigramDraft(20))
  params = {'fallback': {'logits': jnp.asarray(table)}}
  nxt, _ = _greedy_next(m, params, jnp.array([[5, 6, 7, 1]], jnp.int32),
                        jnp.array([[0, 3, 5]], jnp.int32))
  assert nxt[0, 1] == np.argmax(table[3]) and nxt[0, 2] == 6


@pytest.mark.parametrize('batch', [4])  # rows of different lengths; batch 1: the other drafts
def test_greedy_copy_speculative_equals_greedy_target(target_and_draft, batch):
  target, draft = target_and_draft
  drafts = {'copy': (CopyDraft(40), {}),
            'copy+model': (CopyDraft(40, max_ngram=2, fallback=draft[0]), {'fallback': draft[1]})}
  for seed in range(1):
    enc = random_inputs(batch, 9, 40, seed=seed)
    ar = generate(target, enc, max_decode_length=14, eos_id=-1)
    for name, d in drafts.items():
      for gamma in (1, 4):
        sp = generate(target, enc, draft=d, gamma=gamma, max_decode_length=14, eos_id=-1)
        np.testing.assert_array_equal(sp.tokens, ar.tokens, err_msg=f'{name} gamma={gamma}')


def test_copy_draft_accepts_when_the_target_copies():
  """A bigram target that copies its input (x -> x+1 chain) is predicted by the copy draft."""
  vocab = 16
  table = np.full((vocab, vocab), -5.0, np.float32)
  for v in range(vocab):
    table[v, (v + 1) % vocab] = 5.0
  enc = np.array([[3, 4, 5, 6, 7, 8, 9, 10]], np.int32)
  target = (BigramDraft(vocab), {'logits': jnp.asarray(table)})
  out = generate(target, enc, draft=(CopyDraft(vocab), {}), gamma=4, max_decode_length=12,
                 eos_id=-1)
  s = {k: np.asarray(v) for k, v in out.stats.items()}
  # After the first (unmatched) tokens, the chain 1,2,3,... is copied from the input.
  assert s['accepted_tokens'][0] >= 4 and s['target_calls'][0] < 12


@pytest.mark.parametrize('fallback', ['uniform', 'bigram'])
def test_copy_draft_is_exact(fallback):
  target = td.make_model(td.tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)
  if fallback == 'uniform':
    draft = (CopyDraft(td.VOCAB, max_ngram=2), {})
  else:
    table = jnp.asarray(np.random.RandomState(1).randn(td.VOCAB, td.VOCAB), jnp.float32)
    draft = (CopyDraft(td.VOCAB, max_ngram=2, fallback=BigramDraft(td.VOCAB)),
             {'fallback': {'logits': table}})
  cfg = sampling.SamplingConfig(1.0)
  exact = td.exact_probabilities(target, td.ENC, cfg)
  counts = td.sample_counts(target, draft, td.ENC, cfg, seed=7, gamma=3)  # every branch hit
  assert td.chi2_pvalue(exact, counts) > 1e-3
