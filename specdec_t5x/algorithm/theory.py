"""Cost model of speculative decoding under i.i.d. acceptance (paper sections 3.1-3.4).

alpha: expected acceptance rate; gamma: draft tokens per step; c: draft/target step time.
Functions broadcast over array inputs and return numpy values (0-d for scalar inputs).
"""
from typing import Callable, Optional, Tuple, Union

import numpy as np

ArrayLike = Union[float, np.ndarray]


def _alpha(alpha: ArrayLike) -> np.ndarray:
  a = np.asarray(alpha, dtype=np.float64)
  if np.any(np.isnan(a)) or np.any((a < 0) | (a > 1)):
    raise ValueError(f'alpha must lie in [0, 1], got {alpha!r}')
  return a


def _gamma(gamma: ArrayLike) -> np.ndarray:
  g = np.asarray(gamma, dtype=np.float64)
  if np.any(np.isnan(g)) or np.any(g < 1) or np.any(g != np.floor(g)):
    raise ValueError(f'gamma must be an integer >= 1, got {gamma!r}')
  return g


def _nonneg(x: ArrayLike, name: str, strict: bool = False) -> np.ndarray:
  v = np.asarray(x, dtype=np.float64)
  if np.any(np.isnan(v)) or np.any(v <= 0 if strict else v < 0):
    raise ValueError(f"{name} must be {'> 0' if strict else '>= 0'}, got {x!r}")
  return v


def expected_tokens_per_step(alpha: ArrayLike, gamma: ArrayLike) -> np.ndarray:
  """Expected tokens emitted by one speculative step: (1 - alpha^(gamma+1)) / (1 - alpha).

  Computed as expm1((gamma+1) log alpha) / (alpha - 1), which has no cancellation near
  alpha = 1; the limit alpha = 1 gives exactly gamma + 1.
  """
  a, g = _alpha(alpha), _gamma(gamma)
  with np.errstate(divide='ignore', invalid='ignore'):
    ratio = np.expm1((g + 1) * np.log(a)) / (a - 1)
  return np.where(a == 1, g + 1, ratio)[()]


def walltime_improvement(alpha: ArrayLike, gamma: ArrayLike, c: ArrayLike) -> np.ndarray:
  """Expected walltime improvement: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1)).

  Assumes verifying gamma+1 positions in one target call costs one target step.
  """
  c = _nonneg(c, 'c')
  return (expected_tokens_per_step(alpha, gamma) / (_gamma(gamma) * c + 1))[()]


def ideal_speedup(tokens_per_call: ArrayLike, gamma: ArrayLike, t_draft: ArrayLike,
                  t_target: ArrayLike, t_verify: ArrayLike) -> np.ndarray:
  """Speedup from measured tokens per target call: tokens * t_target / (gamma*t_draft + t_verify).

  Args:
    tokens_per_call: measured mean tokens emitted per speculative step, in [1, gamma+1].
    gamma: draft tokens per step.
    t_draft: time of one draft step.
    t_target: time of one autoregressive target step (the baseline's cost per token).
    t_verify: time of one target call scoring gamma+1 positions.
  """
  g = _gamma(gamma)
  n = np.asarray(tokens_per_call, dtype=np.float64)
  if np.any(np.isnan(n)) or np.any((n < 1) | (n > g + 1)):
    raise ValueError(f'tokens_per_call must lie in [1, gamma+1], got {tokens_per_call!r}')
  t_d = _nonneg(t_draft, 't_draft')
  t_t, t_v = _nonneg(t_target, 't_target', True), _nonneg(t_verify, 't_verify', True)
  return (n * t_t / (g * t_d + t_v))[()]


