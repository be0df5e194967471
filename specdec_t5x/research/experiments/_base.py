"""What an experiment file declares: its results files (`Step`: how each is made, its
exact-check fields, its headline) and how it is measured (a decode `Preset` of
scripts/compare_decodes.py, or a measurement module of its own)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

RESULTS = 'results'


@dataclasses.dataclass(frozen=True)
class Check:
  """What `reproduce_results.py --check` compares of a rerun with the committed file:
  fields (fnmatch patterns over the JSON's flattened paths, 'cells/3/alpha') reproduced
  exactly, and timing fields within `rtol` (relative)."""
  exact: Tuple[str, ...] = ()  # fields a rerun reproduces bit for bit
  timing: Tuple[str, ...] = ()  # fields a rerun reproduces within rtol (relative)
  rtol: float = 0.25


@dataclasses.dataclass(frozen=True)
class Step:
  """One results file and how it is made: `python scripts/<script> <argv>` writes
  results/<name>.*.

  `made_by` names the script (since folded into `script` as its --experiment, computing the
  same) whose command, with the same flags, the committed results/<name>.json records:
  tests/test_reproduce.py checks the file against it until the file is measured again,
  and then that the declaration is gone.
  """
  name: str  # the results file stem
  script: str
  argv: tuple = ()
  timed: bool = True  # its figures are timings (needs an idle machine)
  quick: Optional[tuple] = None  # flags of a quick smoke run (None: skipped by --quick)
  out: Optional[str] = None  # the script's --out stem, when it adds a suffix to `name`
  made_by: Optional[str] = None  # the folded script that made the committed file
  check: Optional[Check] = None  # what --check compares (None: not checked)
  headline: Optional[Callable[[Dict[str, Any]], str]] = None  # its line in INDEX and README
  box: Optional[Tuple[int, str]] = None  # (row, where) in the README's speedup box

  def command(self, quick: bool = False, root: str = RESULTS) -> List[str]:
    argv = self.quick if quick else self.argv
    return [sys.executable, f'scripts/{self.script}', *argv,
            '--out', f'{root}/{self.out or self.name}']

  def made(self) -> Tuple[str, List[str]]:
    """(script, flags) of the command the committed file was made with: `made_by` takes
    the flags but --experiment."""
    if self.made_by is None:
      return self.script, list(self.argv)
    return self.made_by, [w for w in self.argv if not w.startswith('--experiment=')]


@dataclasses.dataclass(frozen=True)
class Preset:
  """A decode comparison of scripts/compare_decodes.py (every field is also a flag of the
  same name): the decodes, against AR, on the demo tasks' test rows."""
  title: str
  about: str  # what it compares, for the Markdown
  decodes: str  # comma-separated decode specs
  tasks: str = 'summarize,ende'
  temperatures: Tuple[float, ...] = (0.0,)
  rows: int = 8  # test rows per task
  max_len: int = 48
  repeats: int = 1
  batch: int = 1  # rows per decode call (0: all rows in one batch)
  quality: bool = False  # BLEU / ROUGE of every decode against the references
  precise: int = 0  # > 0: tokens per call also over this many inputs x `seeds`, batch 16
  seeds: int = 4


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment file's declaration.

  Attributes:
    name: its name (`compare_decodes.py --experiment=<name>` where it has a preset or a
      measurement).
    order: its place in the run order of reproduce_results.py (ascending).
    steps: its results files, in the order they are made.
    preset: the decode comparison compare_decodes.py runs (None: not a comparison).
    measure: a module (dotted) whose `main(argv, script, recorded)` measures it when
      compare_decodes.py is given --experiment=<name>, with its own flags.
    needs: results files it reads (they are made by earlier experiments).
  """
  name: str
  order: int
  steps: Tuple[Step, ...]
  preset: Optional[Preset] = None
  measure: Optional[str] = None
  needs: Tuple[str, ...] = ()


# What a rerun of any compare_decodes.py comparison reproduces exactly: its counts per row.
DECODE_COUNTS = ('results/*/target_calls', 'results/*/generated_tokens',
                 'results/*/accepted_tokens', 'results/*/equal_to_ar')
# The timing every comparison reports, reproduced within the check's spread.
SPEEDUP_VS_AR = ('results/*/speedup_vs_ar',)
