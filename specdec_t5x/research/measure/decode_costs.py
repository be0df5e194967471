"""Decode costs and implementation efficiency on random-weight T5 v1.1 shapes.

  python scripts/compare_decodes.py --experiment=decode_costs   # CPU: target base, draft small
  python scripts/compare_decodes.py --experiment=decode_costs --target=small --draft=small \\
      --gammas=2 --max_len=16
  python scripts/compare_decodes.py --experiment=decode_costs --dtype=bfloat16 \\
      --cpu_kernels=packed_bf16 --out=results/decode_costs_bf16  # on our bfloat16 kernels

Measures, in one process after compilation, each as the median of interleaved repeats:
  * per-call cost of a target step, a draft step and a (gamma+1)-token verification, and
    the once-per-sequence prefill (encoder + cache) of each model;
  * AR tokens/s of generate(draft=None), of stock T5X (`EncoderDecoderModel.predict_batch`
    with `temperature_sample` at temperature 0 and T5X's own network, t5x_reference.py;
    when T5X is importable) and of a straightforward T5X-style loop (reference.py), all on
    the same weights; ours / theirs speed ratios, each the median of per-pair ratios over
    interleaved repeats;
  * speculative tokens/s with draft == target (alpha = 1) and with the random draft
    (alpha ~ 0), at each gamma; the speedup over AR, the ideal speedup
    tokens_per_call * t_target / (gamma * t_draft + t_verify), and efficiency = measured / ideal;
    the same with the prefill counted (ideal e2e, efficiency e2e).
Writes results/decode_costs.json and results/decode_costs.md. Smoke run (numbers
meaningless): --target=small --draft=small --vocab=256 --gammas=2 --max_len=8 --repeats=1
--ar_repeats=1 --out=/tmp/decode_costs.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, timing
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.algorithm.network import Transformer, t5_1_1_config
from specdec_t5x.research.measure import grid, measurement, reference, t5x_reference
from specdec_t5x.research.results import harness

BASELINES = {'t5x': 'stock T5X predict_batch (temperature_sample, T5X network)',
             'reference_t5x_style': 'T5X-style loop (reference.py)'}
IDEAL = ('ideal = tokens/call * t_target / (gamma t_draft + t_verify) (decoder calls only); '
         'ideal e2e adds the once-per-sequence prefill (encoder + cache) that both methods '
         'pay: (P_t + N_ar t_target) / (P_t + P_d + N_calls (gamma t_draft + t_verify)).')


def build(size: str, seed: int, vocab: int, dtype: str):
  cfg = t5_1_1_config(size, vocab_size=vocab, dtype=jnp.dtype(dtype))
  module = Transformer(cfg)
  return cfg, module, timing.random_params(module, seed, jnp.dtype(dtype))


def run(args, script: str) -> Dict[str, Any]:
  """Everything the module docstring lists, in --cpu_kernels' mode (default: the default)."""
  with (modes.default_mode_as(args.cpu_kernels) if args.cpu_kernels is not None
        else contextlib.nullcontext()):
    return _measure(args)


def _measure(args) -> Dict[str, Any]:
  gammas = harness.ints(args.gammas)

  t_cfg, t_mod, t_params = build(args.target, 0, args.vocab, args.dtype)
  d_cfg, d_mod, d_params = build(args.draft, 1, args.vocab, args.dtype)
  enc = jnp.asarray(np.random.RandomState(0).randint(2, args.vocab, (args.batch, args.enc_len)),
                    jnp.int32)
  target, draft = (t_mod, t_params), (d_mod, d_params)

  per_draft = grid.costs(target, {'self': target, 'draft': draft}, np.asarray(enc), gammas,
                               num_calls=16, repeats=args.repeats, max_len=args.max_len)
  costs = {k: v for k, v in per_draft.items() if not k.endswith('_self')}
  costs['t_draft_step'] = costs.pop('t_draft_step_draft')
  costs['t_prefill_draft'] = costs.pop('t_prefill_draft_draft')
  print('call costs (ms):', {k: round(v * 1e3, 3) for k, v in costs.items()}, file=sys.stderr)

  gen = lambda **kw: (lambda: api.generate(target, enc, max_decode_length=args.max_len,
                                           eos_id=-1, **kw))
  ref = jax.jit(reference.greedy_decode, static_argnums=(0, 3, 4))
  fns = {'ar': gen(), 'reference_t5x_style': lambda: ref(t_cfg, t_params, enc, args.max_len, -1)}
  baselines = ['reference_t5x_style']
  if t5x_reference.available():
    stock = t5x_reference.greedy_decoder(t_cfg, args.max_len, eos_id=-1)
    fns['t5x'] = lambda: stock(t_params, enc)
    baselines.insert(0, 't5x')
  for g in gammas:
    fns[f'spec_self_g{g}'] = gen(draft=target, gamma=g)
    fns[f'spec_draft_g{g}'] = gen(draft=draft, gamma=g)
  timings = harness.interleaved(fns, args.repeats)
  med = timings.median
  # AR vs the baselines: a longer run, interleaved, ratio per pair (robust to drift in
  # machine speed), then the median.
  pairs = harness.interleaved({k: fns[k] for k in ['ar'] + baselines}, args.ar_repeats)
  ratios = pairs.speed_ratios('ar')
  pair_ratios = {k: [b / a for a, b in zip(pairs.seconds['ar'], pairs.seconds[k])]
                 for k in baselines}
  tokens = args.batch * args.max_len
  ar_out = pairs.outputs['ar']
  same_tokens = {k: bool(np.array_equal(np.asarray(ar_out.tokens), np.asarray(pairs.outputs[k])))
                 for k in baselines}

  ar_calls = float(np.max(ar_out.stats['target_calls']))
  rows = []
  for g in gammas:
    for kind, t_draft in (('self', costs['t_target_step']), ('draft', costs['t_draft_step'])):
      stats = timings.outputs[f'spec_{kind}_g{g}'].stats
      calls = float(np.sum(stats['target_calls']))
      tpc = float(np.sum(stats['generated_tokens'])) / calls
      ideal = tpc * costs['t_target_step'] / (g * t_draft + costs[f't_verify_{g + 1}'])
      measured = med['ar'] / med[f'spec_{kind}_g{g}']
      e2e = grid.ideal_end_to_end(1, ar_calls, float(np.max(stats['target_calls'])), g,
                                        per_draft, kind)
      rows.append({'draft': args.target if kind == 'self' else args.draft, 'gamma': g,
                   **stats_lib.rates(stats),
                   'tokens_per_target_call': tpc, 'speedup_measured': measured,
                   'speedup_ideal': ideal, 'efficiency': measured / ideal,
                   'speedup_ideal_end_to_end': e2e, 'efficiency_end_to_end': measured / e2e,
                   'tokens_per_s': tokens / med[f'spec_{kind}_g{g}']})
  return dict(
      target_config=str(t_cfg), draft_config=str(d_cfg), call_costs_s=costs,
      c=costs['t_draft_step'] / costs['t_target_step'],
      ar_tokens_per_s=tokens / pairs.median['ar'],
      baselines={k: {'tokens_per_s': tokens / pairs.median[k], 'ours_speed_ratio': ratios[k],
                     'pair_ratios': pair_ratios[k], 'same_tokens_as_ours': same_tokens[k]}
                 for k in baselines},
      t5x_importable=t5x_reference.available(), speculative=rows, raw_times_s=timings.seconds)


