"""n-gram drafts: counts -> distributions, the sparse bigram's exact rows, their files."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_t5x.algorithm import drafts
from specdec_t5x.integration import draft_files


def _dense_reference(seqs, vocab, topk, smoothing):
  uni = np.exp(drafts.ngram_log_probs(seqs, vocab, 1, smoothing))
  counts = np.zeros((vocab, vocab))
  for s in seqs:
    for prev, tok in zip([0] + list(s[:-1]), s):
      counts[prev, tok] += 1
  rows = []
  for prev in range(vocab):
    ids = np.argsort(-counts[prev], kind='stable')[:topk]
    p = uni.copy()
    top = (counts[prev, ids] + smoothing) / (counts[prev].sum() + smoothing * vocab)
    rest = np.setdiff1d(np.arange(vocab), ids)
    p[rest] = uni[rest] / uni[rest].sum() * (1 - top.sum())
    p[ids] = top
    rows.append(p)
  return np.array(rows)


def test_ngram_log_probs_normalised_and_counted():
  seqs = [[3, 4, 1], [3, 5, 1], [4, 1]]
  uni = np.exp(drafts.ngram_log_probs(seqs, 6, 1, smoothing=0.0 + 1e-9))
  np.testing.assert_allclose(uni[[1, 3, 4, 5]], [3 / 8, 2 / 8, 2 / 8, 1 / 8], atol=1e-6)
  bi = np.exp(drafts.ngram_log_probs(seqs, 6, 2, smoothing=0.5))
  np.testing.assert_allclose(bi.sum(1), 1.0, rtol=1e-5)
  assert bi[0, 3] > bi[0, 4] > bi[0, 5]  # after BOS: 3 twice, 4 once


def test_sparse_bigram_rows_equal_dense_reference():
  rs = np.random.RandomState(0)
  seqs = [list(rs.randint(1, 12, size=rs.randint(1, 9))) for _ in range(200)]
  params = drafts.sparse_bigram(seqs, 12, topk=4, smoothing=0.1)
  module = drafts.SparseBigramDraft(12, topk=4)
  tokens = jnp.arange(12)[None, :]  # every previous token once
  logits, _ = module.apply({'params': params}, {}, tokens, None, method='extend')
  got = np.asarray(jax.nn.softmax(logits[0], axis=-1))
  np.testing.assert_allclose(got, _dense_reference(seqs, 12, 4, 0.1), rtol=1e-4, atol=1e-6)


def test_save_and_load_roundtrip(tmp_path):
  params = drafts.sparse_bigram([[2, 3, 1]], 8, topk=2)
  draft_files.save_ngram(str(tmp_path / 'bi.npz'), params, 8)
  module, loaded = draft_files.load_ngram(str(tmp_path / 'bi.npz'))
  assert isinstance(module, drafts.SparseBigramDraft) and module.vocab_size == 8
  for k in params:
    np.testing.assert_array_equal(np.asarray(loaded[k]), params[k])
  assert sorted(p.name for p in tmp_path.iterdir()) == ['bi.npz']  # no temporary left


@pytest.mark.parametrize('order, kind', [(1, drafts.UnigramDraft), (2, drafts.BigramDraft)])
def test_dense_ngram_files_load_as_their_kind(tmp_path, order, kind):
  params = {'logits': drafts.ngram_log_probs([[2, 3, 1], [4, 1]], 6, order)}
  path = str(tmp_path / f'order{order}.npz')
  draft_files.save_ngram(path, params, 6)
  module, loaded = draft_files.load_ngram(path)
  assert type(module) is kind and module.vocab_size == 6
  np.testing.assert_array_equal(np.asarray(loaded['logits']), params['logits'])


def test_load_ngram_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match='No n-gram draft'):
    draft_files.load_ngram(str(tmp_path / 'absent.npz'))
