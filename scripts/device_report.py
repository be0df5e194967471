"""Accelerator report: the paper's regime measured on one GPU/TPU, in one command.

  python scripts/device_report.py                      # default: sized for < 8 min on one H200
  python scripts/device_report.py --tiny               # CPU smoke: tiny shapes, 1-3 min, /tmp
  python scripts/device_report.py --sizes=small,xxl --parts=costs,table2,efficiency \
      --gammas=7 --num_examples=2                       # shrink: fewer sizes / parts / rows

Takes nothing but this repository (random weights; the demo family in checkpoints/demo/,
its test sample in data/demo/, its alpha in results/alpha_demo.json). Writes
{--out}.json, {--out}.md and {--out}_{costs,table2,batch}.png, where --out defaults to
results/device_<device kind>, e.g. results/device_nvidia_h200; every file records the
command, environment and device. The JSON and Markdown are rewritten after each part, so
a run cut short keeps what it measured. Parts (--parts):

1. costs: T5 v1.1 small, base, large, XL and XXL (--dtype bfloat16, random weights drawn
   on the device: costs do not depend on values), batch 1, --enc_len inputs: the prefill
   (encoder + cache) and one cached decoder call over k = 1, 2, 4, 8 positions (the target
   also at every gamma + 1 used below), timing.call_costs (interleaved medians);
   c = t_draft(1) / t_target(1) for each paper pair and t_verify(gamma + 1) / t_target(1).
2. table2: the paper's 12 Table 2 rows predicted from the paper's alpha and these costs,
   theory.walltime_improvement_measured, beside the paper's measured speedups; also the
   cost model with free verification (c only) and theory's best gamma for the costs.
3. efficiency: speculative decoding at the real shapes, greedy, --num_examples random
   inputs one at a time, --max_len tokens: small draft + XXL target (alpha ~ 0) and
   draft == target (alpha 1), measured walltime speedup over our AR vs the ideal from the
   measured tokens per call and call costs (evaluation.sweep; the goal is efficiency
   >= 0.95); our AR vs stock T5X (EncoderDecoderModel.predict_batch, temperature_sample,
   T5X's own network, t5x_reference.py) on the same params when T5X is importable.
4. demo: the demo family (float32): the Table 2 analogue with real alpha at batch 1
   (evaluation.demo_speedups) and speculative vs AR greedy throughput at --batch_sizes
   (evaluation.batch_throughput).

Time estimate for the default run on one H200 (what dominates is XLA compilation, one
program per distinct shape, so the run keeps the number of shapes small):
* start-up, imports, T5X import: ~20 s; weights of the five sizes (15.1B parameters,
  30 GB in bfloat16, drawn inside jit on the device): ~15 s.
* costs: 21 decoder programs (4 k per draft size, 5 for XXL: k = 1, 2, 4, 6, 8), each
  compiled once for both the timed and the 0-call run (~3-10 s each by depth: ~140 s),
  prefill reuses the k = 1 program; timing 21 x 5 repeats x 32 calls at 0.3-6 ms: ~15 s.
* efficiency: 4 XXL programs (AR, small draft at gamma 7, self draft at gamma 7, stock
  T5X), ~20-30 s each: ~110 s; timing 4 rows x (1 + 3 repeats) x 4 methods x ~0.3-0.6 s
  per 64-token decode: ~30 s.
* demo: ~36 small programs (costs and sweeps for 2 tasks x 2 temperatures x 2 drafts x
  2 gammas, batch 1/8/32/128 x 2 methods) at ~1.5 s: ~55 s; timing ~60 s.
Total ~7.5 min; the per-part seconds are recorded in the JSON, so a first run calibrates
this. --compile_cache=DIR reuses compiled programs on a rerun on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from specdec_t5x import generate  # noqa: E402
from specdec_t5x.algorithm import batching, network, sampling, theory, timing  # noqa: E402
from specdec_t5x.research import benchmarking, evaluation, paper, t5x_reference  # noqa: E402

PARTS = ('costs', 'table2', 'efficiency', 'demo')
# --tiny: every size name at a CPU-sized shape (emb, heads, layers, mlp), same code path.
TINY_SIZES = {'small': (16, 2, 1, 32), 'base': (24, 2, 1, 48), 'large': (32, 2, 1, 64),
              'xl': (40, 2, 1, 80), 'xxl': (48, 2, 2, 96)}
TINY_DEFAULTS = dict(sizes='small,xxl', vocab=128, enc_len=16, max_len=8, ks='1',
                     target_ks='', gammas='2', num_examples=2,
                     repeats=1, cost_calls=2, cost_repeats=1, demo_tasks='ende',
                     demo_drafts='demo_draft_s', demo_temperatures='0', demo_gammas='2',
                     demo_examples=2, demo_max_len=8, batch_sizes='1,2', batch_gamma=2)


def _ints(text: str) -> List[int]:
  return [int(x) for x in text.split(',') if x]


def parse_args(argv):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--tiny', action='store_true',
                  help='CPU smoke: tiny shapes and settings (explicit flags still win)')
  ap.add_argument('--parts', default=','.join(PARTS), help=f'any of {",".join(PARTS)}')
  ap.add_argument('--sizes', default='small,base,large,xl,xxl', help='T5 v1.1 sizes to build')
  ap.add_argument('--target', default='xxl', help='target size of the paper pairs')
  ap.add_argument('--dtype', default='bfloat16')
  ap.add_argument('--vocab', type=int, default=32128)
  ap.add_argument('--enc_len', type=int, default=128)
  ap.add_argument('--max_len', type=int, default=64, help='decoded tokens (part 3)')
  ap.add_argument('--ks', default='1,2,4,8', help='positions per timed decoder call')
  ap.add_argument('--target_ks', default='4,6,8',
                  help="more k for the target: the paper's gamma + 1 (Table 2 interpolates "
                  'between measured k where one is missing)')
  ap.add_argument('--cost_calls', type=int, default=32)
  ap.add_argument('--cost_repeats', type=int, default=5)
  ap.add_argument('--gammas', default='7', help='part 3 gammas')
  ap.add_argument('--num_examples', type=int, default=4, help='part 3 inputs')
  ap.add_argument('--repeats', type=int, default=3, help='interleaved timing repeats')
  ap.add_argument('--demo_tasks', default='ende,summarize')
  ap.add_argument('--demo_drafts', default='demo_draft_m,demo_draft_s')
  ap.add_argument('--demo_temperatures', default='0,1')
  ap.add_argument('--demo_gammas', default='3,7')
  ap.add_argument('--demo_examples', type=int, default=10)
  ap.add_argument('--demo_max_len', type=int, default=64)
  ap.add_argument('--alpha_json', default=os.path.join(REPO, 'results', 'alpha_demo.json'))
  ap.add_argument('--batch_sizes', default='1,8,32,128')
  ap.add_argument('--batch_gamma', type=int, default=3)
  ap.add_argument('--compile_cache', default='', help='persistent XLA compilation cache dir')
  ap.add_argument('--out', default='', help='output prefix (default results/device_<kind>)')
  if '--tiny' in argv:
    ap.set_defaults(**TINY_DEFAULTS)
  args = ap.parse_args(argv)
  unknown = set(args.parts.split(',')) - set(PARTS)
  if unknown:
    raise ValueError(f'--parts: unknown {sorted(unknown)}; choose from {PARTS}.')
  for size in args.sizes.split(',') + [args.target]:
    if size not in network.T5_1_1_SIZES:
      raise ValueError(f'--sizes/--target: unknown size {size!r}; choose from '
                       f'{sorted(network.T5_1_1_SIZES)}.')
  return args


def device_slug() -> str:
  return re.sub(r'[^a-z0-9]+', '_', jax.devices()[0].device_kind.lower()).strip('_')


def build_models(args) -> Dict[str, Any]:
  """size -> (config, module, params): random weights in --dtype, drawn on the device."""
  dtype = jnp.dtype(args.dtype)
  sizes = list(dict.fromkeys(args.sizes.split(',') + [args.target]))
  models = {}
  for i, size in enumerate(sizes):
    kw = dict(vocab_size=args.vocab, dtype=dtype)
    if args.tiny:
      emb, heads, layers, mlp = TINY_SIZES[size]
      kw.update(emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
                num_decoder_layers=layers, mlp_dim=mlp, head_dim=8)
    cfg = network.t5_1_1_config(size, **kw)
    module = network.Transformer(cfg)
    models[size] = (cfg, module, timing.block(timing.random_params(module, i, dtype)))
  return models


def num_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def verify_ks(args) -> List[int]:
  """Positions per call the target is timed at: --ks, --target_ks and every part-3
  gamma + 1."""
  return sorted(set(_ints(args.ks) + _ints(args.target_ks) + [g + 1 for g in _ints(args.gammas)]))


# ------------------------------------------------------------------ 1. costs


def part_costs(args, models, enc) -> Dict[str, Any]:
  cache_len = args.max_len + max(_ints(args.gammas) + [row.gamma for row in paper.TABLE_2]) + 1
  ks = {size: verify_ks(args) if size == args.target else _ints(args.ks) for size in models}
  specs = {f'{size}/{k}': (module, params, k) for size, (_, module, params) in models.items()
           for k in ks[size]}
  calls = timing.call_costs(specs, enc, args.cost_calls, args.cost_repeats, cache_len)
  sizes = {}
  for size, (cfg, module, params) in models.items():
    t = {k: calls[f'{size}/{k}'] for k in ks[size]}
    sizes[size] = {
        'config': str(cfg), 'num_params': num_params(params),
        'prefill_s': timing.prefill_cost(module, params, enc, cache_len,
                                               args.cost_repeats),
        'call_s': t, 'call_ratio_to_k1': {k: v / t[1] for k, v in t.items()}}
  target = sizes[args.target]['call_s']
  pairs = {size: {'c': sizes[size]['call_s'][1] / target[1]}
           for size in models if size != args.target}
  return {'cache_len': cache_len, 'enc_len': args.enc_len, 'dtype': args.dtype,
          'sizes': sizes, 'target': args.target, 'pairs': pairs,
          'verify_ratio': {k - 1: target[k] / target[1] for k in target if k > 1}}


def step_costs(costs: Dict[str, Any], draft: str, name: str) -> Dict[str, float]:
  """The measured costs in evaluation.costs' keys, for `draft` (a size) named `name`."""
  t, d = costs['sizes'][costs['target']], costs['sizes'][draft]
  out = {'t_target_step': t['call_s'][1], 't_prefill_target': t['prefill_s'],
         f't_draft_step_{name}': d['call_s'][1], f't_prefill_draft_{name}': d['prefill_s']}
  out.update({f't_verify_{k}': v for k, v in t['call_s'].items() if k > 1})
  return out