def end_to_end_speedup(sequences: float, ar_calls: float, spec_calls: float, t_target: float,
                       t_step: float, prefill_target: float, prefill_draft: float) -> float:
  """AR time / speculative time with each sequence's prefill (encoder and cache) counted:
  (n P_t + N_ar t_target) / (n (P_t + P_d) + N_spec t_step).

  Args:
    sequences: n, the sequences decoded (each pays the prefills once).
    ar_calls: N_ar, the autoregressive decode's target calls (its output tokens).
    spec_calls: N_spec, the speculative decode's steps (target calls).
    t_target: time of one autoregressive target step.
    t_step: time of one speculative step (the draft's calls and the verify call).
    prefill_target: P_t, the target's prefill per sequence.
    prefill_draft: P_d, the draft's prefill per sequence.
  """
  ar = sequences * prefill_target + ar_calls * t_target
  spec = sequences * (prefill_target + prefill_draft) + spec_calls * t_step
  return ar / spec


def walltime_improvement_measured(alpha: ArrayLike, gamma: ArrayLike, t_draft: ArrayLike,
                                  t_target: ArrayLike, t_verify: ArrayLike) -> np.ndarray:
  """Improvement with a measured verify cost: E[tokens] * t_target / (gamma*t_draft + t_verify).

  Equals `walltime_improvement(alpha, gamma, t_draft / t_target)` when t_verify = t_target.
  """
  tokens = expected_tokens_per_step(alpha, gamma)
  return ideal_speedup(tokens, gamma, t_draft, t_target, t_verify)


def arithmetic_factor(alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike) -> np.ndarray:
  """Growth of total arithmetic: (1 - alpha)(gamma*c_hat + gamma + 1) / (1 - alpha^(gamma+1)).

  c_hat is draft/target arithmetic per token. Equals (gamma*c_hat + gamma + 1) / E[tokens].
  """
  c_hat = _nonneg(c_hat, 'c_hat')
  g = _gamma(gamma)
  return ((g * c_hat + g + 1) / expected_tokens_per_step(alpha, g))[()]


def min_speedup_gamma1(alpha: ArrayLike, c: ArrayLike) -> np.ndarray:
  """Improvement at gamma = 1, a lower bound on the best gamma's: (1 + alpha) / (1 + c)."""
  return ((1 + _alpha(alpha)) / (1 + _nonneg(c, 'c')))[()]


def _argmax_gamma(improvement: np.ndarray) -> np.ndarray:
  # improvement: [max_gamma, ...]; ties go to the smallest gamma.
  return (np.argmax(improvement, axis=0) + 1)[()]


def best_gamma(alpha: ArrayLike, c: ArrayLike, max_gamma: int = 16) -> np.ndarray:
  """Integer gamma in [1, max_gamma] maximising `walltime_improvement(alpha, gamma, c)`."""
  if max_gamma < 1:
    raise ValueError(f'max_gamma must be >= 1, got {max_gamma}')
  a, c, gs = _alpha(alpha), _nonneg(c, 'c'), np.arange(1, int(max_gamma) + 1)
  gs = gs.reshape((-1,) + (1,) * np.broadcast(a, c).ndim)  # [max_gamma, ...]
  return _argmax_gamma(walltime_improvement(a, gs, c))


