"""gamma='auto': the draft length that theory picks from call costs measured on this machine.

The best gamma depends on alpha and on what a draft call and a verify call cost here
(the paper, Section 3.3; theory.best_gamma_measured), and those costs differ
between a laptop, a 2-core VM and an accelerator. With gamma='auto' the model, at its
first batch, times one draft call, one target call and target calls over gamma + 1
positions for a few gammas (timing.call_costs: compiled first, repeats interleaved),
interpolates the verify cost between them, takes alpha from the setting or from a
warm-up decode of that batch (the i.i.d. alpha of its tokens per target call), and keeps
the gamma that maximises the predicted walltime improvement. The choice changes speed
only: every gamma decodes exactly (greedy: the same tokens).
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import jax
import numpy as np

from specdec_t5x.algorithm import api, theory, timing
from specdec_t5x.algorithm.config import DecodeConfig

ModelAndParams = Tuple[Any, Any]
VERIFY_GAMMAS = (1, 2, 4, 8)  # verify costs measured at these gammas, interpolated between
MAX_GAMMA = 8
WARMUP_GAMMA = 4


def choose_gamma(target: ModelAndParams, draft: ModelAndParams, enc: Any, *, alpha: float,
                 max_len: int, max_gamma: int = MAX_GAMMA, num_calls: int = 16,
                 repeats: int = 3) -> Dict[str, Any]:
  """The gamma in [1, max_gamma] that theory.best_gamma_measured picks from measured costs.

  Args:
    target, draft: (module, params) of the two models.
    enc: [batch, length] encoder inputs to time the calls on (the decode's batch).
    alpha: the acceptance rate to plan for.
    max_len: the decode length (the caches get its max_len + max_gamma + 1 slots).
    max_gamma: the largest gamma considered (at most max_len: generate refuses more).
    num_calls, repeats: timing.call_costs' settings.

  Returns:
    {'gamma', 'alpha', 'c' (t_draft / t_target), 'costs_s' (seconds per call:
    t_target, t_draft, t_verify_{g+1}), 'predicted_improvement' (theory's walltime
    improvement at the chosen gamma)}.
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f'alpha must be in [0, 1], got {alpha}.')
  if max_gamma < 1:
    raise ValueError(f'max_gamma must be >= 1, got {max_gamma}.')
  max_gamma = min(max_gamma, max_len)
  gammas = sorted({g for g in VERIFY_GAMMAS if g < max_gamma} | {max_gamma})
  specs = {'t_target': (*target, 1), 't_draft': (*draft, 1)}
  specs.update({f't_verify_{g + 1}': (*target, g + 1) for g in gammas})
  costs = timing.call_costs(specs, enc, num_calls, repeats,
                                  cache_len=max_len + max_gamma + 1)
  measured = [costs[f't_verify_{g + 1}'] for g in gammas]
  verify = lambda g: float(np.interp(g, gammas, measured))
  t_draft, t_target = costs['t_draft'], costs['t_target']
  gamma = int(theory.best_gamma_measured(alpha, t_draft, t_target, verify, max_gamma))
  return {'gamma': gamma, 'alpha': float(alpha), 'c': t_draft / t_target, 'costs_s': costs,
          'predicted_improvement': float(theory.walltime_improvement_measured(
              alpha, gamma, t_draft, t_target, verify(gamma)))}


def warmup_alpha(target: ModelAndParams, draft: ModelAndParams, enc: Any, *, max_len: int,
                 rng: jax.Array, eos_id: int, config: DecodeConfig,
                 gamma: int = WARMUP_GAMMA) -> float:
  """alpha fitted to the tokens per target call of one speculative decode of `enc`.

  `config`: the run's DecodeConfig (sampling, verifier, lenience, gamma policy), decoded
  with gamma `gamma`. The i.i.d. alpha is the one whose expected tokens per step, averaged
  over the draft lengths the decode made (draft_length_histogram: the policy's and those
  cut short near max_len), equals the measured tokens per target call.
  """
  gamma = min(gamma, max_len)
  out = api.generate(target, enc, draft=draft, max_decode_length=max_len, rng=rng,
                     eos_id=eos_id, config=config.replace(gamma=gamma))
  generated = float(np.sum(out.stats['generated_tokens']))
  calls = float(np.sum(out.stats['target_calls']))
  lengths = np.asarray(out.stats['draft_length_histogram'], np.float64)
  weights = lengths / max(lengths.sum(), 1.0)
  expected = lambda a: sum(w * (theory.expected_tokens_per_step(a, g) if g else 1.0)
                           for g, w in enumerate(weights) if w)
  measured = generated / max(calls, 1.0)
  lo, hi = 0.0, 1.0
  for _ in range(60):  # expected() increases with alpha
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if expected(mid) < measured else (lo, mid)
  return (lo + hi) / 2
