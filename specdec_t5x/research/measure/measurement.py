"""One skeleton for the measurement experiments that `compare_decodes.py --experiment=NAME`
runs with a module of their own (research/measure/*): their flags, report and entry point.

A `Measurement` declares which of the shared flags (FLAGS: one definition each of
--num_examples, --tasks, --drafts, --gammas, --temperatures, --max_len, ...) it takes and
their defaults, and the flags only it has, and gives what is its own: `measure` (the
results) and `render` (their Markdown). `Measurement.main` does the rest alike for all:
parses the flags, records the command and args (harness.Report), writes {out}.json and
{out}.md and prints the Markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

from specdec_t5x.research.results import harness


def names(text: str) -> List[str]:
  """'a,b' -> ['a', 'b'] (an argparse type)."""
  return text.split(',')


def alpha_json(script: str) -> str:
  """The default --alpha_json: results/alpha_demo.json beside the entry point `script`."""
  return harness.results_path(script, 'alpha_demo.json')


# The shared flags: argparse settings without the default, which each Measurement gives.
# --target, --drafts, --tasks and --gammas are strings (comma lists, split where used).
FLAGS: Dict[str, Dict[str, Any]] = {
    'target': {}, 'drafts': {}, 'tasks': {}, 'gammas': {},
    'temperatures': dict(type=harness.floats),
    **{name: dict(type=int) for name in ('gamma', 'num_examples', 'rows', 'batch', 'max_len',
                                         'max_input_len', 'seed')},
    'alpha_json': dict(help="compare_decodes.py --experiment=alpha_demo's output, read when "
                       'present (the teacher-forced alphas)'),
}


@dataclasses.dataclass(frozen=True)
class Measurement:
  """One measurement experiment: its flags and what it measures and renders.

  `flags` maps each flag it takes to its default (a function: called with the entry point's
  path), or to a dict of argparse settings: over FLAGS' for a shared flag (harness.add_flags).
  """
  name: str  # The default output: results/<name>.{json,md} beside the entry point.
  doc: str  # The --help text: the module's docstring.
  measure: Callable[[argparse.Namespace, str], Dict[str, Any]]  # (args, script) -> results.
  render: Callable[[harness.Report], List[str]]  # The report's Markdown lines.
  flags: Dict[str, Any] = dataclasses.field(default_factory=dict)
  repeats: Optional[int] = None  # --repeats' default for a measurement that times.
  after: Optional[Callable[[harness.Report], Any]] = None  # Runs after the files are written.
  prints: bool = True  # Print the Markdown.
  # Runs before measuring (args -> more environment entries for the report).
  setup: Optional[Callable[[argparse.Namespace], Dict[str, Any]]] = None

  def parser(self, script: str) -> argparse.ArgumentParser:
    """--out (results/<name> beside `script`), --repeats if it times, then its flags."""
    ap = harness.parser(self.doc, harness.results_path(script, self.name), self.repeats)
    return harness.add_flags(ap, FLAGS, {k: v(script) if callable(v) else v
                                         for k, v in self.flags.items()})

  def main(self, argv: Sequence[str], script: str,
           recorded: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Measures with the flags `argv` and writes the report; `script` is the entry point
    (scripts/compare_decodes.py: results/ beside it, its name in the command) and
    `recorded` the command's flags (default argv). Returns the report's data."""
    args = self.parser(script).parse_args(argv)
    report = harness.Report(script, args, argv if recorded is None else recorded,
                            **(self.setup(args) if self.setup else {}))
    report.data.update(self.measure(args, script))
    text = report.write(self.render(report))
    if self.after is not None:
      self.after(report)
    if self.prints:
      print(text)
    return report.data