# ------------------------------------------------------------------ 2. table 2


def part_table2(costs: Dict[str, Any]) -> List[Dict[str, Any]]:
  """The paper's rows predicted from their alpha and the measured costs (see module doc).

  t_verify(gamma + 1) is measured, or interpolated linearly between measured k (held at
  the largest measured k beyond it), as the row's `verify` says.
  """
  t = costs['sizes'][costs['target']]['call_s']
  ks = sorted(t)
  verify = lambda g: float(np.interp(g + 1, ks, [t[k] for k in ks]))
  rows = []
  for paper_row in paper.TABLE_2:
    draft, gamma, alpha = paper_row.draft, paper_row.gamma, paper_row.alpha
    row = {'task': paper_row.task, 'draft': draft, 'temperature': paper_row.temperature,
           'gamma': gamma, 'alpha_paper': alpha, 'speedup_paper': paper_row.speedup}
    if draft not in costs['sizes']:
      rows.append(dict(row, note=f'not measured (--sizes lacks {draft})'))
      continue
    t_d = costs['sizes'][draft]['call_s'][1]
    best = int(theory.best_gamma_measured(alpha, t_d, t[1], verify, max_gamma=max(ks) - 1))
    rows.append(dict(
        row, c=t_d / t[1], verify_ratio=verify(gamma) / t[1],
        verify='measured' if gamma + 1 in t else
        'interpolated' if gamma + 1 < max(ks) else f'held at k={max(ks)}',
        speedup_predicted=float(theory.walltime_improvement_measured(
            alpha, gamma, t_d, t[1], verify(gamma))),
        speedup_free_verify=float(theory.walltime_improvement(alpha, gamma, t_d / t[1])),
        best_gamma=best, speedup_predicted_best=float(theory.walltime_improvement_measured(
            alpha, best, t_d, t[1], verify(best)))))
  return rows


