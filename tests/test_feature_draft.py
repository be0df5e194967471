"""The feature-reading draft head: its cached calls equal its teacher-forced passes, and
speculative decoding with it is exact (greedy token for token; the enumerated sampling
distribution by chi-square, with the broken-rule control).

The strongest plumbing check: with greedy decoding, how many drafts the loop accepts is
fixed by the head's teacher-forced passes over the final output (pass j at position
n + j - 1 is what the j-th draft call of a step at length n computes while the earlier
drafts were right), so the loop's accepted_tokens must equal a replay of those passes.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import jit_apply, make_model, random_inputs, tiny_config
import test_distribution as td
from specdec_t5x import generate
from test_decoding import _eos_mid_batch
from specdec_t5x.algorithm import api, draft_vocab, feature_draft, sampling
from specdec_t5x.algorithm.decode import chain, drafting
from specdec_t5x.research.measure import forcing


def make_head(target_params, vocab, emb=32, seed=3, layers=1, draft_vocab=(),
              feature_layers=()):
  config = feature_draft.FeatureDraftConfig(vocab_size=vocab, target_emb_dim=emb, emb_dim=16,
                                            num_heads=2, head_dim=8, mlp_dim=32,
                                            num_layers=layers, draft_vocab=draft_vocab,
                                            feature_layers=feature_layers)
  params = feature_draft.init_params(config, jax.random.PRNGKey(seed), target_params)
  if feature_layers:
    # The tapped layers' input rows small, as in a head fine-tuned from one that read the
    # final features only (feature_train.start_from): random full-size rows drown the rest.
    params['feature_in']['kernel'] = params['feature_in']['kernel'].at[emb:].multiply(0.2)
  return feature_draft.FeatureDraft(config), params


@pytest.fixture(scope='module')
def models():
  target = make_model(tiny_config(vocab=8, emb=32, v11=False), seed=0)
  return target, make_head(target[1], 8, layers=2, seed=0)


def teacher_forced(target, head, enc, tokens, passes):
  """The target's features and the head's passes over given outputs tokens [b, L]."""
  dec_in = forcing.shift_right(tokens)
  _, _, before, encoded = forcing.features(*target, enc, dec_in)
  return jit_apply(head[0], {'params': head[1]}, encoded, enc, dec_in, before, passes=passes)


def test_cached_calls_equal_the_teacher_forced_pass(models):
  target, head = models
  enc = random_inputs(3, 6, 8, seed=1)
  tokens = np.random.RandomState(2).randint(2, 8, (3, 9)).astype(np.int32)
  (logits, predicted), = teacher_forced(target, head, enc, tokens, passes=1)
  dec_in = forcing.shift_right(tokens)
  _, _, before, encoded = forcing.features(*target, enc, dec_in)
  variables = {'params': head[1]}
  cache = jit_apply(head[0], variables, encoded, enc, 12, method='init_cache')
  # Five positions in one call, then the rest one at a time; then one position picked.
  got, cache, got_f = jit_apply(head[0], variables, cache, dec_in[:, :5], jnp.zeros(3, jnp.int32),
                                    before[:, :5], method='extend')
  np.testing.assert_allclose(got, logits[:, :5], atol=1e-4)
  np.testing.assert_allclose(got_f, predicted[:, :5], atol=1e-4)
  for t in range(5, 9):
    got, cache, _ = jit_apply(head[0], variables, cache, dec_in[:, t:t + 1], jnp.full(3, t),
                                  before[:, t:t + 1], method='extend')
    np.testing.assert_allclose(got[:, 0], logits[:, t], atol=1e-4)
  pick = jnp.array([0, 2, 3])
  got, _, got_f = jit_apply(head[0], variables, cache, dec_in[:, 4:8], jnp.full(3, 4),
                                before[:, 4:8], pick, method='extend')
  assert got.shape == (3, 1, 8) and got_f.shape == (3, 1, 32)
  np.testing.assert_allclose(got[:, 0], logits[np.arange(3), 4 + pick], atol=1e-4)


def test_self_fed_passes_attend_as_the_draft_calls_do(models):
  """Pass j at t: the cache holds pass 1 up to t - j + 1, then the step's own drafts."""
  target, head = models
  enc = random_inputs(2, 5, 8, seed=3)
  tokens = np.random.RandomState(4).randint(2, 8, (2, 8)).astype(np.int32)
  passes = teacher_forced(target, head, enc, tokens, passes=3)
  dec_in = forcing.shift_right(tokens)
  _, _, before, encoded = forcing.features(*target, enc, dec_in)
  variables = {'params': head[1]}
  n = 3  # a step at length 3: real context up to position 2, drafts at 3, 4, 5
  cache = jit_apply(head[0], variables, encoded, enc, 10, method='init_cache')
  _, cache, _ = jit_apply(head[0], variables, cache, dec_in[:, :n], jnp.zeros(2, jnp.int32),
                              before[:, :n], method='extend')
  feature = before[:, n:n + 1]
  for j in range(1, 4):
    t = n + j - 1
    logits, cache, feature = jit_apply(head[0], variables, cache, dec_in[:, t:t + 1],
                                           jnp.full(2, t), feature, method='extend')
    np.testing.assert_allclose(logits[:, 0], passes[j - 1][0][:, t], atol=1e-4)


