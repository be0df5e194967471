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

from typing import List

from specdec_t5x.algorithm import batching
from specdec_t5x.research.measure import confidence, evaluation, measurement
from specdec_t5x.research.results import harness

TARGET = 'demo_target'


def measure(args, script: str) -> dict:
  """The agreement table of each task."""
  target = evaluation.load_model(TARGET)
  tables = {}
  for task in args.tasks:
    enc = batching.pad_batch([e.inputs for e in evaluation.load_examples(task,
                                                                         args.num_examples)])
    drafts = {name: evaluation.load_model(name, task) for name in args.drafts}
    tables[task] = confidence.agreement_table(target, drafts, enc, args.max_len)
  return dict(tables=tables)


def render(report: harness.Report) -> List[str]:
  md = report.header(
      'Greedy agreement with the target, by how sure the target is (demo family)',
      f"Target {TARGET}, greedy outputs of the first {report['args']['num_examples']} test "
      'inputs per task. Agreement: the draft\'s argmax at a position, given the true prefix, '
      'is the target\'s greedy token (a greedy first draft is accepted exactly then). '
      'Buckets: the target\'s top-1 probability at the position.')
  for task, table in report['tables'].items():
    md += ['', confidence.markdown(table, task)]
    if table['teacher_forced_argmax_differs']:
      md += ['', f'({table["teacher_forced_argmax_differs"]} positions where the teacher-'
             'forced target\'s argmax is not its decoded token: a near-tie summed in another '
             'order.)']
  return md


main = measurement.Measurement('agreement_by_confidence', __doc__, measure, render, flags=dict(
    drafts=dict(type=measurement.names, default=['demo_feature_head_kd', 'demo_draft_m']),
    tasks=dict(type=measurement.names, default=['ende', 'summarize']), num_examples=64,
    max_len=64)).main
