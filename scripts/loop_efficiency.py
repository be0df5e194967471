"""Speculative decoding's efficiency against the ideal its call costs allow, and where the
loop's time goes, with the packed CPU kernel and with XLA's dot (batch 1 unless --batch;
demo family unless --random_target).

  flock /tmp/specdec_bench.lock python scripts/loop_efficiency.py \
      --num_examples 12 --gammas 2,3,4 --temperatures 0,1   # results/loop_efficiency.*
  python scripts/loop_efficiency.py --tiny --ladder_calls 600 --out /tmp/loop  # tiny models
  flock /tmp/specdec_bench.lock python scripts/loop_efficiency.py --num_examples 16 \
      --batch 8 --matmuls packed --out results/loop_efficiency_batch8   # batch 8
  python scripts/loop_efficiency.py --random_target small --num_examples 4 --max_len 32 \
      --gammas 3 --temperatures 0 --matmuls packed \
      --out results/loop_efficiency_t5_1_1_small   # a T5 v1.1 size, random weights

Drafts: demo_draft_m and the target itself (one set of weights); with --random_target, a
T5 v1.1 target of that size and a 2+2-layer, 256-wide T5 v1.1 draft, random weights, on
random inputs (acceptance then means nothing; the efficiency does). Per row: tokens per
target call, the measured speedup, the end-to-end ideal from the calls made and the call
costs timed alone, efficiency = measured / ideal; per loop iteration the ladder of
research/measure/loop_ladder.py (calls alone, chained, both models interleaved, the real loop: the
losses to chaining, to two models and to the loop's own work); inside the loop, from XLA's
profiler, the target's calls, the draft's calls and the loop's own work per iteration
(research/measure/loop_profile.py); and the copies/transposes left in the compiled while body.
Writes {--out}.json and {--out}.md.
Run on an idle machine: it times.
"""

from __future__ import annotations

import sys
from typing import List

from specdec_t5x.algorithm import batching, network
from specdec_t5x.research.measure import evaluation, loop_efficiency
from specdec_t5x.research.results import harness


def _ms(x):
  return harness.fmt(None if x is None else 1e3 * x, '.3f')


def _heavy(profile) -> str:
  return ', '.join(f'{name} {1e6 * s:.0f}' for name, s in profile['top_loop_work'][:3])


def render(report: harness.Report) -> List[str]:
  lines = report.header(
      'Loop efficiency: measured vs ideal, and where each iteration goes',
      f'Batch {report["args"].get("batch", 1)}. measured = AR time / speculative time per '
      'generated token (interleaved); '
      'ideal e2e = grid.ideal_end_to_end from the target calls each loop made and the call '
      'costs of timing.call_costs (prefill included; each call\'s tokens the argmax of the '
      'last, as in any decode); efficiency = measured / ideal; as made: the same with each '
      'step\'s first draft call the 2-token re-feed the loop makes (the last draft of a fully '
      'accepted block was never fed) instead of a one-token call. '
      'The ladder, in '
      'ms per loop iteration (one target call): alone = gamma t_draft + t_verify, each call '
      'timed in a loop of identical calls; chained = the same calls, each token the argmax '
      'of the call before (as in any decode); interleaved = gamma chained draft calls and the '
      'verify call in one loop; loop = the real loop (its decode time less prefill, per '
      'target call). The excess of each rung over the one before: chaining, two models, and '
      'the loop\'s own work (2-token draft re-feed, acceptance, sampling, statistics). '
      'copies: copies/transposes in the compiled while body (cache-sized ones in brackets). '
      'research/measure/loop_ladder.py.')
  lines += [f'Target: {report["target"]}; drafts: {", ".join(report["drafts"])}.', '']
  for matmul, res in report['matmuls'].items():
    lines += [f'## {matmul}', '']
    ar = res['ladder_s']['ar']
    for group in res['groups']:
      lines += [f'### temperature {group["temperature"]:g}', '',
                f'AR per step: alone {_ms(ar["alone"])} ms, chained {_ms(ar["chained"])}, '
                f'loop {_ms(group["ar_loop_s"])}; while body copies '
                f'{group["ar_copies"]["copies_and_transposes"]} '
                f'({len(group["ar_copies"]["whole_buffer"])} cache-sized).', '']
      rows = []
      for r in group['rows']:
        lad = res['ladder_s'][f'{r["draft"]}_g{r["gamma"]}']
        rows.append([r['draft'], r['gamma'], f'{r["tokens_per_target_call"]:.2f}',
                     f'{r["speedup_measured"]:.2f}x', f'{r["speedup_ideal_end_to_end"]:.2f}x',
                     f'{r["efficiency_end_to_end"]:.2f}',
                     harness.fmt(r.get('efficiency_as_made'), '.2f'),
                     _ms(lad['alone']), _ms(lad['chained']),
                     _ms(lad['interleaved']), _ms(r['loop_s']),
                     _ms(lad['chained'] - lad['alone']), _ms(lad['interleaved'] - lad['chained']),
                     _ms(r['loop_s'] - lad['interleaved']),
                     f'{r["copies"]["copies_and_transposes"]} ({len(r["copies"]["whole_buffer"])})'])
      lines += harness.table(['draft', 'gamma', 'tokens/call', 'measured', 'ideal e2e',
                              'efficiency', 'as made', 'alone', 'chained', 'interleaved',
                              'loop', '+chaining', '+two models', '+loop work', 'copies'],
                             rows, 'llrrrrrrrrrrrrr') + ['']
      lines += ['Inside the loop, from XLA\'s profiler (ms per iteration; its markers slow each '
                'instruction a little): target / draft calls (alone: the verify call; the '
                'draft\'s 2-token re-feed and gamma - 1 steps), the loop\'s own work and its '
                'heaviest parts, their sum against the unprofiled loop.', '']
      prof = [['AR', 1, _ms(group['ar_profile']['per_iteration_s']['target_calls']), '',
               _ms(group['ar_profile']['per_iteration_s']['loop_work']),
               _ms(sum(group['ar_profile']['per_iteration_s'].values())),
               _ms(group['ar_loop_s']), _heavy(group['ar_profile'])]]
      for r in group['rows']:
        part = r['profile']['per_iteration_s']
        prof.append([r['draft'], r['gamma'],
                     f'{_ms(part["target_calls"])} ({_ms(r["alone_s"]["verify"])})',
                     f'{_ms(part["draft_calls"])} ({_ms(r["alone_s"]["draft_calls"])})',
                     _ms(part['loop_work']), _ms(sum(part.values())), _ms(r['loop_s']),
                     _heavy(r['profile'])])
      lines += harness.table(['draft', 'gamma', 'target calls (alone)', 'draft calls (alone)',
                              'loop work', 'sum', 'loop', 'heaviest loop work (us)'],
                             prof, 'llrrrrrl') + ['']
  return lines


