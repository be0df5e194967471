"""The committed feature draft head of the demo target (checkpoints/demo/demo_feature_head_kd):
its gin file runs the demo exactly (the speculative predictions are the baseline's), its
acceptances on real sentences replay from its teacher-forced passes, and its model
directory records the demo vocabulary."""
import json
import pathlib

import numpy as np
import pytest

from specdec_t5x import generate
from specdec_t5x.algorithm import batching, feature_draft
from specdec_t5x.integration import demo, infer, vocab_check
from specdec_t5x.research.measure import evaluation
from test_feature_draft import replay_accepted, teacher_forced

pytestmark = pytest.mark.slow  # the demo's models

REPO = pathlib.Path(__file__).resolve().parents[1]
HEAD = 'demo_feature_head_kd'  # the draft of configs/demo.gin


def test_demo_gin_decodes_exactly_with_the_head(tmp_path):
  out = tmp_path / 'out'
  infer.main(['--gin_file=configs/demo.gin', f"--gin.INFER_OUTPUT_DIR='{out}'",
              '--gin.infer.num_examples=6'])
  metrics = json.loads((out / 'metrics.json').read_text('utf-8'))
  assert metrics['draft_module'] == 'FeatureDraft'
  spec = [json.loads(l)['prediction']
          for l in (out / metrics['predictions_file']).read_text('utf-8').splitlines()]
  base = [json.loads(l)['prediction'] for l in
          (out / metrics['baseline']['predictions_file']).read_text('utf-8').splitlines()]
  assert spec == base and len(spec) == 6
  assert metrics['alpha'] > 0.15  # a trained head (a random one: ~0)


def test_acceptances_on_real_sentences_replay_the_teacher_forced_passes():
  target = evaluation.load_model('demo_target')
  head = evaluation.load_model(HEAD)
  assert isinstance(head[0], feature_draft.FeatureDraft)
  enc = batching.pad_batch([e.inputs for e in evaluation.load_examples('ende', 4)])
  gamma, max_len = 3, 24
  out = generate(target, enc, draft=head, gamma=gamma, max_decode_length=max_len, eos_id=-1)
  tokens = np.asarray(out.tokens)
  passes = teacher_forced(target, head, enc, tokens, passes=gamma)
  expected = replay_accepted(passes, tokens, gamma, max_len, head[0].config.draft_vocab)
  assert expected.sum() > 0
  np.testing.assert_array_equal(np.asarray(out.stats['accepted_tokens']), expected)


def test_head_records_the_demo_vocabulary():
  record = vocab_check.find_record(str(REPO / 'checkpoints' / 'demo' / HEAD))
  assert record['sha256'] == vocab_check.file_sha256(demo.vocab_path(REPO))


def test_each_rows_acceptances_do_not_depend_on_the_other_rows():
  """A row that has finished keeps running in place; its head's first call of a step
  re-feeds a window past the end, which must still fit the cache: the loop skips a call's
  cache writes for every row together when one row's window does not fit, and the other
  rows would then draft from stale keys. Each row accepts what it accepts decoded alone."""
  target, head = evaluation.load_model('demo_target'), evaluation.load_model(HEAD)
  enc = batching.pad_batch([e.inputs for e in evaluation.load_examples('ende', 4)])
  kw = dict(draft=head, gamma=3, max_decode_length=24, eos_id=-1)
  together = np.asarray(generate(target, enc, **kw).stats['accepted_tokens'])
  alone = [int(generate(target, batching.trim_batch(enc[r:r + 1]), **kw).stats[
      'accepted_tokens'][0]) for r in range(len(enc))]
  assert len(set(together.tolist())) > 1  # the rows finish at different steps
  np.testing.assert_array_equal(together, alone)
