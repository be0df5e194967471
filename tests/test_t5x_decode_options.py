"""Every decoding option of T5X's `predict_batch_with_aux`, and scoring, on the speculative
model (models.py, t5x_outputs.py): `num_decodes`, `return_all_decodes`, the 'scores' aux,
`prompt_with_targets`, `rng` vs `decoder_params['decode_rng']`, and `score_batch`.

Checked against stock T5X (EncoderDecoderModel + temperature_sample) where T5X has the
same thing: greedy decodes token for token, scores and shapes; sampled decodes against
the target's exact distribution (chi-square, as tests/test_distribution.py). The T5X
comparisons need T5X installed (it is not on PyPI) and are skipped otherwise.
"""
import dataclasses
import functools
import importlib.util

import jax
import numpy as np
import pytest

from conftest import make_model, tiny_config
from test_distribution import MAX_LEN, VOCAB, chi2_pvalue, exact_probabilities
from specdec_t5x import generate
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.network import T5Config, Transformer
from specdec_t5x.integration import models

HAVE_T5X = importlib.util.find_spec('t5x') is not None
NEEDS_T5X = pytest.mark.skipif(not HAVE_T5X, reason='t5x is not installed (not on PyPI)')
CFG = T5Config(vocab_size=48, emb_dim=16, num_heads=2, num_encoder_layers=1,
               num_decoder_layers=1, head_dim=8, mlp_dim=32, dropout_rate=0.0,
               mlp_activations=('gelu', 'linear'))
DRAFT_CFG = dataclasses.replace(CFG, emb_dim=8, num_heads=1)
LEN = 6


@pytest.fixture(scope='module')
def weights():
  return (models.init_params(Transformer(CFG), jax.random.PRNGKey(0)),
          models.init_params(Transformer(DRAFT_CFG), jax.random.PRNGKey(1)))


def _batch(prompts=((5, 7, 1), (9,))):
  enc = np.random.RandomState(0).randint(2, 48, size=(2, 8)).astype(np.int32)
  enc[1, 5:] = 0
  dec_in = np.zeros((2, LEN), np.int32)  # T5X's: BOS 0, then the targets shifted right
  for r, p in enumerate(prompts):
    dec_in[r, 1:1 + len(p)] = p
  return {'encoder_input_tokens': enc, 'decoder_input_tokens': dec_in,
          'decoder_target_tokens': np.zeros((2, LEN), np.int32),
          'decoder_loss_weights': np.zeros((2, LEN), np.int32)}


def _standalone(weights, speculative=True, **config):
  kw = dict(draft_config=DRAFT_CFG, draft_params=weights[1]) if speculative else {}
  return models.StandaloneSpeculativeModel(Transformer(CFG), decode_config=DecodeConfig(
      gamma=3, **config), **kw)


def test_rng_and_decode_rng_together_raise_as_in_t5x(weights):
  model, key = _standalone(weights), jax.random.PRNGKey(3)
  with pytest.raises(ValueError, match=r"both from the `rng` argument and decoder_params"):
    model.predict_batch_with_aux(weights[0], _batch(), rng=key,
                                 decoder_params={'decode_rng': key})
  with pytest.raises(ValueError, match=r"\['temperature'\] are not used"):
    model.predict_batch_with_aux(weights[0], _batch(), decoder_params={'temperature': 0.5})
  a = model.predict_batch_with_aux(weights[0], _batch(), rng=key)[0]
  b = model.predict_batch_with_aux(weights[0], _batch(), decoder_params={'decode_rng': key})[0]
  np.testing.assert_array_equal(a, b)


