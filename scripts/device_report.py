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
from typing import Any, Dict

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import network
from specdec_t5x.research.measure import device_parts, t5x_reference
from specdec_t5x.research.predict import device_tables
from specdec_t5x.research.results import harness

PARTS = ('costs', 'table2', 'efficiency', 'demo')
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
      models.update(device_parts.build_models(args))
      return {size: device_parts.num_params(m[2]) for size, m in models.items()}
    timed_part('weights', weights)
    enc = jnp.asarray(np.random.RandomState(0).randint(2, args.vocab, (1, args.enc_len)),
                      jnp.int32)
    timed_part('costs', lambda: device_parts.part_costs(args, models, enc))
    if os.path.exists(args.compiled_json):
      with open(args.compiled_json, encoding='utf-8') as f:
        report['vs_compiled'] = device_tables.vs_compiled(
            report['costs'], json.load(f), report.environment['device_kind'])
    if 'table2' in parts:
      timed_part('table2', lambda: device_parts.part_table2(report['costs']))
    if 'efficiency' in parts:
      timed_part('efficiency', lambda: device_parts.part_efficiency(args, models, report['costs']))
    del models
  if 'demo' in parts:
    timed_part('demo', lambda: device_parts.part_demo(args))
  report['plots'] = device_tables.plot(report)
  print(report.write(device_tables.render(report)))
  return report.data


if __name__ == '__main__':
  main()