# ------------------------------------------------------------------ 3. efficiency


def part_efficiency(args, models, costs) -> Dict[str, Any]:
  cfg, module, params = models[args.target]
  target = (module, params)
  enc = np.random.RandomState(1).randint(
      2, args.vocab, (args.num_examples, args.enc_len)).astype(np.int32)
  cost, drafts = step_costs(costs, args.target, 'self'), {'self': target}
  if costs['pairs']:  # the smallest draft size measured
    small = min(costs['pairs'], key=lambda s: costs['sizes'][s]['num_params'])
    cost.update(step_costs(costs, small, small))
    drafts = {small: (models[small][1], models[small][2]), **drafts}
  res = evaluation.sweep(target, drafts, enc, args.max_len, _ints(args.gammas),
                         sampling.SamplingConfig(0.0), cost, args.repeats, eos_id=-1)
  res['draft_sizes'] = {name: args.target if name == 'self' else name for name in drafts}
  ours = lambda: generate(target, enc[:1], max_decode_length=args.max_len, eos_id=-1).tokens
  fns = {'ar': ours}
  if t5x_reference.available():
    stock = t5x_reference.greedy_decoder(cfg, args.max_len, eos_id=-1)
    fns['t5x'] = lambda: stock(params, enc[:1])
  times = timing.median_times(fns, args.repeats)
  res['ar_vs_t5x'] = {
      't5x_importable': t5x_reference.available(), 'raw_times_s': times,
      'ar_tokens_per_s': args.max_len / float(np.median(times['ar']))}
  if 't5x' in fns:
    res['ar_vs_t5x'].update(
        t5x_tokens_per_s=args.max_len / float(np.median(times['t5x'])),
        ours_speed_ratio=timing.speed_ratios(times, 'ar')['t5x'],
        same_tokens=bool(np.array_equal(np.asarray(ours()), np.asarray(fns['t5x']()))))
  return res