def render(report: harness.Report) -> List[str]:
  args, costs, rows = report['args'], report['call_costs_s'], report['speculative']
  quantities = [[k, f'{v * 1e3:.3f} ms'] for k, v in costs.items()]
  quantities += [['c = t_draft / t_target', f"{report['c']:.3f}"],
                 ['AR tokens/s (ours)', f"{report['ar_tokens_per_s']:.1f}"]]
  for k, b in report['baselines'].items():
    quantities += [[f'AR tokens/s ({BASELINES[k]})', f"{b['tokens_per_s']:.1f}"],
                   [f"ours / {BASELINES[k]} speed (median of {args['ar_repeats']} interleaved "
                    f"pairs; range {min(b['pair_ratios']):.2f}-{max(b['pair_ratios']):.2f}; "
                    f"same tokens: {b['same_tokens_as_ours']})", f"{b['ours_speed_ratio']:.2f}x"]]
  if not report['t5x_importable']:
    quantities.append(['stock T5X', 'not importable here: not compared'])
  return report.header(
      f"Decode costs ({report.environment['device_kind']}, batch {args['batch']}, "
      f"{args['max_len']} tokens)",
      f"Target {args['target']}, draft {args['draft']} (random T5 v1.1 weights, vocab "
      f"{args['vocab']}, {args['dtype']}); our kernel mode "
      f"{args.get('cpu_kernels') or modes.default_mode()}."
      + (' In bfloat16 our kernels sum in another order than XLA\'s dot, so greedy tokens '
         'of random weights (near-ties) may differ; results/bf16_agreement.md measures the '
         'agreement on the demo target.' if args['dtype'] == 'bfloat16' else '')) + (
      harness.table(['quantity', 'value'], quantities) + ['', IDEAL, ''] +
      harness.table(['draft', 'gamma', 'alpha', 'acceptance rate', 'tokens/call', 'speedup', 'ideal', 'efficiency',
                     'ideal e2e', 'efficiency e2e'],
                    [[r['draft'], r['gamma'], f"{r['alpha']:.2f}", f"{r['acceptance_rate']:.2f}",
                      f"{r['tokens_per_target_call']:.2f}", f"{r['speedup_measured']:.2f}x",
                      f"{r['speedup_ideal']:.2f}x", f"{r['efficiency']:.2f}",
                      f"{r['speedup_ideal_end_to_end']:.2f}x",
                      f"{r['efficiency_end_to_end']:.2f}"] for r in rows]))


main = measurement.Measurement('decode_costs', __doc__, run, render, repeats=5, flags=dict(
    target='base', draft='small', vocab=dict(type=int, default=32128), batch=1,
    enc_len=dict(type=int, default=32), max_len=48, gammas='2,4,7',
    ar_repeats=dict(type=int, default=15,
                    help='interleaved AR / T5X / T5X-style runs for their speed ratios'),
    dtype=dict(default='float32', help='weights and activations'),
    cpu_kernels=dict(default=None, help="our decodes' kernel mode on CPU "
                     "(DecodeConfig.cpu_kernels; default: the default mode), e.g. packed_bf16 "
                     'with --dtype=bfloat16'))).main
