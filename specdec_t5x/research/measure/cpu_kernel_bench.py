"""The packed CPU matmul (algorithm/cpu/f32.py) against XLA's dot, on the demo family: its
bfloat16 panels (the default for weights bfloat16 holds exactly, as the demo family's,
restored from bfloat16 checkpoints) and float32 panels (DecodeConfig.cpu_kernels='packed_f32').

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=cpu_kernels \
      [--rows=40] [--gamma=3] [--max_len=64] [--repeats=5]

Run on an idle machine. Three measurements, each with XLA's dot and with the packed kernel's
float32 and bfloat16 panels:
1. per-call costs (timing.call_costs at the demo's bucket and cache sizes: a one-token
   target step, a draft step, the gamma+1-position verify call, the prefill), from which
   c = t_draft / t_target and r = t_verify / t_target, and the paper's ideal speedup
   (tokens per call) / (gamma c + r) at the measured tokens per call;
2. AR and speculative decoding of the first `rows` demo EN->DE test sentences, each alone
   (batch 1, greedy), all six runs interleaved in one process (each decode's
   DecodeConfig.cpu_kernels names its mode; the median of --repeats). Every output is checked
   equal to XLA's AR output.
3. the same per-call costs for random-weight T5 v1.1 targets of --sizes (default small and
   base; float32 weights with bfloat16 values, as restored from a bfloat16 checkpoint),
   whose decoder weights (~200 MB, ~700 MB in float32) dwarf the demo target's (41 MB):
   the verify/step ratio r at real sizes.
Writes results/cpu_kernels.{json,md}.
"""

from __future__ import annotations

import argparse
import json
from typing import List

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import network, timing
from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.research.measure import demo_data, evaluation, grid, measurement
from specdec_t5x.research.results import harness

# The table's names of DecodeConfig.cpu_kernels's modes ('packed': bfloat16 panels).
MODES = {'xla': 'xla', 'packed f32': 'packed_f32', 'packed': 'packed'}


def kernels(mode: str):
  """The call costs' kernel mode (they take no DecodeConfig): the default inside the block."""
  return modes.default_mode_as(MODES[mode])


def measure(args, script: str) -> dict:
  """The call costs, the interleaved decodes and the T5 v1.1 sizes' costs of every mode."""
  target, draft = evaluation.load_model('demo_target'), evaluation.load_model('demo_draft_m')
  enc, _, _ = demo_data.load_task('ende', args.rows)
  verify = f't_verify_{args.gamma + 1}'

  costs = {}
  for mode in MODES:
    with kernels(mode):
      c = grid.costs(target, {'m': draft}, enc, [args.gamma], max_len=args.max_len,
                      repeats=args.repeats)
    costs[mode] = {k: v * 1e3 for k, v in c.items()}  # milliseconds
    print(mode, json.dumps(costs[mode]), flush=True)

  fns = {}
  for mode in MODES:
    fns[f'AR {mode}'] = demo_data.row_decoder(target, enc, args.max_len,
                                              cpu_kernels=MODES[mode])
    fns[f'speculative {mode}'] = demo_data.row_decoder(
        target, enc, args.max_len, draft=draft, gamma=args.gamma, cpu_kernels=MODES[mode])
  results = demo_data.row_results(harness.interleaved(fns, args.repeats), base='AR xla')
  for name, r in results.items():
    print(name, json.dumps(r), flush=True)
  tokens_per_call = results['speculative packed']['mean_tokens_per_target_call']
  cost_rows = []
  for mode, c in costs.items():
    ratio_c, ratio_r = c['t_draft_step_m'] / c['t_target_step'], c[verify] / c['t_target_step']
    cost_rows.append(dict(mode=mode, **c, c=ratio_c, r=ratio_r,
                          ideal=tokens_per_call / (args.gamma * ratio_c + ratio_r)))
  e2e = {mode: results[f'AR {mode}']['seconds'] / results[f'speculative {mode}']['seconds']
         for mode in MODES}

  sizes = []
  for size in [x for x in args.sizes.split(',') if x]:
    module = network.Transformer(network.t5_1_1_config(size, dtype='float32'))
    params = timing.random_params(module, dtype=jnp.bfloat16)  # bfloat16 values, float32
    model = (module, jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params))
    row = dict(size=size)
    for mode in MODES:
      with kernels(mode):
        c = grid.costs(model, {}, enc[:1], [args.gamma], max_len=args.max_len,
                        repeats=args.repeats)
      row[mode] = {k: v * 1e3 for k, v in c.items()}
      row[f'r_{mode}'] = c[verify] / c['t_target_step']
    sizes.append(row)
    print(json.dumps(row), flush=True)

  return dict(costs=cost_rows, decodes=results, speculative_speedup=e2e, sizes=sizes,
              ar_speedup_packed_vs_xla=results['AR packed']['speedup_vs_ar'])