def best_gamma_measured(alpha: ArrayLike, t_draft: float, t_target: float,
                        t_verify: Union[Callable[[int], float], ArrayLike],
                        max_gamma: Optional[int] = None) -> np.ndarray:
  """Integer gamma maximising `walltime_improvement_measured` with a gamma-dependent verify cost.

  Args:
    alpha: acceptance rate(s).
    t_draft: time of one draft step.
    t_target: time of one autoregressive target step.
    t_verify: a callable gamma -> time of a target call over gamma+1 positions, a scalar
      (the same for every gamma), or a 1-D array indexed by gamma (entry 0 is unused).
    max_gamma: largest gamma tried; defaults to len(t_verify) - 1 for an array, else 16.
  """
  if callable(t_verify):
    max_gamma = 16 if max_gamma is None else int(max_gamma)
    tv = np.array([t_verify(g) for g in range(1, max_gamma + 1)], dtype=np.float64)
  else:
    tv = np.asarray(t_verify, dtype=np.float64)
    if tv.ndim == 0:
      max_gamma = 16 if max_gamma is None else int(max_gamma)
      tv = np.full(max_gamma, float(tv))
    elif tv.ndim == 1:
      max_gamma = tv.shape[0] - 1 if max_gamma is None else int(max_gamma)
      if not 1 <= max_gamma < tv.shape[0]:
        raise ValueError(f't_verify has entries for gamma <= {tv.shape[0] - 1}, '
                         f'max_gamma={max_gamma}')
      tv = tv[1:max_gamma + 1]
    else:
      raise ValueError(f't_verify array must be 1-D, got shape {tv.shape}')
  if max_gamma < 1:
    raise ValueError(f'max_gamma must be >= 1, got {max_gamma}')
  a = _alpha(alpha)
  lead = (-1,) + (1,) * a.ndim
  gs = np.arange(1, max_gamma + 1).reshape(lead)  # [max_gamma, ...]
  return _argmax_gamma(
      walltime_improvement_measured(a, gs, t_draft, t_target, tv.reshape(lead)))


def alpha_from_distributions(p: np.ndarray, q: np.ndarray) -> np.ndarray:
  """alpha = mean over leading axes of beta = sum_x min(p(x), q(x)) = 1 - TV(p, q).

  Args:
    p: target distributions, [..., vocab].
    q: draft distributions, same shape as p.
  """
  p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
  if p.shape != q.shape or p.ndim == 0:
    raise ValueError(f'p and q must have the same shape [..., vocab]: {p.shape} vs {q.shape}')
  for name, d in (('p', p), ('q', q)):
    if np.any(np.isnan(d)) or np.any(d < 0) or not np.allclose(d.sum(-1), 1, atol=1e-3):
      raise ValueError(f'{name} must be non-negative and sum to 1 along the last axis')
  return np.mean(np.minimum(p, q).sum(-1))[()]


def accepted_length_distribution(alpha: ArrayLike, gamma: int) -> np.ndarray:
  """P(n drafts accepted) = alpha^n (1 - alpha) for n < gamma, alpha^gamma for n = gamma.

  Returns an array [..., gamma+1] (leading axes from alpha).
  """
  a = _alpha(alpha)[..., None]
  n = np.arange(int(_gamma(gamma)) + 1)
  return a ** n * np.where(n < n[-1], 1 - a, 1.0)


def simulate_iid(alpha: float, gamma: int, num_steps: int,
                 rng: Union[np.random.Generator, int, None] = None) -> Tuple[float, np.ndarray]:
  """Monte Carlo of speculative steps where each draft is accepted independently w.p. alpha.

  Returns:
    (mean tokens per step, counts of accepted drafts per step [gamma+1]); a step emits
    its accepted drafts plus one target token.
  """
  a, g = float(_alpha(alpha)), int(_gamma(gamma))
  if num_steps < 1:
    raise ValueError(f'num_steps must be >= 1, got {num_steps}')
  rng = np.random.default_rng(rng)
  accepted = rng.random((int(num_steps), g)) < a  # [num_steps, gamma]
  n = np.where(accepted.all(-1), g, np.argmin(accepted, axis=-1))  # [num_steps]
  return float(n.mean() + 1), np.bincount(n, minlength=g + 1)


def alpha_from_tokens_per_call(tokens_per_call: float, gamma: int) -> float:
  """The i.i.d. alpha whose E[tokens per step] (1-a^(g+1))/(1-a) equals the measured one."""
  lo, hi = 0.0, 1.0
  target = min(max(tokens_per_call, 1.0), gamma + 1.0)
  for _ in range(60):
    mid = (lo + hi) / 2
    if expected_tokens_per_step(mid, gamma) < target:
      lo = mid
    else:
      hi = mid
  return (lo + hi) / 2
