"""Speculative sampling reproduces the target's exact sequence distribution.

With a 4-token vocabulary and up to 5 output tokens every output sequence (364 of them)
can be enumerated, and its exact probability under the standardised target computed by
teacher forcing. Thousands of independent batch rows (one call) are then compared by
chi-square. Five tokens take several speculative steps per sequence at gamma 2-3, so
every branch of the acceptance rule is exercised: the first draft rejected, a later one
rejected (a rollback), every draft accepted (the bonus token, and the next step's catch-up);
`sample_counts` requires each at least MIN_BRANCH times and reports the counts (pytest's
summary lists them per test).
"""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from conftest import jit_apply, make_model, tiny_config
from specdec_t5x import generate
from specdec_t5x.algorithm import api, sampling
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm import drafts

VOCAB, EOS, MAX_LEN, ROWS = 4, 1, 5, 20000
MIN_BRANCH = 100  # steps each branch of the rule must take in a speculative sample
BRANCHES = ('first draft rejected', 'later draft rejected', 'all accepted')
BRANCH_LOG = []  # per sample: {branch: steps}; conftest adds them to the test's report


@pytest.fixture(scope='module')
def models():
  target = make_model(tiny_config(vocab=VOCAB), seed=10, logit_scale=1.5)
  draft = make_model(tiny_config(vocab=VOCAB, emb=16, layers=1), seed=11, logit_scale=1.5)
  rs = np.random.RandomState(1)
  seqs = [list(rs.randint(1, VOCAB, size=rs.randint(1, 5))) for _ in range(50)]
  ngrams = {
      'bigram': (drafts.BigramDraft(VOCAB), {'logits': jnp.asarray(rs.randn(VOCAB, VOCAB))}),
      'sparse_bigram': (drafts.SparseBigramDraft(VOCAB, topk=2),
                        drafts.sparse_bigram(seqs, VOCAB, topk=2)),
      'unigram': (drafts.UnigramDraft(VOCAB),
                  {'logits': drafts.ngram_log_probs(seqs, VOCAB, 1)}),
  }
  return target, draft, ngrams


def _all_sequences():
  """Every possible output [MAX_LEN] (zeros after EOS) with its length."""
  seqs = []
  for length in range(1, MAX_LEN + 1):
    for toks in itertools.product(range(VOCAB), repeat=length):
      if EOS in toks[:-1] or (length < MAX_LEN and toks[-1] != EOS):
        continue
      seqs.append((toks + (0,) * (MAX_LEN - length), length))
  return seqs


def exact_probabilities(target, enc, cfg):
  """{sequence tuple: probability} under the standardised target, by teacher forcing: one
  compiled pass per model, computed once per (params, input, sampling) and shared by the
  tests that read the same law (a broken-rule control and its valid twin, several files)."""
  module, params = target
  enc = np.asarray(enc, np.int32)
  key = (module, id(params), enc.shape, enc.tobytes(), cfg, sampling.standardize)
  if key not in _LAWS:  # the entry keeps params alive, so their id is not reused meanwhile
    _LAWS[key] = (params, _exact_law(module, params, enc, cfg))
  return dict(_LAWS[key][1])


_LAWS = {}


def _exact_law(module, params, enc, cfg):
  seqs = _all_sequences()
  y = np.array([s for s, _ in seqs], np.int32)  # [n, MAX_LEN]
  dec_in = np.concatenate([np.zeros((len(y), 1), np.int32), y[:, :-1]], 1)
  logits = jit_apply(module, {'params': params}, np.repeat(enc, len(y), 0), dec_in)
  probs = np.asarray(jax.jit(sampling.standardize, static_argnums=1)(logits, cfg),
                     np.float64)  # [n, MAX_LEN, V]
  step = np.take_along_axis(probs, y[..., None], -1)[..., 0]
  lengths = np.array([n for _, n in seqs])
  step = np.where(np.arange(MAX_LEN)[None] < lengths[:, None], step, 1.0)
  return {tuple(s): p for (s, _), p in zip(seqs, step.prod(1))}


