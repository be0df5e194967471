"""Walltime speedup vs gamma at batch size 1 (paper Table 2), with theory and efficiency.

  # The demo family: tasks x drafts x temperatures, gamma swept (CPU-sized):
  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py \
      --experiment=speedup_table --num_examples 12 --gammas 1,2,3,4,6
      # results/speedup_demo.* (needs results/alpha_demo.json)
  # A paper row, its run file unchanged (gamma swept as --gin.GAMMA would set it):
  python scripts/compare_decodes.py --experiment=speedup_table \
      --gin_file=configs/spec_t5_small_xxl.gin \
      --gin.TARGET_CHECKPOINT="'/ckpt/xxl/checkpoint_1000000'" \
      --gin.DRAFT_CHECKPOINT="'/ckpt/small/checkpoint_1000000'" --gammas 3,5,7

For each (task, draft, temperature) it times, in one process after compilation and
interleaved (grid.time_grid, on harness.interleaved), autoregressive decoding and
speculative decoding at each gamma over --num_examples inputs, one at a time; measures the call costs t_target,
t_draft (c = t_draft / t_target) and t_verify(gamma+1) with grid.costs; and
reports alpha, the measured speedup, theory's prediction (i.i.d. alpha fitted to tokens
per call), the ideal speedup tokens_per_call * t_target / (gamma t_draft + t_verify),
efficiency = measured / ideal, and the gamma theory.best_gamma_measured picks.
Writes {--out}.json, {--out}.md and {--out}_{task}.png.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from tqdm import tqdm

from specdec_t5x.integration import infer
from specdec_t5x.research.measure import demo_data, evaluation, grid, measurement, speed
from specdec_t5x.research.results import harness


def run_demo(args, gammas):
  alpha_cells = demo_data.alpha_cells(args.alpha_json)
  tasks = args.tasks.split(',')
  with tqdm(total=len(tasks) * (1 + len(args.temperatures)), desc='speedup', unit='step') as bar:
    return speed.demo_speedups(
        args.target, args.drafts.split(','), tasks, args.temperatures, gammas,
        args.num_examples, args.max_len, args.repeats, args.cost_calls, args.cost_repeats,
        args.seed, alpha_cells, progress=bar)


def run_gin(args, gammas):
  run = evaluation.from_gin(args.gin_file, args.gin_bindings, args.num_examples)
  if run['draft'] is None:
    raise ValueError('The gin file configures no draft (DRAFT_CONFIG=None); nothing to sweep.')
  name = run['model'].draft_checkpoint or type(run['draft'][0]).__name__
  drafts = {str(name).rstrip('/').split('/')[-2] if '/' in str(name) else str(name): run['draft']}
  gammas = gammas or [run['model'].gamma]
  bar = tqdm(total=2, desc='speedup', unit='step')
  cost = grid.costs(run['target'], drafts, run['enc'], gammas, args.cost_calls,
                         args.cost_repeats, max_len=run['max_len'])
  bar.update(1)
  res = speed.sweep(run['target'], drafts, run['enc'], run['max_len'], gammas,
                    run['config'].sampling, cost, args.repeats, args.seed, run['eos_id'])
  bar.update(1)
  bar.close()
  return [{'task': run['task'], 'temperature': run['config'].temperature, 'costs_s': cost, **res}]


def render(report: harness.Report) -> List[str]:
  groups = report['groups']
  lines = report.header(
      f"Speedup vs gamma ({report.environment['device_kind']}, batch 1)",
      'Speed = (median AR seconds per generated token) / (median speculative seconds per '
      'generated token) over the same inputs, timed interleaved after compilation (the '
      'time ratio when greedy; sampled outputs differ in length). alpha = i.i.d. fit to '
      'measured tokens per call (accepted/drafted in brackets). Theory = E[tokens](alpha_tf) '
      '* t_target / (gamma t_draft + t_verify), alpha_tf = the teacher-forced alpha of '
      'results/alpha_demo.json (the fit when absent). Ideal = measured tokens/call * '
      't_target / (gamma t_draft + t_verify) (the paper\'s, decoder calls only); '
      'efficiency = Speed / Ideal. Ideal e2e also counts the per-sequence prefill '
      '(encoder + cache) that both methods pay once: (n P_t + N_ar t_target) / '
      '(n (P_t + P_d) + N_calls (gamma t_draft + t_verify)); eff. e2e = Speed / Ideal e2e '
      'isolates our own loop overhead. Chosen = theory.best_gamma_measured(alpha, costs) '
      'over the swept range.')
  drafts = [(grp, name, d) for grp in groups for name, d in grp['drafts'].items()]
  lines += harness.table(
      ['Task', 'Draft', 'Temp', 'gamma', 'alpha', 'Speed', 'Theory', 'Ideal', 'Efficiency',
       'Ideal e2e', 'Eff. e2e', 'tokens/call', 'c', 'chosen'],
      [[grp['task'], name, f"{grp['temperature']:g}", r['gamma'],
        f"{harness.fmt(r['alpha'])} (fit {r['alpha_iid_fit']:.2f})",
        f"{r['speedup_measured']:.2f}x", f"{r['speedup_theory']:.2f}x",
        f"{r['speedup_ideal']:.2f}x", f"{r['efficiency']:.2f}",
        harness.fmt(r.get('speedup_ideal_end_to_end'), unit='x'),
        harness.fmt(r.get('efficiency_end_to_end')), f"{r['tokens_per_target_call']:.2f}",
        f"{d['c']:.3f}", '<-' if r['gamma'] == d['chosen_measured_gamma'] else '']
       for grp, name, d in drafts for r in d['rows']])
  return lines + [''] + harness.table(
      ['Task', 'Draft', 'Temp', 'alpha for theory', 'chosen gamma', 'best measured gamma',
       'speed at chosen', 'best speed', 'within 10%'],
      [[grp['task'], name, f"{grp['temperature']:g}",
        f"{d['alpha_for_choice']:.2f} ({d['alpha_source']})",
        f"{d['chosen_gamma']} (nearest swept {d['chosen_measured_gamma']})",
        d['best_measured_gamma'], f"{d['chosen_measured_speedup']:.2f}x",
        f"{d['best_measured_speedup']:.2f}x",
        'yes' if d['chosen_within_10pct_of_best'] else 'no'] for grp, name, d in drafts])


def plot(report: harness.Report) -> List[str]:
  plt = harness.pyplot()
  paths = []
  groups = report['groups']
  for task in dict.fromkeys(g['task'] for g in groups):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = iter(plt.rcParams['axes.prop_cycle'].by_key()['color'] * 4)
    for grp in [g for g in groups if g['task'] == task]:
      for name, d in grp['drafts'].items():
        color, label = next(colors), f"{name} t={grp['temperature']:g}"
        gs = [r['gamma'] for r in d['rows']]
        ax.plot(gs, [r['speedup_measured'] for r in d['rows']], 'o-', color=color,
                label=label)
        curve = sorted((int(k), v) for k, v in d['theory_curve'].items())
        ax.plot([k for k, _ in curve], [v for _, v in curve], '--', color=color, alpha=0.6)
        chosen = d['chosen_measured_gamma']
        ax.plot([chosen], [d['chosen_measured_speedup']], '*', color=color, markersize=16)
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set_xlabel('gamma')
    ax.set_ylabel('walltime speedup over AR')
    ax.set_title(f'{task}: measured (solid), theory (dashed), chosen gamma (star)')
    ax.legend(fontsize=8)
    paths.append(report.save_figure(fig, f'_{task}'))
  return paths


def measure(args, script: str) -> dict:
  """The groups of the gin file's run or of the demo family's cells."""
  gammas = harness.ints(args.gammas) if args.gammas else None
  if args.gin_file:
    return dict(groups=run_gin(args, gammas))
  return dict(groups=run_demo(args, gammas or list(range(1, 8))))


MEASUREMENT = measurement.Measurement(
    'speedup_demo', __doc__, measure, render, repeats=3,
    after=lambda report: report.data.update(plots=plot(report)), flags=dict(
        gin_file=dict(action='append', default=[]),
        gin_bindings=dict(action='append', default=[]), target='demo_target',
        drafts='demo_draft_m,demo_draft_s,bigram', tasks='ende,summarize', temperatures='0,1',
        gammas=dict(default=None, help='comma-separated; default 1..7 (gin: GAMMA)'),
        num_examples=20, max_len=64,
        cost_calls=dict(type=int, default=32, help='decoder calls per cost timing'),
        cost_repeats=dict(type=int, default=7, help='interleaved cost repeats'), seed=0,
        alpha_json=measurement.alpha_json))


def main(argv: Sequence[str], script: str, recorded: Optional[Sequence[str]] = None):
  """MEASUREMENT.main with the --gin.NAME=VALUE flags rewritten to --gin_bindings."""
  return MEASUREMENT.main(infer.rewrite_gin_args(list(argv)), script,
                          argv if recorded is None else recorded)
