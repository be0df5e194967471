"""The decode specs that name a decode in experiments and results files: a chain, a draft
tree, a verifier or policy, and the draft, in one string. A spec is

  g<gamma>[+c<n>][+s<k1>.<k2>...][+w<W>[s][+n<M>]][+block][+conf[<threshold>]][+ra<c>]
  [+l<lenience>][@<draft>]

  +c<n>     DecodeConfig.copy_branch = n (a copy branch of n tokens in the verified tree)
  +s<k..>   DecodeConfig.draft_siblings = (k1, k2, ...) (the draft's runner-up tokens)
  +w<W>     DecodeConfig.draft_tree_width = W (the draft's dynamic tree: gamma levels of W)
  +w<W>s    the same with draft_tree_sampled (at t > 0 each level drawn from q)
  +n<M>     DecodeConfig.draft_tree_nodes = M (of them, the M of largest path probability)
  +block    verifier='block' (block verification)
  +conf<t>  gamma_policy=GammaPolicy('confidence', threshold=t) (t omitted: its default)
  +ra<c>    gamma_policy=GammaPolicy('running_alpha', cost_ratio=c)
  +l<x>     lenience = x (x < 1 is LOSSY: the output no longer follows the target)
  @<draft>  the draft: a demo model ('demo_draft_m', the default; any checkpoints/demo
            model), an n-gram ('bigram', 'unigram'), 'copy' (prompt lookup, uniform
            fallback) or 'copy:<draft>' (prompt lookup falling back to <draft>)
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, Tuple

from specdec_t5x.algorithm.config import DecodeConfig, GammaPolicy

DEFAULT_DRAFT = 'demo_draft_m'

_G = re.compile(r'g(\d+)$')
_PARTS: Tuple[Tuple[re.Pattern, Callable[[re.Match], Dict[str, Any]]], ...] = (
    (re.compile(r'c(\d+)$'), lambda m: dict(copy_branch=int(m.group(1)))),
    (re.compile(r's(\d+(?:\.\d+)*)$'),
     lambda m: dict(draft_siblings=tuple(int(k) for k in m.group(1).split('.')))),
    (re.compile(r'w(\d+)(s?)$'), lambda m: dict(draft_tree_width=int(m.group(1)),
                                                 **({'draft_tree_sampled': True}
                                                    if m.group(2) else {}))),
    (re.compile(r'n(\d+)$'), lambda m: dict(draft_tree_nodes=int(m.group(1)))),
    (re.compile(r'block$'), lambda m: dict(verifier='block')),
    (re.compile(r'conf([\d.]*)$'), lambda m: dict(gamma_policy=GammaPolicy(
        'confidence', **({'threshold': float(m.group(1))} if m.group(1) else {})))),
    (re.compile(r'ra([\d.]+)$'),
     lambda m: dict(gamma_policy=GammaPolicy('running_alpha', cost_ratio=float(m.group(1))))),
    (re.compile(r'l([\d.]+)$'), lambda m: dict(lenience=float(m.group(1)))),
)


def parse_decode(spec: str) -> Tuple[Dict[str, Any], str]:
  """'g2+c3+s2.1@bigram' -> (dict(gamma=2, copy_branch=3, draft_siblings=(2, 1)), 'bigram').
  The settings are validated by DecodeConfig before anything loads."""
  body, _, draft = spec.partition('@')
  first, *rest = body.split('+')
  m = _G.match(first)
  if not m or spec.endswith('@'):
    raise ValueError(f'a decode is g<gamma>[+c<n>][+s<k1>.<k2>...][+w<W>[s][+n<M>]][+block]'
                     f'[+conf[<t>]][+ra<c>][+l<x>][@<draft>], got {spec!r}')
  settings: Dict[str, Any] = dict(gamma=int(m.group(1)))
  for part in rest:
    parsed = [fn(mm) for pattern, fn in _PARTS for mm in [pattern.match(part)] if mm]
    if not parsed:
      raise ValueError(f'{spec!r}: unknown part {part!r} (c<n>, s<k1>.<k2>, w<W>[s], n<M>, block, '
                       'conf[<t>], ra<c>, l<x>)')
    if set(parsed[0]) & set(settings):
      raise ValueError(f'{spec!r}: {part!r} sets {sorted(parsed[0])} twice')
    settings.update(parsed[0])
  try:
    DecodeConfig(**settings)
  except (TypeError, ValueError) as e:
    raise ValueError(f'{spec!r}: {e}') from None
  return settings, draft or DEFAULT_DRAFT


def is_chain(spec: str) -> bool:
  """Whether `spec` is the paper's plain chain with the default draft (g<gamma> alone)."""
  return bool(_G.match(spec))