def test_num_decodes_are_independent_rows_sorted_by_score(weights):
  """k decodes of an input = k rows of generate on the input repeated in place, each with
  its own random stream; sorted by increasing score, the last one returned by default."""
  model, key, k = _standalone(weights, temperature=1.0), jax.random.PRNGKey(7), 4
  batch = _batch()
  decodes, aux = model.predict_batch_with_aux(weights[0], batch, key, num_decodes=k,
                                              return_all_decodes=True)
  assert decodes.shape == (2, k, LEN)
  assert set(aux) == {'scores', 'target_calls', 'drafted_tokens', 'accepted_tokens',
                      'generated_tokens', 'beta_positions', 'beta_sum'} and all(v.shape == (2, k) for v in aux.values())
  assert np.all(np.diff(np.asarray(aux['scores']), axis=1) >= 0)  # increasing, as T5X
  rows = generate((Transformer(CFG), weights[0]), np.repeat(batch['encoder_input_tokens'], k, 0),
                  draft=(Transformer(DRAFT_CFG), weights[1]), gamma=3, temperature=1.0,
                  max_decode_length=LEN, rng=key)
  for i in range(2):
    got = sorted(map(tuple, np.asarray(decodes[i]).tolist()))
    want = sorted(map(tuple, np.asarray(rows.tokens[i * k:(i + 1) * k]).tolist()))
    assert got == want
  assert len(set(map(tuple, np.asarray(decodes).reshape(-1, LEN).tolist()))) > 2  # differ
  best, best_aux = model.predict_batch_with_aux(weights[0], batch, key, num_decodes=k)
  np.testing.assert_array_equal(best, decodes[:, -1])
  for name, value in best_aux.items():
    np.testing.assert_array_equal(value, aux[name][:, -1], err_msg=name)


@pytest.mark.parametrize('with_prompt', [False, True], ids=['no_prompt', 'prompt'])
def test_sampled_num_decodes_follow_the_target_distribution(with_prompt):
  """One input decoded 20000 times with num_decodes (and a decoder prompt): the decodes
  follow the standardised target's exact sequence distribution (given the prompt), and
  each score is that sequence's log-probability (given the prompt)."""
  target = make_model(tiny_config(vocab=VOCAB), seed=10, logit_scale=1.5)
  draft = make_model(tiny_config(vocab=VOCAB, emb=16, layers=1), seed=11, logit_scale=1.5)
  config = DecodeConfig(gamma=2, temperature=1.0, topk=3)
  model = models.StandaloneSpeculativeModel(target[0], draft_module=draft[0],
                                            draft_params=draft[1], decode_config=config)
  enc = np.array([[3, 2, 3, 2]], np.int32)
  exact = exact_probabilities(target, enc, config.sampling)
  first = {t: sum(p for s, p in exact.items() if s[0] == t) for t in range(2, VOCAB)}
  prompt = (max(first, key=first.get),) if with_prompt else ()  # a likely non-EOS token
  dec_in = np.zeros((1, MAX_LEN), np.int32)
  dec_in[0, 1:1 + len(prompt)] = prompt
  k = 20000
  decodes, aux = model.predict_batch_with_aux(
      target[1], {'encoder_input_tokens': enc, 'decoder_input_tokens': dec_in},
      jax.random.PRNGKey(2), num_decodes=k, return_all_decodes=True,
      prompt_with_targets=with_prompt)
  exact = {s: p for s, p in exact.items() if s[:len(prompt)] == prompt}
  mass = sum(exact.values())
  exact = {s: p / mass for s, p in exact.items()}  # the distribution given the prompt
  seqs, counts = np.unique(np.asarray(decodes[0]), axis=0, return_counts=True)
  assert chi2_pvalue(exact, {tuple(s): c for s, c in zip(seqs.tolist(), counts)}) > 1e-3
  for seq, score in zip(np.asarray(decodes[0])[:50].tolist(), np.asarray(aux['scores'][0])):
    assert score == pytest.approx(np.log(exact[tuple(seq)]), abs=1e-4)


@pytest.mark.parametrize('speculative', [True, False])
def test_prompt_with_targets_continues_each_rows_prompt(weights, speculative):
  """Greedy: the decode starts with the prompt (EOS removed) and continues it as the
  target's argmax given it; speculative and autoregressive agree token for token."""
  model = _standalone(weights, speculative)
  decodes, aux = model.predict_batch_with_aux(weights[0], _batch(), prompt_with_targets=True)
  decodes = np.asarray(decodes)
  assert decodes[0, :2].tolist() == [5, 7] and decodes[1, :1].tolist() == [9]
  ar = _standalone(weights, False).predict_batch_with_aux(weights[0], _batch(),
                                                          prompt_with_targets=True)[0]
  np.testing.assert_array_equal(decodes, ar)
  # The continuation is the argmax of the teacher-forced target at every position.
  dec_in = np.pad(decodes[:, :-1], ((0, 0), (1, 0)))
  logits = Transformer(CFG).apply({'params': weights[0]}, _batch()['encoder_input_tokens'],
                                  dec_in, np.ones_like(decodes))
  best = np.asarray(np.argmax(logits, -1))
  for r, start in ((0, 2), (1, 1)):
    n = start + int(aux['generated_tokens'][r])
    np.testing.assert_array_equal(decodes[r, start:n], best[r, start:n])
    assert np.all(decodes[r, n:] == 0)