def sample_counts(target, draft, enc, cfg, seed, gamma=2, verifier='token', rows=ROWS,
                  sources=(), **settings):
  """{sequence: count} of `rows` decodes of each row of enc [n, L] (np.repeat: rows of one
  input are adjacent), sampled as `cfg` says; more DecodeConfig fields in `settings`. With a
  draft, each branch of the acceptance rule must occur MIN_BRANCH times, and each of
  `sources` (stats.SOURCES names) must supply MIN_BRANCH accepted tokens (logged)."""
  out = generate(target, np.repeat(enc, rows, 0), draft=draft, gamma=gamma, verifier=verifier,
                 temperature=cfg.temperature, topk=cfg.topk, topp=cfg.topp,
                 max_decode_length=MAX_LEN, eos_id=EOS, rng=jax.random.PRNGKey(seed),
                 **settings)
  if draft is not None:
    require_branches(out.stats, sources)
  return counts_of(out.tokens)


def counts_of(tokens):
  """{sequence tuple: count} of decoded tokens [n, MAX_LEN]."""
  seqs, counts = np.unique(np.asarray(tokens), axis=0, return_counts=True)
  return {tuple(s): c for s, c in zip(seqs.tolist(), counts)}


def require_branches(stats, sources=()):
  """Logs a speculative sample's step outcomes and requires MIN_BRANCH of each branch, and
  MIN_BRANCH accepted tokens from each of `sources` (a draft tree's kinds of node: logged
  with the accepted tokens of every source)."""
  hits = dict(zip(BRANCHES, np.asarray(stats['step_outcomes']).tolist()))
  supplied = dict(zip(stats_lib.SOURCES, np.asarray(stats['accepted_by_source']).tolist()))
  BRANCH_LOG.append(dict(hits, **{f'accepted from {k}': supplied[k] for k in sources}))
  assert min(hits.values()) >= MIN_BRANCH, f'a branch of the rule is barely exercised: {hits}'
  assert all(supplied[k] >= MIN_BRANCH for k in sources), (
      f'a kind of tree node is barely accepted: {supplied}')



def chi2_pvalue(exact, counts):
  """Goodness of fit; cells with expected count < 5 are pooled into one."""
  n = sum(counts.values())
  assert set(counts) <= {k for k, p in exact.items() if p > 0}, 'impossible sequence sampled'
  obs, exp, pool_o, pool_e = [], [], 0, 0.0
  for seq, p in exact.items():
    if p * n >= 5:
      obs.append(counts.get(seq, 0)); exp.append(p * n)
    else:
      pool_o += counts.get(seq, 0); pool_e += p * n
  if pool_e > 0:
    obs.append(pool_o); exp.append(pool_e)
  exp = np.array(exp) * n / np.sum(exp)
  return stats.chisquare(obs, exp).pvalue


ENC = np.array([[2, 3, 3, 2, 3]], np.int32)
CASES = [sampling.SamplingConfig(1.0), sampling.SamplingConfig(0.6),
         sampling.SamplingConfig(1.0, topk=3), sampling.SamplingConfig(0.8, topp=0.7)]


@pytest.mark.parametrize('cfg', CASES, ids=['t1', 't0.6', 'topk3', 'topp0.7'])
def test_speculative_matches_exact_target_distribution(models, cfg):
  target, draft, _ = models
  exact = exact_probabilities(target, ENC, cfg)
  assert abs(sum(exact.values()) - 1) < 1e-5
  pvalue = chi2_pvalue(exact, sample_counts(target, draft, ENC, cfg, seed=1))
  assert pvalue > 1e-3, pvalue


@pytest.mark.parametrize('cfg', [CASES[0], CASES[2]], ids=['t1', 'topk3'])
def test_block_verification_matches_exact_target_distribution(models, cfg):
  target, draft, _ = models
  exact = exact_probabilities(target, ENC, cfg)
  counts = sample_counts(target, draft, ENC, cfg, seed=6, gamma=3, verifier='block')
  assert chi2_pvalue(exact, counts) > 1e-3