def replay_accepted(passes, tokens, gamma, max_len, draft_vocab=()):
  """Greedy accepted drafts per row, replayed from the teacher-forced passes (whose logits
  are over `draft_vocab`'s ids when the head has a reduced vocabulary)."""
  best = np.stack([np.argmax(np.asarray(p[0]), -1) for p in passes])  # [gamma, b, L]
  if draft_vocab:
    best = np.asarray(draft_vocab)[best]
  out = []
  for r in range(tokens.shape[0]):
    n, accepted = 0, 0
    while n < max_len:
      drafted = min(gamma, max_len - n - 1)
      k = 0
      while k < drafted and best[k, r, n + k] == tokens[r, n + k]:
        k += 1
      accepted += k
      n += k + 1
    out.append(accepted)
  return np.array(out)


@pytest.mark.parametrize('gamma', [1, 4])
def test_greedy_acceptances_replay_the_teacher_forced_passes(models, gamma):
  target, head = models
  enc = random_inputs(4, 6, 8, seed=5)
  max_len = 16
  out = generate(target, enc, draft=head, gamma=gamma, max_decode_length=max_len, eos_id=-1)
  tokens = np.asarray(out.tokens)
  passes = teacher_forced(target, head, enc, tokens, passes=gamma)
  expected = replay_accepted(passes, tokens, gamma, max_len)
  assert expected.sum() > 0  # the check means something only if some drafts are accepted
  np.testing.assert_array_equal(np.asarray(out.stats['accepted_tokens']), expected)


@pytest.mark.parametrize('batch,policy', [(1, 'fixed'), (4, 'fixed'), (4, 'confidence'),
                                          (4, 'running_alpha')])
def test_greedy_equals_autoregressive(target_and_draft, batch, policy):
  target = target_and_draft[0]
  head = make_head(target[1], 40)
  enc = random_inputs(batch, 9, 40, seed=0)
  eos = _eos_mid_batch(target, enc, 14) if batch > 1 else 1
  ar = generate(target, enc, max_decode_length=14, eos_id=eos)
  if batch > 1:  # EOS really ends rows at different times
    assert len(set(np.asarray(ar.stats['generated_tokens']).tolist())) > 1
  for gamma in (1, 3, 8) if policy == 'fixed' else (2, 5):  # one draft call .. more than room
    spec = generate(target, enc, draft=head, gamma=gamma, gamma_policy=policy,
                    max_decode_length=14, eos_id=eos)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens),
                                  err_msg=f'gamma={gamma}')


def test_greedy_with_a_prompt_and_the_block_verifier(models):
  target, head = models
  enc = random_inputs(3, 6, 8, seed=8)
  prompt = np.array([[5, 6, 0], [0, 0, 0], [7, 2, 3]], np.int32)
  ar = generate(target, enc, max_decode_length=12, eos_id=-1, decoder_prompt=prompt)
  for verifier in ('token', 'block'):
    spec = generate(target, enc, draft=head, gamma=3, verifier=verifier, max_decode_length=12,
                    eos_id=-1, decoder_prompt=prompt)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens))


