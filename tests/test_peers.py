"""The peer benchmark's other systems decode our weights as we do: CTranslate2 (float32,
converted by its own converter from our Hugging Face conversion) gives our greedy tokens,
ids in and out through the vocabulary's pieces; int8 weights run too."""

import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config, train_tiny_spm
from specdec_t5x.algorithm import api
from specdec_t5x.integration.hf_convert import hf_model_from_params
from specdec_t5x.research.measure import peers

pytestmark = pytest.mark.slow  # a results table's tooling, not the decode path

pytest.importorskip('ctranslate2')
pytest.importorskip('transformers')

TEXTS = ['the house is small', 'das Haus ist klein', 'a cat sat on the mat',
         'eine Katze sass auf der Matte', 'speculative decoding is exact']


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  root = tmp_path_factory.mktemp('ct2')
  vocab = str(train_tiny_spm(root / 'tiny.model', TEXTS))
  import sentencepiece as spm
  size = spm.SentencePieceProcessor(model_file=vocab).get_piece_size()
  # A vocabulary larger than the SentencePiece model's, as T5's are (padded ids).
  config = tiny_config(vocab=size + 6)
  module, params = make_model(config, seed=3, logit_scale=3.0)
  hf = hf_model_from_params(params, config)
  paths = {kind: peers.ctranslate2_model(hf, vocab, str(root), kind)
           for kind in ('float32', 'int8')}
  return module, params, config, vocab, paths


def _ours(module, params, inputs, max_len):
  out = []
  for row in inputs:
    o = api.generate((module, params), row[None], max_decode_length=max_len)
    out.append(np.asarray(o.tokens[0, :int(o.stats['generated_tokens'][0])]))
  return out


def test_ctranslate2_float32_gives_our_greedy_tokens(converted):
  module, params, config, vocab, paths = converted
  inputs = random_inputs(6, 7, config.vocab_size - 6, seed=2)
  inputs[:, -1] = 0
  for r in range(len(inputs)):  # inputs end with EOS, as the tasks feed them
    inputs[r, np.flatnonzero(inputs[r] == 0)[0]] = 1
  ours = _ours(module, params, inputs, 12)
  assert len(peers.model_vocabulary(paths['float32'])) == config.vocab_size
  runner = peers.CT2Runner(paths['float32'], inputs, 12, 1, 'float32')
  theirs = runner()
  assert runner.calls is None and len(theirs) == len(ours)
  assert peers.agreement(ours, theirs) == len(ours), (ours, theirs)
  assert any(len(t) == 12 for t in ours) or any(t[-1] == 1 for t in ours)
  int8 = peers.CT2Runner(paths['int8'], inputs, 12, 2, 'int8')()
  assert [len(t) <= 12 for t in int8] == [True] * len(inputs)
  assert all(0 <= t.min() and t.max() < config.vocab_size for t in int8)


def test_agreement_counts_equal_rows():
  a = [np.array([3, 1]), np.array([4, 5, 1])]
  assert peers.agreement(a, [np.array([3, 1]), np.array([4, 5])]) == 1
  assert peers.agreement(a, a) == 2
