r"""Where speculative decoding pays on this CPU: what a verify call costs, by model size.

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=cpu_cost_curve \
      [--sizes=demo,small,base,large,xl] [--forms=float32:packed,bfloat16:packed_bf16,float32:xla] \
      [--ks=1,2,3,4,5,6,7,8] [--repeats=5]

Run from the repository root on an idle machine. For each T5 v1.1-shaped target (demo: the
demo target's shapes and weights; the others T5 v1.1 small .. xl with random weights and one
encoder layer: only decoder calls are timed, and the encoder's depth does not change them)
and each form (parameter dtype : DecodeConfig.cpu_kernels mode), the seconds of one cached
decoder call of k = 1..8 positions at batch 1 (timing.call_costs: chained calls, interleaved
rounds, the median), with the decoder's weight bytes against this machine's caches. Then
research/predict/ceiling.py on those costs (decode only, i.i.d. acceptance): the acceptance
that 1.0x, 1.5x and 2x need with a draft that costs nothing and with T5 v1.1 small as the
draft (its one-token call in the same form), and the speedup the paper's T5-small draft
would give at the paper's EN->DE greedy acceptance (Table 2: 0.75) -- predictions from
measured call costs, not measured decodes.

Each (size, form) cell is saved to {out}.partial.json as it completes, and a rerun with
the same flags resumes from it. Writes results/cpu_cost_curve.{json,md,png}.
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
from specdec_t5x.research.measure import evaluation, grid, measurement
from specdec_t5x.research.predict import ceiling, paper
from specdec_t5x.research.results import harness

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


def run(args, script: str) -> Dict[str, Any]:
  """The report's fields: every cell of the flags' sizes and forms (`cells`, resumed from
  {out}.partial.json)."""
  if 1 not in args.ks or len(args.ks) < 2:
    raise ValueError('--ks needs 1 (the one-token step) and at least one verify size.')
  forms = [tuple(f.split(':')) for f in args.forms.split(',')]
  done = cells(args.sizes.split(','), forms, args.ks, args.repeats,
               args.float32_sizes.split(','), args.out + '.partial.json')
  return dict(ks=args.ks, cache_len=CACHE_LEN, encoder_length=ENC_LEN,
              paper_small_alpha=PAPER_SMALL_ALPHA, cells=done)


def render(report: harness.Report) -> List[str]:
  ks, cells_ = report['ks'], report['cells']
  lines = report.header(
      'Where speculative decoding pays on this CPU: verify-call costs by model size',
      f'Batch 1, a cache of {CACHE_LEN} slots, an encoder input of {ENC_LEN} tokens; float32 '
      f"forms for {report['args']['float32_sizes']} only; demo: "
      'the demo target; small .. xl: T5 v1.1 shapes with random weights. step: one '
      'one-token decoder call; k: a call of k positions as a multiple of the step. '
      'alpha for Nx: the i.i.d. acceptance at which the best gamma reaches N times the '
      'autoregressive speed (decode only; "-": not even at alpha 1), with a draft that costs '
      'nothing and with T5 v1.1 small as the draft (c: its step over the target\'s); at '
      f'alpha {PAPER_SMALL_ALPHA}: the paper\'s EN->DE greedy acceptance with its T5-small '
      'draft, the best gamma and the speedup it predicts here. Predictions from call costs, '
      'not measured decodes.')
  lines += harness.table(
      ['size', 'form', 'decoder MB', 'step ms'] + [f'k={k}' for k in ks if k > 1],
      [[c['size'], f"{c['dtype']}/{c['mode']}", f"{c['decoder_bytes'] / 2**20:.0f}",
        f"{c['seconds'][1] * 1e3:.2f}"] + [f"{c['verify_over_step'][k]:.2f}"
                                           for k in ks if k > 1] for c in cells_],
      'll' + 'r' * (len(ks) + 1))
  fmt = lambda a: '-' if a is None else f'{a:.2f}'
  rows = []
  for c in cells_:
    for name in ('free draft', 'T5 v1.1 small'):
      if name in c:
        best = c[name]['at_paper_alpha']
        rows.append([c['size'], f"{c['dtype']}/{c['mode']}", name,
                     fmt(c.get('c_small')) if name != 'free draft' else '0']
                    + [fmt(c[name]['alpha_needed'][f'{s:g}x']) for s in SPEEDUPS]
                    + [f"{best['speedup']:.2f}x (gamma {best['gamma']})"])
  lines += ['', '## The acceptance each speedup needs', '']
  lines += harness.table(['size', 'form', 'draft', 'c'] + [f'alpha for {s:g}x' for s in SPEEDUPS]
                         + [f'at alpha {PAPER_SMALL_ALPHA}'], rows, 'llll' + 'r' * 4)
  pays = [c for c in cells_ if 'T5 v1.1 small' in c
          and c['T5 v1.1 small']['at_paper_alpha']['speedup'] >= 1.5]
  lines += ['', 'The smallest target at which the paper\'s T5-small draft at alpha '
            f'{PAPER_SMALL_ALPHA} would give >= 1.5x here: ' + (
                ', '.join(f"{c['size']} ({c['dtype']}/{c['mode']})" for c in pays[:1])
                if pays else 'none of those measured') + '.']
  return lines


def plot_and_clean(report: harness.Report) -> None:
  """After the files: the figure of call cost over step by k, and the finished run's
  {out}.partial.json removed."""
  plt, ks = harness.pyplot(), report['ks']
  if plt is not None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in report['cells']:
      ax.plot(ks, [1.0] + [c['verify_over_step'][k] for k in ks if k > 1], marker='o',
              label=f"{c['size']} {c['dtype']}/{c['mode']}")
    ax.plot(ks, [1.0] * len(ks), 'k--', lw=1, label='an accelerator (ideal)')
    ax.set_xlabel('positions in one call (gamma + 1)')
    ax.set_ylabel('call cost / one-token step')
    ax.legend(fontsize=7, ncol=2)
    report.save_figure(fig)
  if os.path.exists(report.out + '.partial.json'):
    os.remove(report.out + '.partial.json')


main = measurement.Measurement(
    'cpu_cost_curve', __doc__, run, render, repeats=5, after=plot_and_clean, prints=False,
    flags=dict(sizes='demo,small,base,large,xl',
               forms='float32:packed,bfloat16:packed_bf16,float32:xla',
               ks=dict(type=harness.ints, default=list(range(1, 9))),
               float32_sizes=dict(default='demo,small,base,large',
                                  help='sizes also timed in float32 forms (xl: its float32 '
                                  'weights and their packed copy do not fit 24 GiB)'))).main