def main(argv=None) -> None:
  ap = harness.parser(__doc__, harness.results_path(__file__, 'loop_efficiency'), repeats=3)
  ap.add_argument('--num_examples', type=int, default=12)
  ap.add_argument('--gammas', type=harness.ints, default=[2, 3, 4])
  ap.add_argument('--temperatures', type=harness.floats, default=[0.0, 1.0])
  ap.add_argument('--max_len', type=int, default=64)
  ap.add_argument('--matmuls', default='packed,xla', help='packed (the CPU kernel), xla')
  ap.add_argument('--ladder_calls', type=int, default=16,
                  help='iterations per timed run of each ladder rung (tiny models: thousands, '
                  'or a run is shorter than the machine\'s jitter)')
  ap.add_argument('--tiny', action='store_true', help='random tiny models (the test)')
  ap.add_argument('--random_target', choices=sorted(network.T5_1_1_SIZES),
                  help='a random-weight T5 v1.1 target of this size instead of the demo')
  ap.add_argument('--batch', type=int, default=1,
                  help='rows decoded together (--num_examples a multiple of it); every call, '
                  'rung and prefill is then a batch\'s')
  args = ap.parse_args(argv)
  if args.tiny:
    (target, drafts, enc), name = loop_efficiency.tiny_models(), 'tiny random'
  elif args.random_target:
    target, drafts, enc = loop_efficiency.random_t5_1_1(args.random_target, args.num_examples)
    name = f'random-weight T5 v1.1 {args.random_target}'
  else:
    name, target = 'demo_target', evaluation.load_model('demo_target')
    drafts = {'demo_draft_m': evaluation.load_model('demo_draft_m'), 'self': target}
    enc = batching.pad_batch([e.inputs for e in evaluation.load_examples('ende',
                                                                         args.num_examples)])
  report = harness.Report(__file__, args, argv)
  cfg = target[0].config
  report['target'] = (f'{name} (emb {cfg.emb_dim}, {cfg.num_decoder_layers} decoder layers, '
                      f'vocab {cfg.vocab_size})')
  report['drafts'] = list(drafts)
  report['matmuls'] = loop_efficiency.by_matmul(
      args.matmuls.split(','), target, drafts, enc, args.max_len, args.gammas,
      args.temperatures, args.repeats, cost_repeats=args.repeats,
      ladder_calls=args.ladder_calls, batch=args.batch)
  print(report.write(render(report)))


if __name__ == '__main__':
  main(sys.argv[1:])
