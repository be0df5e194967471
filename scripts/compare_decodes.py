"""Runs one registered experiment on the demo family: a decode comparison (decode variants
against autoregressive decoding and the plain chain) or a measurement of its own.

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=tree \
      [--decodes=g2,g4+s1,...] [--tasks=summarize,ende] [--temperatures=0,1] [--rows=8] \
      [--max_len=48] [--repeats=2] [--batch=1] [--quality] [--precise=64] [--seeds=4]
  python scripts/compare_decodes.py --experiment=alpha_demo [its flags; --help lists them]
  python scripts/compare_decodes.py --list      # every experiment, what it runs

The experiments are the files of specdec_t5x/research/experiments/ (--list names them). One
with a measurement module of its own (research/measure/) takes that module's flags
(--experiment=NAME --help) and writes what the module's docstring says.

A decode comparison: demo_target with demo_draft_m unless a decode names another draft.
Its experiment file's preset fills these flags; a flag given overrides the preset. For
each task and temperature, the task's first --rows test rows are decoded with AR and with
each decode, --batch rows per call (0: all in one batch), timed interleaved after
compilation (median of --repeats; greedy outputs checked equal to AR's). A decode spec is
g<gamma>[+c<n>][+s<k1>.<k2>][+block][+conf[<t>]][+ra<c>][+l<x>][@<draft>] (see the
module). --quality adds BLEU / ROUGE; --precise N adds tokens per call over N inputs x
--seeds rngs. Writes results/<experiment>.{json,md} (or --out).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from typing import List, Optional, Sequence, Tuple

import jax
from tqdm import tqdm

from specdec_t5x.research import experiments as registry
from specdec_t5x.research.measure import compare, demo_data, evaluation
from specdec_t5x.research.results import harness


def split_experiment(argv: Sequence[str]) -> Tuple[Optional[str], List[str]]:
  """(the --experiment named in argv or None, argv without it)."""
  name, rest, words = None, [], list(argv)
  while words:
    word = words.pop(0)
    if word == '--experiment' and words:
      name = words.pop(0)
    elif word.startswith('--experiment='):
      name = word.split('=', 1)[1]
    else:
      rest.append(word)
  return name, rest


def parse_args(argv):
  ap = harness.parser(__doc__, None)
  ap.add_argument('--experiment', choices=sorted(registry.RUNNABLE))
  ap.add_argument('--list', action='store_true', help='name and describe the experiments')
  ap.add_argument('--decodes')
  ap.add_argument('--tasks')
  ap.add_argument('--temperatures', type=lambda s: tuple(harness.floats(s)))
  for name in ('rows', 'max_len', 'repeats', 'batch', 'precise', 'seeds'):
    ap.add_argument(f'--{name}', type=int)
  ap.add_argument('--quality', action='store_true', default=None)
  args = ap.parse_args(argv)
  if args.list:
    return args, None
  if not args.experiment:
    ap.error('--experiment is required (--list names them)')
  preset = registry.PRESETS[args.experiment]
  exp = dataclasses.replace(preset, **{f.name: getattr(args, f.name) for f in
                                       dataclasses.fields(preset)
                                       if getattr(args, f.name, None) is not None})
  for spec in exp.decodes.split(','):
    try:
      compare.parse_decode(spec)  # a bad spec fails before anything loads
    except ValueError as e:
      ap.error(str(e))
  if exp.precise % 16:
    ap.error(f'--precise {exp.precise}: a multiple of 16 (it decodes in batches of 16)')
  args.out = args.out or harness.results_path(__file__, args.experiment)
  return args, exp


def run(exp: registry.Preset):
  target = evaluation.load_model('demo_target')
  tasks = exp.tasks.split(',')
  results = []
  with tqdm(total=len(tasks) * len(exp.temperatures), desc='decodes', unit='cell') as bar:
    for task in tasks:
      enc, refs, vocab = demo_data.load_task(task, exp.rows)
      drafts = compare.Drafts(task, target[0].config.vocab_size)
      many = demo_data.load_task(task, exp.precise)[0] if exp.precise else None
      for t in exp.temperatures:
        jax.clear_caches()  # the last cell's programs: the JIT's memory mappings are bounded
        decoders = compare.decoders(target, enc, exp, task, t, drafts)
        rows = compare.rows_of(harness.interleaved(decoders, exp.repeats), task, t,
                                   *((vocab, refs) if exp.quality else ()))
        for r in rows:
          if many is not None and r['decode'] != compare.BASE:
            wide = dataclasses.replace(decoders[r['decode']], enc=many, batch=16)
            r['tpc_precise'], r['tpc_stderr'] = compare.precise_tokens_per_call(
                wide, exp.seeds)
          print(json.dumps(r), file=sys.stderr, flush=True)
        results += rows
        bar.update(1)
  return results


def markdown(exp, results):
  sources = any(r['accepted_by_source'] and (r['accepted_by_source']['copy_branch']
                                             or r['accepted_by_source']['draft_siblings'])
                for r in results)
  quality = lambda r: (f"BLEU {r['bleu']:.2f}" if 'bleu' in r else ', '.join(
      f'{k} {r[k]:.2f}' for k in ('rouge1', 'rouge2', 'rougeLsum') if k in r))
  header = ['task', 't', 'decode', 'positions', 'alpha', 'acceptance rate', 'tokens/call',
            'drafts/step']
  header += ['accepted chain / copy / siblings'] if sources else []
  header += ['seconds', 'vs AR', 'vs best chain', '== AR']
  header += ['quality'] if exp.quality else []
  header += ['tokens/call (precise)'] if exp.precise else []
  body = []
  for r in results:
    row = [r['task'], f"{r['temperature']:g}",
           r['decode'] + (' (**LOSSY**)' if r['lossy'] else ''), r['verified_positions'],
           harness.fmt(r['alpha']), harness.fmt(r['acceptance_rate']),
           f"{r['mean_tokens_per_target_call']:.2f}",
           f"{r['drafts_per_step']:.2f}"]
    row += [' / '.join(str(n) for n in r['accepted_by_source'].values())] if sources else []
    row += [f"{r['seconds']:.2f}", f"{r['speedup_vs_ar']:.2f}",
            harness.fmt(r['speedup_vs_best_chain']),
            r['equal_to_ar'] if r['temperature'] == 0 else '-']
    row += [quality(r)] if exp.quality else []
    row += ([f"{r['tpc_precise']:.3f} +- {r['tpc_stderr']:.3f}" if 'tpc_precise' in r
             else '-'] if exp.precise else [])
    body.append(row)
  return harness.table(header, body, 'lllrrrrr' + 'r' * sources + 'rrrl')


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  name, rest = split_experiment(argv)
  measured = registry.RUNNABLE.get(name)
  if measured is not None and measured.measure:  # its module's own flags and report
    return importlib.import_module(measured.measure).main(rest, __file__, argv)
  args, exp = parse_args(argv)
  if exp is None:
    for name, e in registry.RUNNABLE.items():
      about = (f'{e.preset.title}\n{"":24s} decodes {e.preset.decodes}' if e.preset else
               f'measured by {e.measure} (--help with it: its flags)')
      print(f'{name:24s} {about}')
    return None
  results = run(exp)
  report = harness.Report(__file__, args, argv)
  report.data.update(experiment=args.experiment, settings=dataclasses.asdict(exp),
                     results=results)
  batch = 'all rows in one batch' if not exp.batch else f'batch {exp.batch}'
  report.write(report.header(
      exp.title,
      f'demo_target; drafts as named (default demo_draft_m). {exp.about}',
      f'{exp.rows} test rows per task, {batch}, max_decode_length {exp.max_len}, median '
      f'of {exp.repeats} interleaved repeats after compilation. positions: tokens one '
      'target call verifies; vs best chain: speedup over the fastest plain g<gamma> chain '
      'of the same cell; == AR: greedy tokens equal to AR\'s.' +
      (f' Precise tokens/call: per-row mean over {exp.precise} inputs x {exp.seeds} rngs '
       '(greedy: one run, its rows do not depend on the rng; batch 16), +- one standard '
       'error.' if exp.precise else '')) + markdown(exp, results))


if __name__ == '__main__':
  main()