def _stock_t5x(temperature=0.0):
  """Stock T5X on the same tree: EncoderDecoderModel + temperature_sample."""
  import seqio  # pylint: disable=g-import-not-at-top
  from t5x import decoding  # pylint: disable=g-import-not-at-top
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  from specdec_t5x.research.measure import t5x_reference  # pylint: disable=g-import-not-at-top
  from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top
  vocab = seqio.PassThroughVocabulary(CFG.vocab_size, eos_id=1)
  module = t5x_network.Transformer(t5x_reference.t5x_config(CFG))
  stock = t5x_models.EncoderDecoderModel(
      module=module, input_vocabulary=vocab, output_vocabulary=vocab, optimizer_def=None,
      decode_fn=functools.partial(decoding.temperature_sample, temperature=temperature))
  return stock, module, vocab


@NEEDS_T5X
@pytest.mark.parametrize('num_decodes, prompt', [(3, False), (2, True)])
def test_greedy_options_equal_stock_t5x(weights, num_decodes, prompt):  # pragma: no cover
  stock, module, vocab = _stock_t5x()
  ours = models.SpeculativeEncoderDecoderModel(
      module=module, input_vocabulary=vocab, output_vocabulary=vocab, draft_config=DRAFT_CFG,
      draft_params=weights[1], decode_config=DecodeConfig(gamma=3))
  for return_all in (True, False):
    kw = dict(num_decodes=num_decodes, return_all_decodes=return_all, prompt_with_targets=prompt)
    want, want_aux = stock.predict_batch_with_aux(weights[0], _batch(), **kw)
    got, got_aux = jax.jit(lambda p, b: ours.predict_batch_with_aux(p, b, **kw))(  # pylint: disable=cell-var-from-loop
        weights[0], _batch())
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_aux['scores'], want_aux['scores'])  # 0: greedy


@NEEDS_T5X
def test_score_batch_is_t5xs_and_scores_the_sampled_decodes(weights):  # pragma: no cover
  """score_batch is T5X's own method (same results as stock T5X, bit for bit); at
  temperature 1 the 'scores' aux of a decode is T5X's score_batch of it."""
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  stock, module, vocab = _stock_t5x()
  ours = models.SpeculativeEncoderDecoderModel(
      module=module, input_vocabulary=vocab, output_vocabulary=vocab, draft_config=DRAFT_CFG,
      draft_params=weights[1], decode_config=DecodeConfig(gamma=3, temperature=1.0))
  assert type(ours).score_batch is t5x_models.EncoderDecoderModel.score_batch
  decodes, aux = ours.predict_batch_with_aux(weights[0], _batch(), jax.random.PRNGKey(4),
                                             num_decodes=3, return_all_decodes=True)
  decodes = np.asarray(decodes).reshape(6, LEN)
  length = np.asarray(aux['generated_tokens']).reshape(6)
  scored = {'encoder_input_tokens': np.repeat(_batch()['encoder_input_tokens'], 3, 0),
            'decoder_input_tokens': np.pad(decodes[:, :-1], ((0, 0), (1, 0))),
            'decoder_target_tokens': decodes,
            'decoder_loss_weights': (np.arange(LEN)[None] < length[:, None]).astype(np.int32)}
  ours_score = ours.score_batch(weights[0], scored)
  np.testing.assert_array_equal(ours_score, stock.score_batch(weights[0], scored))
  np.testing.assert_allclose(np.asarray(aux['scores']).reshape(6), ours_score, atol=1e-4)
  intermediates = ours.score_batch(weights[0], scored, return_intermediates=True)[1]
  assert 'token_scores' in intermediates['decoder']
  with pytest.raises(NotImplementedError, match="T5X's EncoderDecoderModel.score_batch"):
    models.StandaloneSpeculativeModel(Transformer(CFG)).score_batch(weights[0], scored)

