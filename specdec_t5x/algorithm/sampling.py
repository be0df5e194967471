"""Logits -> standardised distributions, and the accept / residual / bonus rule.

Target and draft must be standardised identically (the paper's "standardized sampling"): temperature 0 means
argmax (a one-hot distribution), otherwise logits / temperature, optionally restricted to
the top-k tokens or the top-p nucleus. Everything here works in float32, whatever dtype
the models run in.

Shapes use T5X's bracket comments; `V` is the vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm.cpu import modes, row_kernels


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a distribution. Hashable: it is a static argument under jit."""
  temperature: float = 0.0
  topk: int = 0
  topp: float = 0.0

  def __post_init__(self):
    if not math.isfinite(self.temperature) or self.temperature < 0:
      raise ValueError(f'temperature must be a finite number >= 0 (0 = greedy), got '
                       f'{self.temperature}.')
    if self.topk < 0:
      raise ValueError(f'topk must be >= 0, got {self.topk}.')
    if not 0.0 <= self.topp <= 1.0:
      raise ValueError(f'topp must be in [0, 1], got {self.topp}.')
    if self.topk and self.topp:
      raise ValueError(f'Set at most one of topk ({self.topk}) and topp ({self.topp}).')

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  @property
  def nucleus(self) -> bool:
    """Whether top-p is on."""
    return self.topp > 0.0

  def values(self) -> np.ndarray:
    """What a compiled decode program takes at run time (`bind`): float32 [temperature,
    1 / temperature (computed in double, then rounded; inf below float's range, 0 when
    greedy), topp]."""
    with np.errstate(divide='ignore', over='ignore'):
      inverse = 0.0 if self.greedy else np.float32(1.0 / self.temperature)
    return np.array([self.temperature, inverse, self.topp], np.float32)

  def program_key(self) -> 'SamplingConfig':
    """The settings a compiled decode program is specialised on: greedy or not, top-k (a
    shape) and whether top-p is on; temperature and top-p mass 1 stand for every value,
    which the program takes at run time (`values`)."""
    return SamplingConfig(0.0 if self.greedy else 1.0, self.topk, 1.0 if self.topp else 0.0)

  def bind(self, values: Any) -> 'Sampling':
    """This config's switches with `values` ([3], as `values()` makes them; traced inside a
    compiled program) as its temperature, 1 / temperature and top-p mass."""
    return Sampling(self.greedy, self.topk, self.nucleus, values[0], values[1], values[2])


@dataclasses.dataclass(frozen=True)
class Sampling:
  """A SamplingConfig inside a compiled decode program (SamplingConfig.bind): the switches
  that shape the program are static (greedy, top-k, top-p on or off), the temperature, its
  inverse and the top-p mass are values of the program's run-time arguments, so that one
  compiled program serves every temperature and top-p."""
  greedy: bool
  topk: int
  nucleus: bool
  temperature: Any
  inv_temperature: Any
  topp: Any


Settings = Union[SamplingConfig, Sampling]


def _bound(cfg: Settings) -> Sampling:
  return cfg.bind(cfg.values()) if isinstance(cfg, SamplingConfig) else cfg


def standardize(logits: jax.Array, cfg: Settings) -> jax.Array:
  """logits [..., V] -> probabilities [..., V] (float32) after temperature/top-k/top-p.

  Sound for every finite temperature > 0: the maximum is subtracted BEFORE dividing, so
  the scaled logits are <= 0 with the maxima exactly 0, and a tiny temperature (1e-10)
  sends the rest to -huge or -inf (probability 0) instead of overflowing into NaN; the
  result tends to the uniform distribution over the tied maxima, as the limit should.
  """
  return standardize_checked(logits, cfg)[0]