def render(report: harness.Report) -> List[str]:
  args, cost_rows, results = argparse.Namespace(**report['args']), report['costs'], report[
      'decodes']
  e2e, sizes, verify = report['speculative_speedup'], report['sizes'], f't_verify_{args.gamma + 1}'
  tokens_per_call = results['speculative packed']['mean_tokens_per_target_call']
  return (report.header(
      'The packed CPU matmul vs XLA dot (demo family, batch 1, greedy)',
      f'gamma {args.gamma}, cache for max_decode_length {args.max_len}, encoder inputs at '
      f'their length bucket; costs are medians of {args.repeats} interleaved repeats of 32 '
      'calls (timing.call_costs). ideal = tokens per call / (gamma c + r), decoder calls '
      'only, at the speculative run\'s tokens per call '
      f'({tokens_per_call:.2f}).') +
      harness.table(['matmul', 'target step (ms)', 'draft step (ms)',
                     f'verify {args.gamma + 1} (ms)', 'target prefill (ms)', 'draft prefill (ms)',
                     'c', 'r', 'ideal'],
                    [[r['mode'], f"{r['t_target_step']:.3f}", f"{r['t_draft_step_m']:.3f}",
                      f"{r[verify]:.3f}", f"{r['t_prefill_target']:.2f}",
                      f"{r['t_prefill_draft_m']:.2f}", f"{r['c']:.3f}", f"{r['r']:.2f}",
                      f"{r['ideal']:.2f}x"] for r in cost_rows], 'lrrrrrrrr') +
      ['', f'Decoding the first {args.rows} demo EN->DE test sentences one at a time, the '
       f'{2 * len(MODES)} runs interleaved (median of {args.repeats}):', ''] +
      harness.table(['run', 'seconds', 'speed vs AR xla', 'tokens/call', 'output == AR xla'],
                    [[name, f"{r['seconds']:.3f}", f"{r['speedup_vs_ar']:.2f}x",
                      f"{r['mean_tokens_per_target_call']:.2f}", r['equal_to_ar']]
                     for name, r in results.items()], 'lrrrl') +
      ['', '"packed": bfloat16 panels (the default: the demo family\'s weights are bfloat16 '
       'values), "packed f32": float32 panels (SPECDEC_CPU_KERNELS=f32); both give bitwise '
       'the same products.', '',
       'Speculative over AR with the same matmul: ' + ', '.join(
          f'{mode} {v:.2f}x' for mode, v in e2e.items()) + '.', '',
       f'Random-weight T5 v1.1 targets (float32 weights of bfloat16 values, the demo\'s first '
       f'input, cache for {args.max_len} tokens): one-token step and {args.gamma + 1}-position '
       'verify call (ms), and r = verify / step.', ''] +
      harness.table(['size'] + [f'{h} {mode}' for mode in MODES
                                for h in ('step', f'verify {args.gamma + 1}', 'r')],
                    [[r['size']] + [x for mode in MODES for x in (
                        f"{r[mode]['t_target_step']:.2f}", f"{r[mode][verify]:.2f}",
                        f"{r[f'r_{mode}']:.2f}")] for r in sizes], 'l' + 'rrr' * len(MODES)))


main = measurement.Measurement(
    'cpu_kernels', __doc__, measure, render, repeats=5, prints=False, flags=dict(
        rows=40, gamma=3, max_len=64,
        sizes=dict(default='small,base', help='T5 v1.1 sizes for part 3 ("" = none)'))).main