@pytest.mark.parametrize('name', ['bigram', 'sparse_bigram', 'unigram'])
def test_ngram_drafts_are_exact(models, name):
  target, _, ngrams = models
  cfg = sampling.SamplingConfig(1.0)
  exact = exact_probabilities(target, ENC, cfg)
  assert chi2_pvalue(exact, sample_counts(target, ngrams[name], ENC, cfg, seed=2, gamma=3)) > 1e-3


@pytest.mark.parametrize('verifier', ['token', 'block'])
def test_rows_of_different_inputs_each_follow_their_own_law(models, verifier):
  """One batch of two inputs of different lengths, the rows of each adjacent: each input's
  rows follow its own exact law (rows share the loop, never their randomness or caches)."""
  target, draft, _ = models
  cfg = sampling.SamplingConfig(1.0)
  enc = np.array([[2, 3, 3, 2, 3], [3, 2, 0, 0, 0]], np.int32)
  half = ROWS // 2
  out = generate(target, np.repeat(enc, half, 0), draft=draft, gamma=3, verifier=verifier,
                 temperature=1.0, max_decode_length=MAX_LEN, eos_id=EOS,
                 rng=jax.random.PRNGKey(12))
  require_branches(out.stats)
  tokens = np.asarray(out.tokens)
  for i in range(2):
    exact = exact_probabilities(target, enc[i:i + 1], cfg)
    assert chi2_pvalue(exact, counts_of(tokens[i * half:(i + 1) * half])) > 1e-3, i
  first = [exact_probabilities(target, enc[i:i + 1], cfg) for i in range(2)]
  assert chi2_pvalue(first[1], counts_of(tokens[:half])) < 1e-6  # the laws differ


def test_autoregressive_matches_exact_target_distribution(models):
  target, _, _ = models
  cfg = sampling.SamplingConfig(0.6)
  exact = exact_probabilities(target, ENC, cfg)
  assert chi2_pvalue(exact, sample_counts(target, None, ENC, cfg, seed=3)) > 1e-3


@pytest.mark.parametrize('cfg', CASES[2:], ids=['topk3', 'topp0.7'])
def test_speculative_and_autoregressive_agree_two_sample(models, cfg):
  target, draft, _ = models
  spec = sample_counts(target, draft, ENC, cfg, seed=4)
  ar = sample_counts(target, None, ENC, cfg, seed=5)
  keys = sorted(set(spec) | set(ar))
  table = np.array([[spec.get(k, 0) for k in keys], [ar.get(k, 0) for k in keys]])
  table = table[:, table.sum(0) >= 10]
  assert stats.chi2_contingency(table).pvalue > 1e-3


def broken_rule_pvalue(target, draft, monkeypatch, seed):
  """The chi-square p-value at T = 1 of samples drawn with the broken rule: resampling from
  p instead of the residual after a rejection (every exactness suite must catch it)."""
  cfg = sampling.SamplingConfig(1.0)
  exact = exact_probabilities(target, ENC, cfg)

  def broken(num_accepted, num_drafted, q, p, lenience=1.0):
    return jnp.take_along_axis(p, num_accepted[:, None, None], axis=1)[:, 0]

  monkeypatch.setattr(sampling, 'correction_distribution', broken)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  return chi2_pvalue(exact, sample_counts(target, draft, ENC, cfg, seed=seed))


def test_broken_rule_is_detected(models, monkeypatch):
  target, draft, _ = models
  assert broken_rule_pvalue(target, draft, monkeypatch, seed=1) < 1e-6


def test_block_rule_without_its_residual_is_detected(models, monkeypatch):
  """Block verification followed by a draw from p_{n+1} instead of its residual
  norm(max(0, w_n p - q)) is caught over the longer sequences."""
  target, draft, _ = models
  cfg = sampling.SamplingConfig(1.0)
  exact = exact_probabilities(target, ENC, cfg)
  accept_block = sampling.accept_block

  def broken(uniforms, draft_tokens, q, p, num_drafted):
    n, _ = accept_block(uniforms, draft_tokens, q, p, num_drafted)
    return n, jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]

  monkeypatch.setattr(sampling, 'accept_block', broken)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  counts = sample_counts(target, draft, ENC, cfg, seed=6, gamma=3, verifier='block')
  assert chi2_pvalue(exact, counts) < 1e-6