@pytest.fixture(scope='module')
def dist_models():
  target = make_model(tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)  # as there
  return target, make_head(target[1], td.VOCAB, seed=12)


@pytest.mark.parametrize('cfg', td.CASES[1::2], ids=['t0.6', 'topp0.7'])  # t1, top-k: below
def test_sampling_matches_exact_target_distribution(dist_models, cfg):
  target, head = dist_models
  exact = td.exact_probabilities(target, td.ENC, cfg)
  counts = td.sample_counts(target, head, td.ENC, cfg, seed=21, gamma=2)
  assert td.chi2_pvalue(exact, counts) > 1e-3


def test_block_verifier_with_the_head_matches_exact_distribution(dist_models):
  target, head = dist_models
  cfg = sampling.SamplingConfig(1.0, topk=3)
  exact = td.exact_probabilities(target, td.ENC, cfg)
  counts = td.sample_counts(target, head, td.ENC, cfg, seed=22, gamma=3, verifier='block')
  assert td.chi2_pvalue(exact, counts) > 1e-3


def test_broken_rule_with_the_head_is_detected(dist_models, monkeypatch):
  assert td.broken_rule_pvalue(*dist_models, monkeypatch, seed=21) < 1e-6


def test_a_head_for_another_target_width_is_refused(models):
  target, _ = models
  other = make_head(None, 8, emb=48)
  with pytest.raises(ValueError, match='target_emb_dim'):
    generate(target, random_inputs(1, 4, 8), draft=other, gamma=2, max_decode_length=4)


def test_a_reduced_draft_vocabulary_gives_logits_over_its_ids_only(models):
  target, _ = models
  ids = (1, 2, 5, 6, 7)
  full = make_head(target[1], 8, seed=5)
  small = make_head(target[1], 8, seed=5, draft_vocab=ids)
  assert small[1]['logits_dense']['kernel'].shape == (16, 5)
  np.testing.assert_allclose(small[1]['logits_dense']['kernel'],
                             full[1]['logits_dense']['kernel'][:, list(ids)], rtol=1e-6)
  enc = random_inputs(2, 6, 8, seed=6)
  tokens = np.random.RandomState(7).randint(2, 8, (2, 6)).astype(np.int32)
  (logits, _), = teacher_forced(target, small, enc, tokens, passes=1)
  assert logits.shape == (2, 6, 5)
  module, params = target
  _, _, encoded = jit_apply(module, {'params': params}, enc, tokens, method='features')
  variables = {'params': small[1]}
  cache = jit_apply(small[0], variables, encoded, enc, 8, method='init_cache')
  got, _, _ = jit_apply(small[0], variables, cache, tokens[:, :3], jnp.zeros(2, jnp.int32),
                             jnp.zeros((2, 3, 32)), method='extend')
  assert got.shape == (2, 3, 5)
  full_got, _, _ = jit_apply(full[0], {'params': full[1]}, jit_apply(full[0], 
      {'params': full[1]}, encoded, enc, 8, method='init_cache'), tokens[:, :3],
      jnp.zeros(2, jnp.int32), jnp.zeros((2, 3, 32)), method='extend')
  np.testing.assert_allclose(got, full_got[..., list(ids)], atol=1e-5)
  vocab = feature_draft.vocabulary(small[0].config)
  np.testing.assert_array_equal(vocab.ids, ids)
  np.testing.assert_array_equal(vocab.columns, [5, 0, 1, 5, 5, 2, 3, 4])
  assert feature_draft.vocabulary(full[0].config) is None


