r"""Regenerates every file of results/ on today's code, one script at a time.

  python scripts/reproduce_results.py                 # everything (an idle machine)
  python scripts/reproduce_results.py --only demo_speedup_runs,feature_draft
  python scripts/reproduce_results.py --quick --root /tmp/quick   # a smoke run
  python scripts/reproduce_results.py --list          # the steps and their commands
  python scripts/reproduce_results.py --index --docs    # re-render INDEX.md and the docs' figures
  python scripts/reproduce_results.py --check --only alpha_demo  # rerun, compare, write nothing

Each step (declared by its experiment file, specdec_t5x/research/experiments/: the script
and flags that make one results file) runs in a fresh process; a timed step is refused
while the machine is busy (CPU use, another Python process) unless --allow_busy, which
marks the run; every step is refused while the checkout has uncommitted changes outside
results/ unless --allow_dirty (the files would name a revision no one can check out). Logs
each step's seconds to {root}/reproduce_log.json, then renders {root}/INDEX.md (file, command,
revision, date, machine, headline) and, with --docs (or its old name --readme), README.md's
speedup box and every `<!-- rendered: NAME -->` block of README.md, ARCHITECTURE.md and
docs/*.md from the JSON files. --check (research/results/check.py) reruns the steps into a scratch
folder and compares their deterministic fields exactly and their timings within a spread.
"""

import argparse
import json
import os

from specdec_t5x.integration import run_dir
from specdec_t5x.research.results import reproduce, check as reproduce_check


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--only', default='', help='comma list of step names')
  ap.add_argument('--quick', action='store_true', help='the steps with a quick form, quickly')
  ap.add_argument('--root', default=reproduce.RESULTS, help='where the results go')
  ap.add_argument('--allow_busy', action='store_true')
  ap.add_argument('--allow_dirty', action='store_true',
                  help='run on uncommitted changes (the files then say -dirty)')
  ap.add_argument('--list', action='store_true', help='print the steps and exit')
  ap.add_argument('--index', action='store_true', help='only re-render INDEX.md')
  ap.add_argument('--docs', '--readme', dest='docs', action='store_true',
                  help='also re-render README.md\'s speedup box and the rendered blocks of '
                  'README.md, ARCHITECTURE.md and docs/*.md')
  ap.add_argument('--check', action='store_true',
                  help='re-run the checked steps into a scratch folder and compare their '
                  'fields with --root\'s files (exactly, timings within their spread); '
                  'writes nothing; exit status 1 when a field differs')
  args = ap.parse_args(argv)
  names = [n for n in args.only.split(',') if n]
  unknown = set(names) - {s.name for s in reproduce.STEPS}
  if unknown:
    raise SystemExit(f'Unknown steps {sorted(unknown)}; see --list.')
  steps = [s for s in reproduce.STEPS if not names or s.name in names]
  if args.list:
    for s in steps:
      print(f'{s.name:28s}', ' '.join(['python'] + s.command(args.quick, args.root)[1:]))
    return None
  if args.check:
    results = reproduce_check.run(steps, quick=args.quick, allow_busy=args.allow_busy,
                                  reference_root=args.root)
    print('\n'.join(reproduce_check.report(results)))
    if any(r['mismatches'] for r in results.values()):
      raise SystemExit(1)
    return results
  records = []
  if not args.index:
    os.makedirs(args.root, exist_ok=True)
    records = reproduce.run(steps, quick=args.quick, allow_busy=args.allow_busy,
                            root=args.root, allow_dirty=args.allow_dirty)
    total = sum(r['seconds'] for r in records)
    run_dir.write_atomic(os.path.join(args.root, f'{reproduce.LOG}.json'), json.dumps(
        {'steps': records, 'total_seconds': round(total, 1)}, indent=1) + '\n')
    print(f'{len(records)} steps in {total / 60:.1f} min')
  run_dir.write_atomic(os.path.join(args.root, 'INDEX.md'),
                       '\n'.join(reproduce.index(args.root)) + '\n')
  if args.docs:
    for page in reproduce.doc_pages('.'):
      with open(page, encoding='utf-8') as f:
        text = f.read()
      render = (reproduce.render_readme if os.path.relpath(page) == 'README.md'
                else reproduce.render_blocks)  # the box is the README's alone
      rendered = render(text, args.root)
      if rendered != text:
        run_dir.write_atomic(page, rendered)
  return records


if __name__ == '__main__':
  main()
