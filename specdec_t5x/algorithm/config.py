"""One typed decode configuration: sampling, gamma, gamma policy, verifier, lenience and
the CPU kernel mode.

`DecodeConfig` is validated once, when it is built; `generate`, the decoding loops, the
T5X model and gin (configs/runs/infer.gin binds its fields) all take it as it is.
Frozen and hashable: it is a static argument under jit.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple, Union

from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.algorithm import sampling as sampling_lib

GAMMA_POLICIES = ('fixed', 'confidence', 'running_alpha')
VERIFIERS = ('token', 'block')


@dataclasses.dataclass(frozen=True)
class GammaPolicy:
  """How many tokens to draft per step, from information the draft already has (so exact).

  * 'fixed': always gamma (the paper).
  * 'confidence': draft while the draft's max q of the NEXT position is >= `threshold`
    (the first draft is always made); at most gamma. When greedy the confidence is
    max softmax(logits). The stop depends on q only, never on the sampled token, so
    token-wise verification stays exact.
  * 'running_alpha': per row and step, the gamma in 1..gamma maximising the paper's
    (1 - a^(g+1)) / ((1 - a)(g c + 1)) at the row's running acceptance estimate a
    (accepted / tested drafts, decayed by `decay`; prior 1 of 2), with c = `cost_ratio`.
  """
  kind: str = 'fixed'
  threshold: float = 0.5
  cost_ratio: float = 0.1
  decay: float = 0.9

  def __post_init__(self):
    if self.kind not in GAMMA_POLICIES:
      raise ValueError(f'gamma_policy must be one of {GAMMA_POLICIES}, got {self.kind!r}.')
    for name in ('threshold', 'cost_ratio', 'decay'):
      object.__setattr__(self, name, _number(f'gamma_policy {name}', getattr(self, name)))
    if not 0.0 <= self.threshold <= 1.0:
      raise ValueError(f'confidence threshold must be in [0, 1], got {self.threshold}.')
    if not 0.0 <= self.cost_ratio < float('inf'):
      raise ValueError(f'cost_ratio must be a finite number >= 0, got {self.cost_ratio}.')
    if not 0.0 < self.decay <= 1.0:
      raise ValueError(f'decay must be in (0, 1], got {self.decay}.')


def _integer(value: Any) -> Optional[int]:
  """`value` as an int if it is an integral number (not a bool or str), else None."""
  if isinstance(value, (bool, str)) or value is None:
    return None
  try:
    return int(value) if int(value) == value else None
  except (TypeError, ValueError):
    return None


def _number(name: str, value: Any) -> float:
  """`value` as a float, or a ValueError naming the setting (not a bare TypeError)."""
  if isinstance(value, (bool, str)) or value is None:
    raise ValueError(f'{name} must be a number, got {value!r}.')
  try:
    return float(value)
  except (TypeError, ValueError):
    raise ValueError(f'{name} must be a number, got {value!r}.') from None


# gamma's bound: the fixed policy unrolls gamma draft calls into the compiled step, so
# compile time grows with gamma; the paper's best gammas are 3-7 and gamma='auto' picks
# at most 8. A decode also never drafts more than max_decode_length tokens (check_models).
MAX_GAMMA = 64
MAX_SIBLINGS = 8  # per depth: the draft's alternatives beyond its own pick


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """How to decode: every setting of `specdec_t5x.generate` but the inputs and lengths.

  Attributes:
    temperature: 0 = greedy (argmax); otherwise the sampling temperature of target and
      draft alike (sampling.SamplingConfig).
    topk: keep the k most likely tokens (0 = off).
    topp: keep the nucleus of mass topp (0 = off). At most one of topk / topp.
    gamma: draft tokens per target call, 1 <= gamma <= MAX_GAMMA (64) and at most the
      decode's max_decode_length (check_models: more drafts than the decode can hold only
      cost compilation; refused, not capped, so a run decodes with the gamma it names and
      samples alike), or 'auto': chosen by the T5X model at its first batch from
      measured call costs (auto_gamma.py, capped at max_decode_length); `generate` needs
      an int.
    gamma_alpha: the alpha that gamma='auto' plans with (None: a warm-up decode).
    gamma_policy: a GammaPolicy, or its kind ('fixed', 'confidence', 'running_alpha')
      with default settings; stored as a GammaPolicy.
    verifier: 'token' (Algorithm 1) or 'block' (block verification, Sun et al. 2025).
    lenience: l in (0, 1]; l < 1 is the paper's LOSSY relaxation (token verifier only).
    copy_branch: tokens of a copy-from-input branch (prompt lookup: what followed the most
      recent earlier occurrence of the last 1-3 tokens, in the encoder input or the
      decoded prefix) verified beside the draft's chain in the same target call, as a
      draft tree (decode/static_tree.py; exact), or grafted onto the draft's dynamic tree
      (draft_tree_width); 0 = the chain alone. With the token verifier, the fixed gamma
      policy and lenience 1 only.
    draft_siblings: the draft's next most likely tokens after its own pick, verified as
      leaf guesses beside the chain's token at the same depth (a static draft tree in one
      target call, decode/static_tree.py; exact): k (k at every depth 1..gamma) or a
      tuple of per-depth counts (k_1, k_2, ...), at most gamma of them; 0 or () = none.
      The same settings as copy_branch only.
    draft_tree_width: W >= 1: the draft grows a tree of gamma levels instead of a chain,
      EAGLE-2's expansion (decode/dynamic_tree.py; exact): at each depth the W nodes of largest
      draft path probability among the children (the draft's W most likely tokens) of
      the level above, found by one draft tree call per level; 1 + W * gamma nodes
      verified in one target call. 0 = none. With copy_branch the copy branch is grafted
      onto the grown tree (a mixed tree: its guesses that the tree already holds are
      merged). Not with draft_siblings; the same settings as copy_branch, and a draft that
      is a T5 model (network.Transformer) or a feature head (its tree calls feed each node
      its parent's predicted feature).
    draft_tree_nodes: N: of the W * gamma nodes grown, the N of largest draft path
      probability are verified (EAGLE-2's reranking: they form a tree, a node's path
      probability being at most its parent's), 1 + N positions per target call; 0 = all.
    draft_tree_sampled: at temperature > 0, each level of the draft's tree is W tokens
      DRAWN without replacement from the draft's distribution (the run's temperature,
      top-k, top-p) after the level above's node of largest draft path probability, and
      verified by recursive rejection without replacement (decode/dynamic_tree.py; exact),
      instead of fixed top-W guesses. Every grown node is verified (draft_tree_nodes 0:
      keeping the likelier draws would bias them). Temperature 0 grows the top-W tree
      whatever it says.
    cpu_kernels: on the CPU backend, which kernels the decode path runs
      (cpu.modes.MODES): 'packed' (the packed matmul and row kernels, bfloat16 panels
      where bfloat16 holds the weights exactly), 'packed_f32' (float32 panels only),
      'xla' (XLA's ops only) or 'packed_bf16' ('packed', and a bfloat16 network's bfloat16
      layers with vdpbf16ps: cpu/bf16.py); None (the default) takes $SPECDEC_CPU_KERNELS's mode
      (cpu.modes.default_mode, read once). Stored resolved: it is part of the compiled
      program's key and of a run's identity. Other backends ignore it.
  """
  temperature: float = 0.0
  topk: int = 0
  topp: float = 0.0
  gamma: Union[int, str] = 4
  gamma_alpha: Optional[float] = None
  gamma_policy: Union[str, GammaPolicy] = 'fixed'
  verifier: str = 'token'
  lenience: float = 1.0
  cpu_kernels: Optional[str] = None
  copy_branch: int = 0
  draft_siblings: Union[int, Tuple[int, ...]] = ()
  draft_tree_width: int = 0
  draft_tree_nodes: int = 0
  draft_tree_sampled: bool = False

  def __post_init__(self):
    set_ = lambda name, value: object.__setattr__(self, name, value)
    topk = _integer(self.topk)
    if topk is None:
      raise ValueError(f'topk must be an integer >= 0 (0 = off), got {self.topk!r}.')
    cfg = sampling_lib.SamplingConfig(_number('temperature', self.temperature), topk,
                                      _number('topp', self.topp))
    set_('temperature', cfg.temperature)
    set_('topk', cfg.topk)
    set_('topp', cfg.topp)
    if self.gamma != 'auto':
      gamma = _integer(self.gamma)
      if gamma is None or gamma < 1:
        raise ValueError(f"gamma must be >= 1 or 'auto' (an integer: draft tokens per "
                         f'target call), got {self.gamma!r}.')
      if gamma > MAX_GAMMA:
        raise ValueError(f'gamma must be <= {MAX_GAMMA} (MAX_GAMMA: gamma draft calls are '
                         f'unrolled into the compiled step), got {gamma}.')
      set_('gamma', gamma)
    if self.gamma_alpha is not None:
      set_('gamma_alpha', _number('gamma_alpha', self.gamma_alpha))
      if not 0.0 <= self.gamma_alpha <= 1.0:
        raise ValueError(f"gamma_alpha (alpha for gamma='auto') must be in [0, 1], got "
                         f'{self.gamma_alpha}.')
    policy = self.gamma_policy
    if isinstance(policy, str):
      policy = GammaPolicy(policy)
    if not isinstance(policy, GammaPolicy):
      raise ValueError(f'gamma_policy must be a str or GammaPolicy, got {policy!r}.')
    set_('gamma_policy', policy)
    set_('lenience', _number('lenience', self.lenience))
    if not 0.0 < self.lenience <= 1.0:
      raise ValueError(f'lenience must be in (0, 1], got {self.lenience}.')
    if self.verifier not in VERIFIERS:
      raise ValueError(f"verifier must be 'token' or 'block', got {self.verifier!r}.")
    if self.verifier == 'block' and self.lenience != 1.0:
      raise ValueError('lenience < 1 is defined for the token-wise verifier only.')
    if policy.kind == 'confidence' and self.verifier == 'block':
      raise ValueError("gamma_policy='confidence' is verified token-wise only: block "
                       'verification assumes draft lengths fixed before drafting.')
    set_('cpu_kernels', modes.check_mode(self.cpu_kernels or modes.default_mode()))
    copy_branch = _integer(self.copy_branch)
    if copy_branch is None or not 0 <= copy_branch <= MAX_GAMMA:
      raise ValueError(f'copy_branch must be an integer in [0, {MAX_GAMMA}] (tokens of the '
                       f'copy branch; 0 = none), got {self.copy_branch!r}.')
    set_('copy_branch', copy_branch)
    set_('draft_siblings', self._siblings())
    width = _integer(self.draft_tree_width)
    if width is None or not 0 <= width <= MAX_SIBLINGS:
      raise ValueError(f'draft_tree_width must be an integer in [0, {MAX_SIBLINGS}] (nodes '
                       f'per level of the draft\'s tree; 0 = none), got '
                       f'{self.draft_tree_width!r}.')
    set_('draft_tree_width', width)
    nodes = _integer(self.draft_tree_nodes)
    grown = width * self.gamma if isinstance(self.gamma, int) else 0
    if nodes is None or not 0 <= nodes <= grown or (nodes and not width):
      raise ValueError(f'draft_tree_nodes must be an integer in [0, draft_tree_width * gamma = '
                       f'{grown}] (0 = every node grown), got {self.draft_tree_nodes!r}.')
    set_('draft_tree_nodes', nodes)
    if not isinstance(self.draft_tree_sampled, bool):
      raise ValueError(f'draft_tree_sampled (draft_tree_width\'s levels drawn from q) must be '
                       f'True or False, got '
                       f'{self.draft_tree_sampled!r}.')
    if self.draft_tree_sampled and (not width or nodes not in (0, grown)):
      raise ValueError('draft_tree_sampled needs draft_tree_width >= 1 and verifies every '
                       'grown node: draft_tree_nodes must be 0 (reranking sampled nodes by '
                       f'their probability would bias them), got draft_tree_width={width}, '
                       f'draft_tree_nodes={nodes}.')
    if width and (self.draft_siblings or self.gamma == 'auto'):
      raise ValueError('draft_tree_width (the draft\'s own tree) takes an integer gamma and '
                       'no draft_siblings (its levels hold the runner-ups).')
    if self.tree and (self.verifier != 'token' or policy.kind != 'fixed' or self.lossy):
      raise ValueError("copy_branch, draft_siblings and draft_tree_width (a draft tree) "
                       "are verified with "
                       "verifier='token', gamma_policy='fixed' and lenience=1 only.")

  def _siblings(self) -> Tuple[int, ...]:
    """draft_siblings as per-depth counts without trailing zeros, or a ValueError."""
    value = self.draft_siblings
    counts = [value] if _integer(value) is not None else value
    counts = [_integer(k) for k in counts] if isinstance(counts, (list, tuple)) else [None]
    if any(k is None or not 0 <= k <= MAX_SIBLINGS for k in counts):
      raise ValueError(f'draft_siblings must be an integer in [0, {MAX_SIBLINGS}] or a '
                       f'tuple of them (per depth), got {value!r}.')
    if _integer(value) is not None:  # k at every depth of the chain
      counts = counts * (self.gamma if isinstance(self.gamma, int) else 0)
      if value and self.gamma == 'auto':
        raise ValueError("draft_siblings needs an integer gamma, not 'auto'.")
    while counts and not counts[-1]:
      counts.pop()
    if isinstance(self.gamma, int) and len(counts) > self.gamma:
      raise ValueError(f'draft_siblings names {len(counts)} depths; the chain has gamma = '
                       f'{self.gamma}.')
    return tuple(counts)

  @property
  def tree(self) -> bool:
    """True when a step verifies a draft tree (copy_branch, draft_siblings or
    draft_tree_width set)."""
    return bool(self.copy_branch or self.draft_siblings or self.draft_tree_width)

  @property
  def tree_nodes(self) -> int:
    """Draft tokens one step verifies: gamma + copy_branch + the siblings, or the draft's
    own tree's (draft_tree_nodes, else W * gamma; an int gamma) + copy_branch."""
    if self.draft_tree_width:
      return (self.draft_tree_nodes or self.draft_tree_width * self.gamma) + self.copy_branch
    return self.gamma + self.copy_branch + sum(self.draft_siblings)

  @property
  def tree_call_nodes(self) -> int:
    """The most nodes beyond the root that one call over a tree feeds: tree_nodes, or the
    draft's last tree call while it grows a dynamic tree (W * (gamma - 1) nodes) when
    draft_tree_nodes keeps fewer (an int gamma). What the decode caches are sized for."""
    if self.draft_tree_width:
      return max(self.tree_nodes, self.draft_tree_width * (self.gamma - 1))
    return self.tree_nodes

  def check_models(self, *, vocab_size: Optional[int], max_decode_length: int,
                   speculative: bool = True) -> None:
    """Raises ValueError, before anything is traced, for settings the models and the
    decode length cannot take: topk > the vocabulary (vocab_size None: not checked), an
    integer gamma > max_decode_length when drafting (`speculative`), or copy_branch >
    max_decode_length."""
    if vocab_size is not None and self.topk > vocab_size:
      raise ValueError(f'topk must be <= the vocabulary size ({vocab_size}), got '
                       f'{self.topk}.')
    if speculative and self.gamma != 'auto' and self.gamma > max_decode_length:
      raise ValueError(f'gamma must be <= max_decode_length ({max_decode_length}): a step '
                       f'never drafts more tokens than the decode holds; got {self.gamma}.')
    if vocab_size is not None and self.draft_tree_width > vocab_size:
      raise ValueError(f'draft_tree_width must be <= the vocabulary size ({vocab_size}), got '
                       f'{self.draft_tree_width}.')
    if vocab_size is not None and max(self.draft_siblings, default=0) >= vocab_size:
      raise ValueError(f'draft_siblings must be < the vocabulary size ({vocab_size}) at '
                       f'every depth, got {self.draft_siblings}.')
    if self.copy_branch > max_decode_length:
      raise ValueError(f'copy_branch must be <= max_decode_length ({max_decode_length}), as '
                       f'gamma: got {self.copy_branch}.')

  @classmethod
  def from_sampling(cls, cfg: sampling_lib.SamplingConfig, **fields: Any) -> 'DecodeConfig':
    """A DecodeConfig with `cfg`'s temperature, topk and topp and the given other fields."""
    return cls(temperature=cfg.temperature, topk=cfg.topk, topp=cfg.topp, **fields)

  @property
  def sampling(self) -> sampling_lib.SamplingConfig:
    """How logits become distributions (temperature, top-k, top-p)."""
    return sampling_lib.SamplingConfig(self.temperature, self.topk, self.topp)

  def program_key(self) -> 'DecodeConfig':
    """This config with the sampling values that a compiled program takes at run time
    replaced by stand-ins (SamplingConfig.program_key): equal for configs that share one
    compiled decode program (api.compiled_program)."""
    key = self.sampling.program_key()
    return self.replace(temperature=key.temperature, topp=key.topp)

  @property
  def lossy(self) -> bool:
    return self.lenience < 1.0

  def replace(self, **fields: Any) -> 'DecodeConfig':
    """A copy with `fields` changed (validated again)."""
    return dataclasses.replace(self, **fields)

  def without_tree(self) -> 'DecodeConfig':
    """These settings with no draft tree (copy_branch, draft_siblings and the draft_tree_
    fields cleared): what the same run's autoregressive baseline decodes with, as a target
    alone verifies no tree."""
    return self.replace(copy_branch=0, draft_siblings=(), draft_tree_width=0,
                        draft_tree_nodes=0, draft_tree_sampled=False)

  def describe(self) -> Dict[str, Any]:
    """JSON-friendly settings (metrics.json's run settings). gamma_alpha only for
    gamma='auto', gamma_policy only when not 'fixed', the tree settings only when set, so
    runs without them keep the settings they always had."""
    out: Dict[str, Any] = {'gamma': self.gamma}
    if self.gamma == 'auto':
      out['gamma_alpha'] = self.gamma_alpha
    if self.gamma_policy.kind != 'fixed':
      out['gamma_policy'] = dataclasses.asdict(self.gamma_policy)
    out.update(temperature=self.temperature, topk=self.topk, topp=self.topp,
               lenience=self.lenience, lossy=self.lossy, verifier=self.verifier,
               cpu_kernels=self.cpu_kernels)
    if self.copy_branch:
      out['copy_branch'] = self.copy_branch
    if self.draft_siblings:
      out['draft_siblings'] = list(self.draft_siblings)
    if self.draft_tree_width:
      out['draft_tree_width'] = self.draft_tree_width
      out['draft_tree_nodes'] = self.tree_nodes
    if self.draft_tree_sampled:
      out['draft_tree_sampled'] = True
    return out