def test_draft_distributions_over_a_reduced_vocabulary_widen_with_zeros_elsewhere():
  vocab = draft_vocab.draft_vocabulary((1, 2, 5), 7)
  q = jnp.asarray([[[0.5, 0.25, 0.25]], [[0.0, 1.0, 0.0]]])  # [b=2, gamma=1, Vd=3]
  np.testing.assert_array_equal(draft_vocab.full_distributions(q, vocab), [
      [[0, 0.5, 0.25, 0, 0, 0.25, 0]], [[0, 0, 1.0, 0, 0, 0, 0]]])
  assert draft_vocab.full_distributions(q, None) is q
  logits = jnp.asarray([[0.1, 3.0, -1.0], [2.0, 2.0, 0.0]])
  token, q_greedy, bad = drafting.propose(logits, None, 0, sampling.SamplingConfig(), vocab)
  np.testing.assert_array_equal(token, [2, 1])  # ties: the first column, the smaller id
  assert q_greedy is None and not np.any(bad)
  keys = jax.random.split(jax.random.PRNGKey(0), 2)[:, None]
  token, q_top, _ = drafting.propose(logits, keys, 0, sampling.SamplingConfig(1.0, topk=5),
                                     vocab)  # top-k beyond the draft vocabulary keeps it all
  assert set(np.asarray(token).tolist()) <= {1, 2, 5} and q_top.shape == (2, 3)
  np.testing.assert_allclose(q_top, jax.nn.softmax(logits), rtol=1e-6)


@pytest.mark.parametrize('batch,policy', [(1, 'fixed'), (4, 'confidence')])
def test_greedy_with_a_reduced_draft_vocabulary_equals_autoregressive(target_and_draft, batch,
                                                                      policy):
  target = target_and_draft[0]
  head = make_head(target[1], 40, draft_vocab=tuple(range(1, 40, 3)))
  enc = random_inputs(batch, 9, 40, seed=0)
  eos = _eos_mid_batch(target, enc, 14) if batch > 1 else 1
  ar = generate(target, enc, max_decode_length=14, eos_id=eos)
  for gamma in (1, 3, 8):
    spec = generate(target, enc, draft=head, gamma=gamma, max_decode_length=14, eos_id=eos,
                    gamma_policy=policy)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens),
                                  err_msg=f'gamma={gamma}')


@pytest.mark.parametrize('cfg,verifier', [
    (td.CASES[0], 'token'), (td.CASES[3], 'token'), (sampling.SamplingConfig(1.0, topk=2), 'token'),
    (td.CASES[0], 'block')], ids=['t1', 'topp0.7', 'topk2', 'block'])
def test_sampling_with_a_reduced_draft_vocabulary_matches_exact_distribution(
    dist_models, cfg, verifier):
  """Ids 2 and 4 are never drafted: only the residual can emit them (top-k 5 exceeds the
  head's 4 ids)."""
  target = dist_models[0]
  head = make_head(target[1], td.VOCAB, seed=12, draft_vocab=(0, 1, 3))
  exact = td.exact_probabilities(target, td.ENC, cfg)
  counts = td.sample_counts(target, head, td.ENC, cfg, seed=23, gamma=2, verifier=verifier)
  assert td.chi2_pvalue(exact, counts) > 1e-3


def test_a_reduced_vocabulary_widened_onto_the_wrong_ids_is_detected(dist_models, monkeypatch):
  """The control: the draft's distributions handed to the verifier over the wrong ids."""
  target = dist_models[0]
  head = make_head(target[1], td.VOCAB, seed=12, draft_vocab=(0, 1, 3))
  cfg = sampling.SamplingConfig(1.0)
  exact = td.exact_probabilities(target, td.ENC, cfg)
  right = chain.full_distributions
  monkeypatch.setattr(chain, 'full_distributions',
                      lambda q, vocab: jnp.roll(right(q, vocab), 1, axis=-1))
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  assert td.chi2_pvalue(exact, td.sample_counts(target, head, td.ENC, cfg, seed=23)) < 1e-6


@pytest.mark.parametrize('bad', [(3, 2), (-1, 2), (2, 8), (2, 2), [1, 2], (True,), (2.0,)])
def test_a_bad_draft_vocabulary_is_refused(bad):
  with pytest.raises(ValueError, match='draft_vocab'):
    feature_draft.FeatureDraftConfig(vocab_size=8, target_emb_dim=4, draft_vocab=bad)