def standardize_checked(logits: jax.Array, cfg: Settings):
  """logits [..., V] -> (`standardize`'s probabilities [..., V], nonfinite [...] bool: the
  row holds a NaN or an infinity), from one `argmax_checked` per row.

  The row's maximum is the logit at its argmax (NaN when the row holds one, as jnp.max),
  so on CPU the kernel's one pass replaces XLA's max and all(isfinite) reductions; and as
  the scaled logits' maximum is exactly 0, the softmax needs no second max. Without top-k
  or top-p, on the CPU backend, row_kernels.row_softmax does it all per row (its exp and
  sum agree with XLA's to float32 rounding, ~1e-7 relative).
  """
  logits = logits.astype(jnp.float32)
  cfg = _bound(cfg)
  if not cfg.greedy and not cfg.topk and not cfg.nucleus and modes.row_kernel():
    return row_kernels.row_softmax(logits, cfg.inv_temperature)
  index, bad = argmax_checked(logits)
  if cfg.greedy:
    return jax.nn.one_hot(index, logits.shape[-1], dtype=jnp.float32), bad
  top = jax.lax.stop_gradient(jnp.take_along_axis(logits, index[..., None], axis=-1))
  shifted = logits - top  # [..., V] <= 0; 0 at the maxima (and stays 0 for any T).
  logits = jnp.where(shifted < 0, shifted / cfg.temperature, 0.0)
  if cfg.topk:
    kth = jax.lax.top_k(logits, cfg.topk)[0][..., -1:]  # [..., 1]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  elif cfg.nucleus:
    # Keep the smallest prefix of the sorted tokens whose mass reaches topp (ties kept).
    sorted_logits = -jnp.sort(-logits, axis=-1)
    cum = jnp.cumsum(_softmax_of_max_zero(sorted_logits), axis=-1)
    cutoff_index = jnp.sum(cum < cfg.topp, axis=-1, keepdims=True)
    cutoff_index = jnp.minimum(cutoff_index, logits.shape[-1] - 1)
    cutoff = jnp.take_along_axis(sorted_logits, cutoff_index, axis=-1)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return _softmax_of_max_zero(logits), bad


def _softmax_of_max_zero(x: jax.Array) -> jax.Array:
  """jax.nn.softmax over the last axis of x [..., V] whose maximum is 0 (x - 0 == x)."""
  e = jnp.exp(x)
  return e / jnp.sum(e, axis=-1, keepdims=True)


def argmax(logits: jax.Array) -> jax.Array:
  """[..., V] -> [...] int32: jnp.argmax over the last axis, the same index in every case
  (the first maximum; the first NaN when there is one, as NaN counts as the largest)."""
  return argmax_checked(logits)[0]


def argmax_checked(logits: jax.Array):
  """[..., V] -> (argmax [...] int32, as `argmax`; nonfinite [...] bool: the row holds a
  NaN or an infinity).

  A greedy decode needs both for every logits row it makes. On the CPU backend
  (modes.row_kernel) one pass of row_kernels.row_argmax per row gives both: XLA:CPU
  runs jnp.argmax's variadic (value, index) reduction as a scalar loop (~24 us for
  V = 8192) and all(isfinite) as a predicate reduction about as slow. Elsewhere a max, then
  the largest reversed position that holds it (two plain float reductions; the positions
  are floats, exact for V < 2^24), and all(isfinite).
  """
  v = logits.shape[-1]
  if v >= 1 << 24:
    raise ValueError(f'argmax: the vocabulary ({v}) must be below 2^24.')
  if modes.row_kernel():
    return row_kernels.row_argmax(logits)
  top = jnp.max(logits, axis=-1, keepdims=True)
  reversed_position = jnp.arange(v, 0, -1, dtype=jnp.float32)  # v at index 0 .. 1 at v - 1
  hit = (logits == top) | jnp.isnan(logits)
  index = (v - jnp.max(jnp.where(hit, reversed_position, 0.0), axis=-1)).astype(jnp.int32)
  return index, ~jnp.all(jnp.isfinite(logits), axis=-1)


SAMPLE_BLOCK = 128  # vocabulary entries per block of sample's two-level CDF