# ------------------------------------------------------------------ 4. demo


def part_demo(args) -> Dict[str, Any]:
  cells = []
  if os.path.exists(args.alpha_json):
    with open(args.alpha_json) as f:
      cells = json.load(f)['cells']
  groups = evaluation.demo_speedups(
      'demo_target', args.demo_drafts.split(','), args.demo_tasks.split(','),
      [float(t) for t in args.demo_temperatures.split(',')], _ints(args.demo_gammas),
      args.demo_examples, args.demo_max_len, args.repeats, args.cost_calls,
      args.cost_repeats, alpha_cells=cells)
  batches = _ints(args.batch_sizes)
  task = args.demo_tasks.split(',')[0]
  examples = evaluation.load_examples(task, max(batches))
  enc = batching.pad_batch([e.inputs for e in examples])  # batches run at their buckets
  draft = evaluation.load_model(args.demo_drafts.split(',')[0], task)
  batch_rows = evaluation.batch_throughput(
      evaluation.load_model('demo_target'), draft, enc, batches, [args.batch_gamma],
      args.demo_max_len, args.repeats)
  return {'table2': groups, 'batch': {'task': task, 'draft': args.demo_drafts.split(',')[0],
                                      'rows': batch_rows}}


# ------------------------------------------------------------------ rendering


