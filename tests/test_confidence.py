"""Agreement by the target's confidence (research/measure/confidence.py): the buckets partition the
target's greedy output positions, the counts match a direct computation, the target as its
own draft agrees wherever teacher forcing reproduces its decode, and a head with a reduced
draft vocabulary is read through its ids."""
import jax
import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from test_feature_draft import make_head
from specdec_t5x import generate
from specdec_t5x.algorithm import feature_draft
from specdec_t5x.research.measure import confidence, forcing

pytestmark = pytest.mark.slow  # a results table's tooling, with trained-like heads

VOCAB = 40


def _head_argmax_decoding(target, head, enc, tokens):
  """The feature head's argmax at every position of `tokens` [b, L], through the decode
  path (one `extend` of the target's cache for its features, then one of the head's)
  rather than the teacher-forced passes confidence.py reads."""
  (t_module, t_params), (h_module, h_params) = target, head
  dec_in = np.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  start = np.zeros(len(enc), np.int32)
  encoded = t_module.apply({'params': t_params}, enc, method='encode')
  cache = t_module.apply({'params': t_params}, encoded, enc, tokens.shape[1] + 1,
                         method='init_cache')
  _, _, features = t_module.apply({'params': t_params}, cache, dec_in, start, True,
                                  method='extend')
  before = np.pad(np.asarray(features)[:, :-1], ((0, 0), (1, 0), (0, 0)))  # zeros at BOS
  cache = h_module.apply({'params': h_params}, encoded, enc, tokens.shape[1] + 1,
                         method='init_cache')
  logits = h_module.apply({'params': h_params}, cache, dec_in, start, before, method='extend')[0]
  return np.asarray(logits).argmax(-1)


@pytest.fixture(scope='module')
def family():
  target = make_model(tiny_config(vocab=VOCAB, emb=32, v11=False), seed=0, logit_scale=3.0)
  draft = make_model(tiny_config(vocab=VOCAB, emb=16, layers=1, v11=False), seed=1,
                     logit_scale=3.0)
  return target, draft, make_head(target[1], VOCAB, seed=2)


def test_buckets_partition_the_positions_and_match_a_direct_count(family):
  target, draft, head = family
  enc = random_inputs(6, 7, VOCAB, seed=4)
  table = confidence.agreement_table(target, {'self': target, 'draft': draft, 'head': head},
                                     enc, 12, edges=(0.0, 0.5, 1.0), positions=(0, 5))
  tokens = np.asarray(generate(target, enc, max_decode_length=12).tokens)
  mask = tokens > 0
  n = int(mask.sum())
  assert table['positions'] == n
  assert sum(b['share'] for b in table['buckets']) == pytest.approx(1.0)
  assert table['agreement']['self'] == pytest.approx(
      1 - table['teacher_forced_argmax_differs'] / n)
  dec_in = np.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  p1 = np.asarray(jax.nn.softmax(target[0].apply({'params': target[1]}, enc, dec_in,
                                                  tokens), -1)).max(-1)[mask]
  guess = np.asarray(draft[0].apply({'params': draft[1]}, enc, dec_in, tokens)).argmax(-1)
  right = (guess == tokens)[mask]
  low = p1 < 0.5
  assert table['buckets'][0]['share'] == pytest.approx(low.mean())
  assert table['buckets'][0]['agreement']['draft'] == pytest.approx(right[low].mean())
  assert table['buckets'][1]['agreement']['draft'] == pytest.approx(right[~low].mean())
  head_right = (_head_argmax_decoding(target, head, enc, tokens) == tokens)[mask]
  assert 0 < head_right.mean() < 1  # the comparison can tell a wrong count
  assert table['agreement']['head'] == pytest.approx(head_right.mean())
  assert table['buckets'][0]['agreement']['head'] == pytest.approx(head_right[low].mean())
  assert table['buckets'][1]['agreement']['head'] == pytest.approx(head_right[~low].mean())
  late = np.broadcast_to(np.arange(12), tokens.shape)[mask] >= 5
  assert [(r['from'], r['to']) for r in table['by_position']] == [(0, 5), (5, 12)]
  assert table['by_position'][1]['share'] == pytest.approx(late.mean())
  assert table['by_position'][1]['agreement']['draft'] == pytest.approx(right[late].mean())


def test_a_reduced_vocabulary_head_is_read_through_its_ids(family):
  target, _, (module, params) = family
  ids = (1, 3, 4, 9, 17, 30)
  small = feature_draft.FeatureDraft(feature_draft.FeatureDraftConfig(
      **{**module.config.__dict__, 'draft_vocab': ids}))
  small_params = dict(params, logits_dense={'kernel': params['logits_dense']['kernel'][:,
                                                                                     list(ids)]})
  enc = random_inputs(3, 5, VOCAB, seed=1)
  tokens = np.asarray(generate(target, enc, max_decode_length=8).tokens)
  full = confidence.draft_argmax((module, params), target, enc, tokens)
  picked = confidence.draft_argmax((small, small_params), target, enc, tokens)
  assert set(np.unique(picked)) <= set(ids)
  assert set(np.unique(full)) - set(ids)  # the full head picks other ids too
  # The reduced head's choice is the full head's best among the ids.
  dec_in = forcing.shift_right(tokens)
  _, _, before, encoded = forcing.features(*target, enc, dec_in, tokens)
  logits = np.asarray(module.apply({'params': params}, encoded, enc, dec_in, before,
                                   tokens)[0][0])
  np.testing.assert_array_equal(picked, np.asarray(ids)[logits[..., list(ids)].argmax(-1)])
