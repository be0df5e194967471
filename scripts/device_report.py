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
   c = t_draft(1) / t_target(1) for each paper pair and t_verify(gamma + 1) / t_target(1);
   beside them the compiler's predictions of the same (--compiled_json, from
   scripts/compiled_report.py), so a first run calibrates that model.
2. table2: the paper's 12 Table 2 rows predicted from the paper's alpha and these costs,
   theory.walltime_improvement_measured, beside the paper's measured speedups; also the
   cost model with free verification (c only) and theory's best gamma for the costs.
3. efficiency: speculative decoding at the real shapes, greedy, --num_examples random
   inputs one at a time, --max_len tokens: small draft + XXL target (alpha ~ 0) and
   draft == target (alpha 1), measured walltime speedup over our AR vs the ideal from the
   measured tokens per call and call costs (speed.sweep; the goal is efficiency
   >= 0.95); our AR vs stock T5X (EncoderDecoderModel.predict_batch, temperature_sample,
   T5X's own network, t5x_reference.py) on the same params when T5X is importable.
4. demo: the demo family (float32): the Table 2 analogue with real alpha at batch 1
   (speed.demo_speedups) and speculative vs AR greedy throughput at --batch_sizes
   (speed.batch_throughput).

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

import json
import os
import re
import sys
import time
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, batching, network, sampling, theory, timing
from specdec_t5x.research.measure import demo_data, evaluation, grid, speed, t5x_reference
from specdec_t5x.research.predict import device_tables, paper
from specdec_t5x.research.results import harness

PARTS = ('costs', 'table2', 'efficiency', 'demo')
# --tiny: every size name at a CPU-sized shape (emb, heads, layers, mlp), same code path.
TINY_SIZES = {'small': (16, 2, 1, 32), 'base': (24, 2, 1, 48), 'large': (32, 2, 1, 64),
              'xl': (40, 2, 1, 80), 'xxl': (48, 2, 2, 96)}
TINY_DEFAULTS = dict(sizes='small,xxl', vocab=128, enc_len=16, max_len=8, ks='1',
                     target_ks='', gammas='2', num_examples=2,
                     repeats=1, cost_calls=2, cost_repeats=1, demo_tasks='ende',
                     demo_drafts='demo_draft_s', demo_temperatures='0', demo_gammas='2',
                     demo_examples=2, demo_max_len=8, batch_sizes='1,2', batch_gamma=2)


def parse_args(argv):
  ap = harness.parser(__doc__, '', repeats=3)
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
  ap.add_argument('--demo_tasks', default='ende,summarize')
  ap.add_argument('--demo_drafts', default='demo_draft_m,demo_draft_s')
  ap.add_argument('--demo_temperatures', default='0,1')
  ap.add_argument('--demo_gammas', default='3,7')
  ap.add_argument('--demo_examples', type=int, default=10)
  ap.add_argument('--demo_max_len', type=int, default=64)
  ap.add_argument('--alpha_json', default=harness.results_path(__file__, 'alpha_demo.json'))
  ap.add_argument('--batch_sizes', default='1,8,32,128')
  ap.add_argument('--batch_gamma', type=int, default=3)
  ap.add_argument('--compile_cache', default='', help='persistent XLA compilation cache dir')
  ap.add_argument('--compiled_json', default=harness.results_path(__file__, 'compiled_table2.json'),
                  help="the compiler's predictions (scripts/compiled_report.py), shown beside "
                  'the measured costs when the file exists')
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
  gammas = harness.ints(args.gammas)
  return sorted(set(harness.ints(args.ks) + harness.ints(args.target_ks) + [g + 1 for g in gammas]))


# ------------------------------------------------------------------ 1. costs


def part_costs(args, models, enc) -> Dict[str, Any]:
  gammas = harness.ints(args.gammas) + [row.gamma for row in paper.TABLE_2]
  cache_len = args.max_len + max(gammas) + 1
  ks = {size: verify_ks(args) if size == args.target else harness.ints(args.ks) for size in models}
  timed = grid.call_seconds({size: (module, params, ks[size])
                             for size, (_, module, params) in models.items()},
                            enc, args.cost_calls, args.cost_repeats, cache_len)
  sizes = {}
  for size, (cfg, _, params) in models.items():
    t = timed[size]['call_s']
    sizes[size] = {'config': str(cfg), 'num_params': num_params(params),
                   'prefill_s': timed[size]['prefill_s'], 'call_s': t,
                   'call_ratio_to_k1': {k: v / t[1] for k, v in t.items()}}
  target = sizes[args.target]['call_s']
  pairs = {size: {'c': sizes[size]['call_s'][1] / target[1]}
           for size in models if size != args.target}
  return {'cache_len': cache_len, 'enc_len': args.enc_len, 'dtype': args.dtype,
          'sizes': sizes, 'target': args.target, 'pairs': pairs,
          'verify_ratio': {k - 1: target[k] / target[1] for k in target if k > 1}}


def step_costs(costs: Dict[str, Any], draft: str, name: str) -> Dict[str, float]:
  """The measured costs in speed.costs' keys, for `draft` (a size) named `name`."""
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
  res = speed.sweep(target, drafts, enc, args.max_len, harness.ints(args.gammas),
                         sampling.SamplingConfig(0.0), cost, args.repeats, eos_id=-1)
  res['draft_sizes'] = {name: args.target if name == 'self' else name for name in drafts}
  fns = {'ar': lambda: api.generate(target, enc[:1], max_decode_length=args.max_len,
                                    eos_id=-1).tokens}
  if t5x_reference.available():
    stock = t5x_reference.greedy_decoder(cfg, args.max_len, eos_id=-1)
    fns['t5x'] = lambda: stock(params, enc[:1])
  timings = harness.interleaved(fns, args.repeats)
  res['ar_vs_t5x'] = {
      't5x_importable': t5x_reference.available(), 'raw_times_s': timings.seconds,
      'ar_tokens_per_s': args.max_len / timings.median['ar']}
  if 't5x' in fns:
    res['ar_vs_t5x'].update(
        t5x_tokens_per_s=args.max_len / timings.median['t5x'],
        ours_speed_ratio=timings.speed_ratios('ar')['t5x'],
        same_tokens=bool(np.array_equal(np.asarray(timings.outputs['ar']),
                                        np.asarray(timings.outputs['t5x']))))
  return res


# ------------------------------------------------------------------ 4. demo


def part_demo(args) -> Dict[str, Any]:
  groups = speed.demo_speedups(
      'demo_target', args.demo_drafts.split(','), args.demo_tasks.split(','),
      [float(t) for t in args.demo_temperatures.split(',')], harness.ints(args.demo_gammas),
      args.demo_examples, args.demo_max_len, args.repeats, args.cost_calls,
      args.cost_repeats, alpha_cells=demo_data.alpha_cells(args.alpha_json))
  batches = harness.ints(args.batch_sizes)
  task = args.demo_tasks.split(',')[0]
  examples = evaluation.load_examples(task, max(batches))
  enc = batching.pad_batch([e.inputs for e in examples])  # batches run at their buckets
  draft = evaluation.load_model(args.demo_drafts.split(',')[0], task)
  batch_rows = speed.batch_throughput(
      evaluation.load_model('demo_target'), draft, enc, batches, [args.batch_gamma],
      args.demo_max_len, args.repeats)
  return {'table2': groups, 'batch': {'task': task, 'draft': args.demo_drafts.split(',')[0],
                                      'rows': batch_rows}}


def main(argv=None):
  args = parse_args(list(sys.argv[1:] if argv is None else argv))
  if args.compile_cache:
    jax.config.update('jax_compilation_cache_dir', args.compile_cache)
  out = args.out or (os.path.join('/tmp', 'device_report_tiny') if args.tiny else
                     harness.results_path(__file__, f'device_{device_slug()}'))
  parts = args.parts.split(',')
  report = harness.Report(__file__, args, argv, out=out,
                          devices=[str(d) for d in jax.devices()],
                          t5x_importable=t5x_reference.available(),
                          xla_flags=os.environ.get('XLA_FLAGS'))
  report.data.update(part_seconds={}, part_cpu_seconds={})

  def timed_part(name, fn):
    start, cpu = time.perf_counter(), time.process_time()
    report[name] = fn()
    report['part_seconds'][name] = time.perf_counter() - start
    report['part_cpu_seconds'][name] = time.process_time() - cpu
    report.write(device_tables.render(report))
    print(f"[device_report] {name}: {report['part_seconds'][name]:.0f} s "
          f"({report['part_cpu_seconds'][name]:.0f} s CPU)", file=sys.stderr, flush=True)

  if {'costs', 'table2', 'efficiency'} & set(parts):  # the last two need the costs
    models: Dict[str, Any] = {}

    def weights():
      models.update(build_models(args))
      return {size: num_params(m[2]) for size, m in models.items()}
    timed_part('weights', weights)
    enc = jnp.asarray(np.random.RandomState(0).randint(2, args.vocab, (1, args.enc_len)),
                      jnp.int32)
    timed_part('costs', lambda: part_costs(args, models, enc))
    if os.path.exists(args.compiled_json):
      with open(args.compiled_json, encoding='utf-8') as f:
        report['vs_compiled'] = device_tables.vs_compiled(
            report['costs'], json.load(f), report.environment['device_kind'])
    if 'table2' in parts:
      timed_part('table2', lambda: part_table2(report['costs']))
    if 'efficiency' in parts:
      timed_part('efficiency', lambda: part_efficiency(args, models, report['costs']))
    del models
  if 'demo' in parts:
    timed_part('demo', lambda: part_demo(args))
  report['plots'] = device_tables.plot(report)
  print(report.write(device_tables.render(report)))
  return report.data


if __name__ == '__main__':
  main()
