"""The speedup a decode's step costs allow at a given acceptance, and the acceptance a
speedup needs.

The paper's walltime improvement (theory.walltime_improvement) assumes a verify call of
gamma + 1 positions costs one target step and leaves out the prefill. Where a verify call
costs more (a CPU, where the decode's matrix products are not bound by reading weights)
and outputs are short (the prefill, paid once per sequence by both decoders, is a large
share), the answer comes from what a step costs:

  tokens per step   E(alpha, g) = (1 - alpha^(g+1)) / (1 - alpha), i.i.d. acceptance
  decode only       E t_target / t_step[g]
  end to end        (P_t + L t_target) / (P_t + P_d + (L / E) t_step[g])
                    (theory.end_to_end_speedup for one sequence)

with t_target an autoregressive step, t_step[g] a speculative step at gamma g (the
draft's calls and the verify call: `Costs.from_calls` adds them up from single calls' costs;
a real loop's time per iteration includes everything else it does), P_t and P_d the
target's and the draft's prefill per sequence, and L the mean output length.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

from specdec_t5x.algorithm import theory


@dataclasses.dataclass(frozen=True)
class Costs:
  """Seconds: t_target, one autoregressive step; t_step[g], one speculative step at gamma g
  (the draft's calls and the verify call); the prefills, once per sequence each."""
  t_target: float
  t_step: Dict[int, float]
  prefill_target: float = 0.0
  prefill_draft: float = 0.0

  @classmethod
  def from_calls(cls, t_target: float, t_verify: Dict[int, float], t_draft: float = 0.0,
                 t_first: Optional[Dict[int, float]] = None, prefill_target: float = 0.0,
                 prefill_draft: float = 0.0) -> 'Costs':
    """From single calls' costs: t_verify[k] a target call of k >= 2 positions, t_draft
    the draft's one-token call, t_first[g] its first call of a step at gamma g (None: a
    one-token call); t_step[g] = t_first[g] + (g - 1) t_draft + t_verify[g + 1]."""
    first = t_first or {}
    steps = {k - 1: first.get(k - 1, t_draft) + (k - 2) * t_draft + v
             for k, v in t_verify.items() if k >= 2}
    return cls(t_target, steps, prefill_target, prefill_draft)

  def gammas(self) -> Tuple[int, ...]:
    return tuple(sorted(self.t_step))


def speedup(costs: Costs, alpha: float, gamma: int, output_tokens: float = 0.0) -> float:
  """AR time / speculative time at i.i.d. acceptance `alpha`: decode only when
  `output_tokens` is 0, else end to end for sequences of that mean length."""
  tokens = float(theory.expected_tokens_per_step(alpha, gamma))
  if not output_tokens:
    return tokens * costs.t_target / costs.t_step[gamma]
  return theory.end_to_end_speedup(1, output_tokens, output_tokens / tokens, costs.t_target,
                                   costs.t_step[gamma], costs.prefill_target,
                                   costs.prefill_draft)


def best(costs: Costs, alpha: float, output_tokens: float = 0.0) -> Tuple[int, float]:
  """(gamma, speedup) of the fastest gamma the costs cover at `alpha`."""
  return max(((g, speedup(costs, alpha, g, output_tokens)) for g in costs.gammas()),
             key=lambda gs: gs[1])


def alpha_needed(costs: Costs, target: float, output_tokens: float = 0.0,
                 tol: float = 1e-4) -> Optional[float]:
  """The lowest acceptance at which some covered gamma reaches `target` speedup (0.0 if
  any does), or None where even alpha = 1 does not. The best speedup grows with alpha,
  so bisection finds it."""
  if best(costs, 1.0, output_tokens)[1] < target:
    return None
  if best(costs, 0.0, output_tokens)[1] >= target:
    return 0.0
  lo, hi = 0.0, 1.0
  while hi - lo > tol:
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if best(costs, mid, output_tokens)[1] >= target else (mid, hi)
  return hi
