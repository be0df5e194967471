"""Where speculative decoding pays on this CPU (scripts/cpu_cost_curve.py): the seconds of
one cached decoder call of k positions by target size and form (parameter dtype : kernel
mode), and research/predict/ceiling.py on those costs (decode only, i.i.d. acceptance).

Sizes: demo (the demo target's shapes and weights) and T5 v1.1 small .. xl with random
weights and one encoder layer (only decoder calls are timed; the encoder's depth does not
change them).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import network
from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.integration import random_init, run_dir
from specdec_t5x.research.measure import evaluation, grid
from specdec_t5x.research.predict import ceiling, paper

SPEEDUPS = (1.0, 1.5, 2.0)
CACHE_LEN = 64 + 9  # a decode of 64 tokens at gamma up to 8
ENC_LEN = 32
PAPER_SMALL_ALPHA = next(r.alpha for r in paper.TABLE_2
                         if (r.task, r.draft, r.temperature) == ('EnDe', 'small', 0))


def model(size: str, dtype: str):
  """(module, params in `dtype`) of a target size: 'demo' (the committed demo target) or a
  T5 v1.1 size with random weights and one encoder layer."""
  if size == 'demo':
    module, params = evaluation.load_model('demo_target')
    config = dataclasses.replace(module.config, dtype=dtype)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), params)
  else:
    config = network.t5_1_1_config(size, num_encoder_layers=1, dtype=dtype)
    params = random_init.init_params(network.Transformer(config), jax.random.PRNGKey(0),
                                     dtype=dtype)
  return network.Transformer(config), params


def decoder_bytes(params) -> int:
  """Bytes a decode step reads: every parameter but the encoder's."""
  return sum(x.size * x.dtype.itemsize for path, x in
             jax.tree_util.tree_flatten_with_path(params)[0]
             if 'encoder' not in jax.tree_util.keystr(path))


def calls_for(nbytes: int) -> int:
  """Chained calls per timed round: fewer for larger models (a round stays ~1 s)."""
  return 32 if nbytes < 1e8 else 8 if nbytes < 1e9 else 3


def measure(size: str, dtype: str, mode: str, ks: List[int], repeats: int) -> Dict[str, Any]:
  """One cell: the seconds of one cached call of k positions for each k in `ks`, batch 1
  (grid.call_seconds), in parameter dtype `dtype` and kernel mode `mode`."""
  module, params = model(size, dtype)
  nbytes = decoder_bytes(params)
  enc = jnp.asarray(np.random.default_rng(0).integers(2, 100, (1, ENC_LEN)), jnp.int32)
  with modes.default_mode_as(mode):
    seconds = grid.call_seconds({size: (module, params, ks)}, enc, calls_for(nbytes), repeats,
                                CACHE_LEN, prefill=False)[size]['call_s']
  del params
  return dict(size=size, dtype=dtype, mode=mode, decoder_bytes=nbytes, seconds=seconds)


def analyse(cell: Dict[str, Any], draft: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """ceiling.py at this cell's costs: alpha needed per speedup (free draft; T5 v1.1 small
  as the draft when given) and the best speedup at the paper's small-draft alpha."""
  sec = cell['seconds']
  step, verify = sec[1], {k: v for k, v in sec.items() if k >= 2}
  out = {'verify_over_step': {k: v / step for k, v in verify.items()}}
  drafts = {'free draft': 0.0}
  if draft is not None:
    drafts['T5 v1.1 small'] = draft['seconds'][1]
    out['c_small'] = drafts['T5 v1.1 small'] / step
  for name, t_draft in drafts.items():
    costs = ceiling.Costs.from_calls(step, verify, t_draft)
    gamma, best = ceiling.best(costs, PAPER_SMALL_ALPHA)
    out[name] = dict(alpha_needed={f'{s:g}x': ceiling.alpha_needed(costs, s) for s in SPEEDUPS},
                     at_paper_alpha=dict(gamma=gamma, speedup=best))
  return out


def load_partial(path: str, ks: List[int]) -> List[Dict[str, Any]]:
  """The cells a run with the same `ks` saved to `path` (none if it is missing)."""
  if not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    saved = json.load(f)
  if saved.get('ks') != ks:
    return []
  for cell in saved['cells']:  # JSON made the call sizes strings
    cell['seconds'] = {int(k): v for k, v in cell['seconds'].items()}
  return saved['cells']


def cells(sizes: List[str], forms: List[Tuple[str, str]], ks: List[int], repeats: int,
          float32_sizes: List[str], partial: str) -> List[Dict[str, Any]]:
  """Every (size, form) cell measured (`measure`) and analysed (`analyse`: larger sizes
  with T5 v1.1 small in the same form as the draft). Each cell is saved to `partial` as it
  completes, and the cells saved there by a run with the same `ks` are reused."""
  done = load_partial(partial, ks)
  for size in sizes:
    for dtype, mode in forms:
      if any((c['size'], c['dtype'], c['mode']) == (size, dtype, mode) for c in done):
        continue
      if dtype == 'float32' and size not in float32_sizes:
        continue
      done.append(measure(size, dtype, mode, ks, repeats))
      c = done[-1]
      print(f"{size} {dtype}/{mode}: step {c['seconds'][1] * 1e3:.2f} ms, "
            + ' '.join(f'{k}:{v / c["seconds"][1]:.2f}' for k, v in c['seconds'].items()),
            flush=True)
      run_dir.write_atomic(partial, json.dumps(dict(ks=ks, cells=done), default=float))
  order = [(s, *f) for s in sizes for f in forms]  # resumed cells in place
  done.sort(key=lambda c: order.index((c['size'], c['dtype'], c['mode']))
            if (c['size'], c['dtype'], c['mode']) in order else len(order))
  small = {(c['dtype'], c['mode']): c for c in done if c['size'] == 'small'}
  for c in done:
    draft = small.get((c['dtype'], c['mode'])) if c['size'] not in ('demo', 'small') else None
    c.update(analyse(c, draft))
  return done
