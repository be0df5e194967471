"""Lenience (the paper's lossy relaxation): l = 1 is the default, l < 1 accepts more, and
the infer runner flags l < 1 as lossy in metrics.json."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import random_inputs
from specdec_t5x import generate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_lenience_one_equals_the_default(target_and_draft):
  """The default decode is the exact one (l = 1): the same tokens and statistics as an
  explicit l = 1, while l = 0.5 on the same inputs and random streams accepts more."""
  target, draft = target_and_draft
  enc = random_inputs(8, 9, 40, seed=2)
  kw = dict(draft=draft, gamma=3, max_decode_length=12, temperature=1.0,
            rng=jax.random.PRNGKey(3))
  default = generate(target, enc, **kw)
  exact, lossy = (generate(target, enc, lenience=l, **kw) for l in (1.0, 0.5))
  np.testing.assert_array_equal(default.tokens, exact.tokens)
  for k in default.stats:
    np.testing.assert_array_equal(default.stats[k], exact.stats[k])
  accepted = lambda out: int(np.sum(out.stats['accepted_tokens']))
  assert accepted(lossy) > accepted(default)  # the comparison can tell lenience apart


@pytest.mark.slow  # how many a lossy setting accepts: not an exactness guard
def test_smaller_lenience_accepts_at_least_as_many(target_and_draft):
  target, draft = target_and_draft
  enc = np.repeat(random_inputs(1, 9, 40, seed=4), 512, 0)
  alphas = []
  for l in (1.0, 0.5, 0.1):
    out = generate(target, enc, draft=draft, gamma=3, max_decode_length=8, temperature=1.0,
                   lenience=l, eos_id=-1, rng=jax.random.PRNGKey(0))
    s = {k: np.asarray(v).sum() for k, v in out.stats.items() if k.endswith('tokens')}
    alphas.append(s['accepted_tokens'] / s['drafted_tokens'])
  assert alphas[0] <= alphas[1] <= alphas[2], alphas
  assert alphas[2] > alphas[0] + 0.05, alphas


@pytest.mark.parametrize('lenience,lossy', [(0.5, True)])
@pytest.mark.slow  # the runner in a subprocess
def test_infer_marks_lenience_below_one_as_lossy(tmp_path, lenience, lossy):
  out = tmp_path / 'run'
  proc = subprocess.run(
      [sys.executable, '-m', 'specdec_t5x.infer', '--gin_file=configs/spec_tiny_test.gin',
       f'--gin.LENIENCE={lenience}', '--gin.TEMPERATURE=1.0',
       f"--gin.INFER_OUTPUT_DIR='{out}'"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  metrics = json.loads((out / 'metrics.json').read_text())
  assert metrics['lossy'] is lossy and metrics['lenience'] == lenience
