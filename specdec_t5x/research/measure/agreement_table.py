r"""Greedy agreement of each draft with the demo target, by the target's top-1 probability.

  python scripts/compare_decodes.py --experiment=agreement_by_confidence \
      [--drafts demo_feature_head_kd,demo_draft_m] [--num_examples 64]

For each demo task, the target decodes the first --num_examples test inputs greedily; every
output position is put in a bucket by the target's top-1 probability there, and each draft's
teacher-forced argmax (the first draft of a step: given the true prefix; a feature head
reads the target's features) is compared with the target's token (research/measure/confidence.py).
Deterministic counts, no timing. Writes results/agreement_by_confidence.{json,md}.
"""

from __future__ import annotations

from typing import Optional, Sequence
from specdec_t5x.algorithm import batching
from specdec_t5x.research.measure import confidence, evaluation
from specdec_t5x.research.results import harness

TARGET = 'demo_target'


def main(argv: Sequence[str], script: str, recorded: Optional[Sequence[str]] = None):
  """Measures with this module's flags `argv` and writes the report; `script` is the entry
  point (scripts/compare_decodes.py: results/ beside it, its name in the command) and
  `recorded` the command's flags (default argv)."""
  ap = harness.parser(__doc__, harness.results_path(script, 'agreement_by_confidence'))
  ap.add_argument('--drafts', type=lambda s: s.split(','),
                  default=['demo_feature_head_kd', 'demo_draft_m'])
  ap.add_argument('--tasks', type=lambda s: s.split(','), default=['ende', 'summarize'])
  ap.add_argument('--num_examples', type=int, default=64)
  ap.add_argument('--max_len', type=int, default=64)
  args = ap.parse_args(argv)
  target = evaluation.load_model(TARGET)
  tables = {}
  for task in args.tasks:
    enc = batching.pad_batch([e.inputs for e in evaluation.load_examples(task,
                                                                         args.num_examples)])
    drafts = {name: evaluation.load_model(name, task) for name in args.drafts}
    tables[task] = confidence.agreement_table(target, drafts, enc, args.max_len)
  report = harness.Report(script, args, argv if recorded is None else recorded)
  report.data.update(tables=tables)
  md = report.header(
      'Greedy agreement with the target, by how sure the target is (demo family)',
      f'Target {TARGET}, greedy outputs of the first {args.num_examples} test inputs per task. '
      'Agreement: the draft\'s argmax at a position, given the true prefix, is the target\'s '
      'greedy token (a greedy first draft is accepted exactly then). Buckets: the target\'s '
      'top-1 probability at the position.')
  for task, table in tables.items():
    md += ['', confidence.markdown(table, task)]
    if table['teacher_forced_argmax_differs']:
      md += ['', f'({table["teacher_forced_argmax_differs"]} positions where the teacher-'
             'forced target\'s argmax is not its decoded token: a near-tie summed in another '
             'order.)']
  report.write(md)
  print('\n'.join(md))