def sample(keys: jax.Array, probs: jax.Array) -> jax.Array:
  """One token per row by inverse CDF. keys [b, 2] (one per row), probs [b, V] -> [b] int32.

  Draws ONE uniform u in (0, 1] per row and returns the first index whose cumulative mass
  reaches u * total: P(i) = probs[i] / total (up to float rounding of the cumulative
  sums), and a zero-probability token is never returned. On CPU this is ~50x cheaper than
  Gumbel-max, which draws V numbers.

  The CDF is two-level (a cumulative sum is a serial scan on CPU, ~21 us over 8192
  entries): block sums of SAMPLE_BLOCK entries and their running total pick the block
  where the mass u * total is reached, and one cumulative sum inside that block picks the
  token (~2 us in all). On the CPU backend row_kernels.row_sample does the same per row
  in one call (blocks of 64 entries; ~1.3 us).
  """
  u = 1.0 - jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)  # [b] in (0, 1]
  probs = probs.astype(jnp.float32)
  if modes.row_kernel():
    return row_kernels.row_sample(probs, u)
  b, v = probs.shape
  size = SAMPLE_BLOCK
  nb = -(-v // size)
  blocks = jnp.pad(probs, ((0, 0), (0, nb * size - v))).reshape(b, nb, size)
  block_cdf = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [b, nb]
  mass = u * block_cdf[:, -1]  # [b] in (0, total]
  j = jnp.minimum(jnp.sum(block_cdf < mass[:, None], axis=-1), nb - 1)  # the first block >= mass
  before = jnp.take_along_axis(block_cdf, jnp.maximum(j - 1, 0)[:, None], axis=1)[:, 0]
  before = jnp.where(j > 0, before, 0.0)  # < mass: so the mass left in block j is > 0
  inner = jnp.take_along_axis(blocks, j[:, None, None], axis=1)[:, 0]  # [b, size]
  i = jnp.sum(jnp.cumsum(inner, axis=-1) < (mass - before)[:, None], axis=-1)
  # Rounding can leave the block's own sum a hair short of the mass left: then its last
  # positive entry (block j holds mass, so one exists).
  last = jnp.max(jnp.where(inner > 0, jnp.arange(size), 0), axis=-1)
  idx = j * size + jnp.minimum(i, last)
  return jnp.minimum(idx, v - 1).astype(jnp.int32)


def residual(p: jax.Array, q: jax.Array, lenience: float = 1.0) -> jax.Array:
  """norm(max(0, p - l*q)) [..., V]; falls back to p where the residual has no mass."""
  r = jnp.maximum(p - lenience * q, 0.0)
  mass = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(mass > 0, r / jnp.where(mass > 0, mass, 1.0), p)


def accept_tokenwise(uniforms, draft_tokens, q, p, num_drafted, lenience: float = 1.0):
  """Algorithm 1's acceptance: the number of leading draft tokens kept per row.

  Args:
    uniforms: [b, gamma] i.i.d. U(0, 1), one per draft position.
    draft_tokens: [b, gamma] x_i, sampled from q_i.
    q: [b, gamma, V] draft distributions q_i.
    p: [b, gamma + 1, V] target distributions p_i.
    num_drafted: [b] how many of the gamma drafts count for each row (the rest are void).
    lenience: l in (0, 1]; accept iff r < p(x) / (l q(x)). 1.0 is exact.

  Returns:
    [b] int32 n in [0, num_drafted]: the accepted prefix length.
  """
  gamma = draft_tokens.shape[1]
  p_x = jnp.take_along_axis(p[:, :gamma], draft_tokens[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]  # [b, gamma]
  ok = (uniforms * lenience * q_x < p_x) & (q_x > 0)
  ok &= jnp.arange(gamma)[None, :] < num_drafted[:, None]
  return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def accept_greedy(draft_tokens, target_argmax, num_drafted):
  """`accept_tokenwise` for one-hot p and q: keep drafts while they equal the target argmax.

  draft_tokens [b, gamma], target_argmax [b, gamma + 1], num_drafted [b] -> [b] int32.
  """
  gamma = draft_tokens.shape[1]
  ok = (draft_tokens == target_argmax[:, :gamma])
  ok &= jnp.arange(gamma)[None, :] < num_drafted[:, None]
  return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


def correction_distribution(num_accepted, num_drafted, q, p, lenience: float = 1.0):
  """The distribution of the token emitted after the accepted prefix, per row: [b, V].

  The residual norm(max(0, p_{n+1} - q_{n+1})) after a rejection, or the bonus p_{n+1}
  when all `num_drafted` drafts were accepted.
  """
  gamma = q.shape[1]
  p_next = jnp.take_along_axis(p, num_accepted[:, None, None], axis=1)[:, 0]  # [b, V]
  q_idx = jnp.minimum(num_accepted, gamma - 1)
  q_next = jnp.take_along_axis(q, q_idx[:, None, None], axis=1)[:, 0]
  rejected = (num_accepted < num_drafted)[:, None]
  return jnp.where(rejected, residual(p_next, q_next, lenience), p_next)


def accept_block(uniforms, draft_tokens, q, p, num_drafted):
  """Block verification (Sun et al., ICLR 2025): the draft block is verified jointly.

  Exact like `accept_tokenwise`, and never worse in expected accepted length. With
  weights w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)), the block keeps the longest
  prefix i whose coin `uniforms[i-1] <= h_i / (h_i + 1 - w_i)` comes up, where
  h_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)) for i < k and h_k = w_k (k = drafts
  counted for the row); the next token comes from norm(max(0, w_n p_{n+1} - q_{n+1})), or
  p_{k+1} when all k were kept.

  Args:
    uniforms: [b, gamma] i.i.d. U(0, 1).
    draft_tokens: [b, gamma]; q: [b, gamma, V]; p: [b, gamma + 1, V]; num_drafted: [b].

  Returns:
    (n [b] int32 accepted drafts, correction distribution [b, V]).
  """
  b, gamma = draft_tokens.shape
  p_x = jnp.take_along_axis(p[:, :gamma], draft_tokens[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]  # [b, gamma]
  ratio = jnp.where(q_x > 0, p_x / jnp.where(q_x > 0, q_x, 1.0), 0.0)
  w = [jnp.ones((b,), jnp.float32)]
  for i in range(gamma):
    w.append(jnp.minimum(w[-1] * ratio[:, i], 1.0))
  w = jnp.stack(w, axis=1)  # [b, gamma + 1]: w_0..w_gamma
  # h_i for i = 1..gamma-1 uses the distributions after prefix X^i (index i of p and q).
  h_mid = jnp.sum(jnp.maximum(w[:, 1:gamma, None] * p[:, 1:gamma] - q[:, 1:], 0.0), -1)
  h = jnp.concatenate([h_mid, jnp.zeros((b, 1))], 1)  # [b, gamma]: h_1..h_gamma
  idx = jnp.arange(1, gamma + 1)[None, :]
  h = jnp.where(idx == num_drafted[:, None], w[:, 1:], h)
  denom = h + 1.0 - w[:, 1:]
  thr = jnp.where(denom > 0, h / jnp.where(denom > 0, denom, 1.0), 1.0)
  hit = (uniforms <= thr) & (idx <= num_drafted[:, None])
  n = jnp.max(jnp.where(hit, idx, 0), axis=1).astype(jnp.int32)
  p_next = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # [b, V]
  q_next = jnp.take_along_axis(q, jnp.minimum(n, gamma - 1)[:, None, None], axis=1)[:, 0]
  w_n = jnp.take_along_axis(w, n[:, None], axis=1)  # [b, 1]
  res = jnp.maximum(w_n * p_next - q_next, 0.0)
  mass = jnp.sum(res, -1, keepdims=True)
  res = jnp.where(mass > 0, res / jnp.where(mass > 0, mass, 1.0), p_next)
  return n, jnp.where((n < num_drafted)[:, None], res, p_next)