def _f(value, fmt='.2f', unit='') -> str:
  return '-' if value is None else f'{value:{fmt}}{unit}'


def render(result) -> str:
  env = result['environment']
  lines = [f"# Accelerator report: {env['device_kind']}", '',
           f"Command: `{result['command']}`", '', f'Environment: {env}', '',
           'Seconds per part (compilation included): ' + ', '.join(
               f'{k} {v:.0f}' for k, v in result['part_seconds'].items()), '']
  costs = result.get('costs')
  if costs:
    ks = sorted({k for s in costs['sizes'].values() for k in s['call_s']})
    lines += [f"## 1. Call costs (T5 v1.1 shapes, random {costs['dtype']} weights, batch 1, "
              f"{costs['enc_len']} input tokens, cache {costs['cache_len']})", '',
              'Prefill = encoder + cache, once per sequence; t(k) = one cached decoder call '
              'over k positions (interleaved medians, timing.call_costs).', '',
              '| size | params | prefill ms | t(1) ms | ' + ' | '.join(
                  f't({k})/t(1)' for k in ks if k > 1) + ' |',
              '|---|---:|---:|---:|' + '---:|' * (len(ks) - 1)]
    for size, s in costs['sizes'].items():
      lines.append(f"| {size} | {s['num_params'] / 1e6:,.0f}M | {s['prefill_s'] * 1e3:.2f} | "
                   f"{s['call_s'][1] * 1e3:.3f} | " + ' | '.join(
                       _f(s['call_ratio_to_k1'].get(k)) for k in ks if k > 1) + ' |')
    lines += ['', f"Pairs with the {costs['target']} target: " + ', '.join(
        f"{d}: c = {p['c']:.3f}" for d, p in costs['pairs'].items()) + '. Verification '
        't_verify(gamma + 1) / t(1): ' + ', '.join(
            f'gamma {g}: {r:.2f}' for g, r in sorted(costs['verify_ratio'].items())) + '.', '']
  rows = result.get('table2')
  if rows:
    lines += ['## 2. The paper\'s Table 2 predicted from its alpha and these costs', '',
              'Predicted = E[tokens](alpha, gamma) t(1) / (gamma t_draft + t_verify(gamma + 1)) '
              '(theory.walltime_improvement_measured); free verify = the paper\'s model with '
              't_verify = t(1); best gamma = theory.best_gamma_measured for these costs. The '
              'paper measured on one TPU-v4 with fine-tuned T5X checkpoints.', '',
              '| Task | Draft | Temp | gamma | alpha | paper | predicted | free verify | c | '
              't_verify/t(1) | best gamma (predicted) |', '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
      if 'note' in r:
        lines.append(f"| {r['task']} | {r['draft']} | {r['temperature']} | {r['gamma']} | "
                     f"{r['alpha_paper']} | {r['speedup_paper']}x | {r['note']} | | | | |")
        continue
      lines.append(f"| {r['task']} | {r['draft']} | {r['temperature']} | {r['gamma']} | "
                   f"{r['alpha_paper']} | {r['speedup_paper']}x | {r['speedup_predicted']:.2f}x | "
                   f"{r['speedup_free_verify']:.2f}x | {r['c']:.3f} | {r['verify_ratio']:.2f}"
                   f"{'' if r['verify'] == 'measured' else ' (' + r['verify'] + ')'} | "
                   f"{r['best_gamma']} ({r['speedup_predicted_best']:.2f}x) |")
    lines.append('')
  eff = result.get('efficiency')
  if eff:
    lines += ['## 3. Efficiency at the real shapes (random weights, greedy, batch 1)', '',
              'Speed = AR time / speculative time on the same inputs (interleaved medians); '
              'ideal = tokens/call t(1) / (gamma t_draft + t_verify) from the costs above; '
              'ideal e2e adds the prefill each sequence pays once. Goal: efficiency >= 0.95.', '',
              '| draft | gamma | alpha | tokens/call | speed | ideal | efficiency | ideal e2e | '
              'eff. e2e |', '|---|---|---|---|---|---|---|---|---|']
    for name, d in eff['drafts'].items():
      for r in d['rows']:
        lines.append(f"| {eff['draft_sizes'][name]} ({name}) | {r['gamma']} | "
                     f"{r['alpha_empirical']:.2f} | {r['tokens_per_target_call']:.2f} | "
                     f"{r['speedup_measured']:.2f}x | {r['speedup_ideal']:.2f}x | "
                     f"{r['efficiency']:.2f} | {_f(r['speedup_ideal_end_to_end'], unit='x')} | "
                     f"{_f(r['efficiency_end_to_end'])} |")
    cmp_ = eff['ar_vs_t5x']
    lines += ['', f"Our AR: {cmp_['ar_tokens_per_s']:.1f} tokens/s. " + (
        f"Stock T5X (EncoderDecoderModel.predict_batch, temperature_sample, T5X network, same "
        f"params): {cmp_['t5x_tokens_per_s']:.1f} tokens/s; ours / T5X speed "
        f"{cmp_['ours_speed_ratio']:.2f}x (median of per-pair ratios); same tokens: "
        f"{cmp_['same_tokens']}." if 'ours_speed_ratio' in cmp_ else
        'T5X is not importable here: not compared.'), '']
  demo = result.get('demo')
  if demo:
    lines += ['## 4. The demo family (float32)', '', 'Table 2 analogue at batch 1 (alpha: '
              'teacher-forced, results/alpha_demo.json; speed per generated token; `<-` the '
              'best measured gamma):', '',
              '| Task | Draft | Temp | gamma | alpha | tokens/call | speed | theory | ideal | '
              'efficiency | eff. e2e | c |', '|---|---|---|---|---|---|---|---|---|---|---|---|']
    for grp in demo['table2']:
      for name, d in grp['drafts'].items():
        for r in d['rows']:
          mark = ' <-' if r['gamma'] == d['best_measured_gamma'] else ''
          lines.append(f"| {grp['task']} | {name} | {grp['temperature']:g} | {r['gamma']}{mark} | "
                       f"{d['alpha_for_choice']:.2f} | {r['tokens_per_target_call']:.2f} | "
                       f"{r['speedup_measured']:.2f}x | {r['speedup_theory']:.2f}x | "
                       f"{r['speedup_ideal']:.2f}x | {r['efficiency']:.2f} | "
                       f"{_f(r['efficiency_end_to_end'])} | {d['c']:.3f} |")
    b = demo['batch']
    lines += ['', f"Greedy throughput, demo_target + {b['draft']}, task {b['task']}:", '',
              '| batch | method | tokens/s | speedup vs AR | alpha | tokens/call | rows == batch-1 |',
              '|---:|---|---:|---:|---:|---:|---|']
    lines += [f"| {r['batch']} | {r['method']} | {r['tokens_per_s']:.1f} | "
              f"{r['speedup_vs_ar']:.2f}x | {_f(r['alpha_empirical'])} | {r['mean_tokens_per_target_call']:.2f} | "
              f"{r['rows_equal_batch1']} ({r['rows_checked']}) |" for r in b['rows']]
  return '\n'.join(lines) + '\n'


def plot(result, out: str) -> List[str]:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  paths = []
  costs, rows, demo = result.get('costs'), result.get('table2'), result.get('demo')
  if costs:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(costs['sizes'])
    left.bar(names, [costs['sizes'][n]['call_s'][1] * 1e3 for n in names], label='t(1)')
    left.plot(names, [costs['sizes'][n]['prefill_s'] * 1e3 for n in names], 'ko-',
              label='prefill')
    left.set_yscale('log'), left.set_ylabel('ms'), left.legend()
    for n in names:
      r = costs['sizes'][n]['call_ratio_to_k1']
      right.plot(sorted(r), [r[k] for k in sorted(r)], 'o-', label=n)
    right.set_xlabel('positions per call k'), right.set_ylabel('t(k) / t(1)'), right.legend()
    fig.suptitle(f"{result['environment']['device_kind']}: call costs ({costs['dtype']})")
    paths.append(_save_fig(fig, f'{out}_costs.png'))
  if rows and any('speedup_predicted' in r for r in rows):
    fig, ax = plt.subplots(figsize=(6, 4.5))
    done = [r for r in rows if 'speedup_predicted' in r]
    ax.scatter([r['speedup_paper'] for r in done], [r['speedup_predicted'] for r in done])
    for r in done:
      ax.annotate(f"{r['task']} {r['draft']} t={r['temperature']}",
                  (r['speedup_paper'], r['speedup_predicted']), fontsize=7)
    top = max(max(r['speedup_paper'], r['speedup_predicted']) for r in done) * 1.1
    ax.plot([1, top], [1, top], '--', color='gray')
    ax.set_xlabel('paper (TPU-v4)'), ax.set_ylabel('predicted from these costs')
    ax.set_title('Table 2 speedups')
    paths.append(_save_fig(fig, f'{out}_table2.png'))
  if demo:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    brows = demo['batch']['rows']
    for method in dict.fromkeys(r['method'] for r in brows):
      pts = [(r['batch'], r['tokens_per_s']) for r in brows if r['method'] == method]
      ax.plot(*zip(*pts), marker='o', label=method)
    ax.set_xscale('log', base=2), ax.set_yscale('log')
    ax.set_xlabel('batch'), ax.set_ylabel('tokens/s'), ax.legend()
    paths.append(_save_fig(fig, f'{out}_batch.png'))
  return paths


def _save_fig(fig, path: str) -> str:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _save(result, out):
  benchmarking.write_json(out + '.json', result)
  benchmarking.write_text(out + '.md', render(result))


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  if args.compile_cache:
    jax.config.update('jax_compilation_cache_dir', args.compile_cache)
  out = args.out or (os.path.join('/tmp', 'device_report_tiny') if args.tiny else
                     os.path.join(REPO, 'results', f'device_{device_slug()}'))
  parts = args.parts.split(',')
  env = dict(benchmarking.environment(), devices=[str(d) for d in jax.devices()],
             t5x_importable=t5x_reference.available(), xla_flags=os.environ.get('XLA_FLAGS'))
  result: Dict[str, Any] = {'command': 'python scripts/device_report.py ' + ' '.join(argv),
                            'environment': env, 'args': vars(args), 'part_seconds': {},
                            'part_cpu_seconds': {}}

  def timed_part(name, fn):
    start, cpu = time.perf_counter(), time.process_time()
    result[name] = fn()
    result['part_seconds'][name] = time.perf_counter() - start
    result['part_cpu_seconds'][name] = time.process_time() - cpu
    _save(result, out)
    print(f'[device_report] {name}: {result["part_seconds"][name]:.0f} s '
          f'({result["part_cpu_seconds"][name]:.0f} s CPU)', file=sys.stderr, flush=True)

  if {'costs', 'table2', 'efficiency'} & set(parts):  # the last two need the costs
    models: Dict[str, Any] = {}

    def weights():
      models.update(build_models(args))
      return {size: num_params(m[2]) for size, m in models.items()}
    timed_part('weights', weights)
    enc = jnp.asarray(np.random.RandomState(0).randint(2, args.vocab, (1, args.enc_len)),
                      jnp.int32)
    timed_part('costs', lambda: part_costs(args, models, enc))
    if 'table2' in parts:
      timed_part('table2', lambda: part_table2(result['costs']))
    if 'efficiency' in parts:
      timed_part('efficiency', lambda: part_efficiency(args, models, result['costs']))
    del models
  if 'demo' in parts:
    timed_part('demo', lambda: part_demo(args))
  result['plots'] = plot(result, out)
  _save(result, out)
  print(render(result))
  return result


if __name__ == '__main__':
  main()
