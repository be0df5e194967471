"""The experiment harness of the result scripts: flags, one timer, one report.

A result script builds its flags on `parser` (--out, optionally --repeats), times with
`interleaved` (every function once per repeat, interleaved after compilation; the median),
and hands its rows to a `Report`, which records the exact command, the environment and
the flags and writes {out}.json, {out}.md (and PNG figures) atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json
import os
import platform
import shlex
import statistics
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import jax

from specdec_t5x.algorithm import timing
from specdec_t5x.algorithm.cpu import info
from specdec_t5x.integration import run_dir

# ------------------------------------------------------------------ flags


def results_path(script_file: str, name: str) -> str:
  """<repository>/results/<name> for a script in <repository>/scripts/."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(script_file)))
  return os.path.join(repo, 'results', name)


def parser(doc: Optional[str], out: str, repeats: Optional[int] = None,
           repeats_help: str = 'interleaved timing repeats (their median is reported)'
           ) -> argparse.ArgumentParser:
  """The flags every result script has: --out (the output prefix) and, for a script that
  times, --repeats. `doc` (the script's docstring) is the --help text."""
  ap = argparse.ArgumentParser(description=doc,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--out', default=out, help='output prefix: {out}.json, {out}.md')
  if repeats is not None:
    ap.add_argument('--repeats', type=int, default=repeats, help=repeats_help)
  return ap


def add_flags(ap: argparse.ArgumentParser, table: Dict[str, Dict[str, Any]],
              chosen: Dict[str, Any]) -> argparse.ArgumentParser:
  """Adds the flags of `chosen`, {name: its default, or a dict of argparse settings}, each
  over `table[name]`'s settings (the one definition of a flag that several scripts share,
  each with its own default; a name not in `table` is a script's own flag)."""
  for name, value in chosen.items():
    settings = value if isinstance(value, dict) else {'default': value}
    ap.add_argument(f'--{name}', **dict(table.get(name, {}), **settings))
  return ap


def ints(text: str) -> List[int]:
  """'1,2,4' -> [1, 2, 4] (empty items skipped)."""
  return [int(x) for x in text.split(',') if x.strip()]


def floats(text: str) -> List[float]:
  """'0,1' -> [0.0, 1.0] (an argparse type)."""
  return [float(x) for x in text.split(',') if x.strip()]


def pairs(text: str, cast: Callable[[str], Any] = str) -> Dict[str, Any]:
  """'a=1,b=2' -> {'a': cast('1'), 'b': cast('2')} (empty items skipped); an item without
  '=' or a value `cast` refuses raises argparse.ArgumentTypeError."""
  out = {}
  for item in (x.strip() for x in text.split(',')):
    if not item:
      continue
    key, eq, value = item.partition('=')
    if not eq or not key:
      raise argparse.ArgumentTypeError(f'{item!r}: expected key=value')
    try:
      out[key] = cast(value)
    except ValueError as e:
      raise argparse.ArgumentTypeError(f'{item!r}: {e}') from None
  return out


# ------------------------------------------------------------------ timing


@dataclasses.dataclass
class Timings:
  """Seconds of interleaved runs: seconds[name] has one entry per repeat; outputs[name] is
  the last run's output (timed runs repeat the same computation, so any run's output)."""
  seconds: Dict[str, List[float]]
  outputs: Dict[str, Any]

  @property
  def median(self) -> Dict[str, float]:
    """The one statistic the scripts report: the median seconds per name."""
    return {name: statistics.median(s) for name, s in self.seconds.items()}

  def speed_ratios(self, base: str) -> Dict[str, float]:
    """Median over repeats of seconds[name][i] / seconds[base][i] for every other name:
    how many times faster `base` is, per pair (robust to drifts in machine speed)."""
    return {name: statistics.median(t / b for t, b in zip(ts, self.seconds[base]))
            for name, ts in self.seconds.items() if name != base}


def interleaved(fns: Dict[str, Callable[[], Any]], repeats: int) -> Timings:
  """The one timer of decodes: runs every fn once to compile, then once per repeat in turn
  (timing.wall: its outputs ready), keeping each fn's last output, so a drift in machine
  speed moves all names alike."""
  outputs: Dict[str, Any] = {}

  def run(name: str) -> Any:
    outputs[name] = fns[name]()
    return outputs[name]
  for name in fns:
    timing.block(run(name))  # compile / warm up
  seconds: Dict[str, List[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name in fns:
      seconds[name].append(timing.wall(lambda: run(name)))  # pylint: disable=cell-var-from-loop
  return Timings(seconds, outputs)


# ------------------------------------------------------------------ environment


def environment(**extra: Any) -> Dict[str, Any]:
  """Machine (its CPU's model and kernel features too), device, versions and code revision,
  recorded in every results file."""
  import flax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  dev = jax.devices()[0]
  return {'git_revision': run_dir.git_revision() or 'unknown',
          'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
          'device_kind': dev.device_kind, 'platform': dev.platform,
          'num_devices': jax.device_count(), 'cpu_count': os.cpu_count(),
          'machine': platform.machine(), 'python': platform.python_version(),
          'jax': jax.__version__, 'jaxlib': jaxlib.__version__, 'flax': flax.__version__,
          'numpy': np.__version__, **info.describe(), **extra}


# ------------------------------------------------------------------ Markdown


def fmt(value: Optional[float], spec: str = '.2f', unit: str = '') -> str:
  """A number formatted, or '-' when it is None (not measured)."""
  return '-' if value is None else f'{value:{spec}}{unit}'


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str = '') -> List[str]:
  """Markdown table lines. `align`: one character per column, 'r' for right-aligned
  (numbers), anything else left (default: all left)."""
  align = align.ljust(len(header), 'l')
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + ''.join('---:|' if a == 'r' else '---|' for a in align)]
  return lines + ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is missing."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


# ------------------------------------------------------------------ the report


class Report:
  """One results file set: {out}.json holds `data` (command, environment, args and what
  the script adds), {out}.md the Markdown it renders, {out}<suffix>.png its figures.

  Args:
    script_file: the script's own path (its name goes into the command).
    args: the parsed flags (recorded; args.out is the output prefix unless `out` is given).
    argv: the flags as given (None: sys.argv[1:]), recorded as the exact command.
    out: the output prefix, if not args.out.
    **env: more environment entries (library versions, thread counts).
  """

  def __init__(self, script_file: str, args: Optional[argparse.Namespace] = None,
               argv: Optional[Sequence[str]] = None, out: Optional[str] = None, **env: Any):
    argv = list(sys.argv[1:] if argv is None else argv)
    self.command = ' '.join(['python', f'scripts/{os.path.basename(script_file)}'] +
                            ([shlex.join(argv)] if argv else []))
    self.out = out if out is not None else args.out
    self.data: Dict[str, Any] = {'command': self.command, 'environment': environment(**env)}
    if args is not None:
      self.data['args'] = dict(vars(args))

  @property
  def environment(self) -> Dict[str, Any]:
    return self.data['environment']

  def __getitem__(self, key: str) -> Any:
    return self.data[key]

  def __setitem__(self, key: str, value: Any) -> None:
    self.data[key] = value

  def header(self, title: str, *notes: str) -> List[str]:
    """Markdown opening lines: the title, the command, the environment, then `notes`
    (paragraphs)."""
    lines = [f'# {title}', '', f'Command: `{self.command}`', '',
             f'Environment: {self.environment}', '']
    for note in notes:
      lines += [note, '']
    return lines

  def write(self, markdown: Optional[Sequence[str]] = None, suffix: str = '') -> str:
    """Writes {out}{suffix}.json (all of `data`) and, given, {out}{suffix}.md (`markdown`:
    its lines); each file whole or not at all. Returns the Markdown text ('' if none)."""
    path = self.out + suffix
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    run_dir.write_atomic(path + '.json', json.dumps(self.data, indent=2, default=float) + '\n')
    text = '' if markdown is None else '\n'.join(markdown) + '\n'
    if markdown is not None:
      run_dir.write_atomic(path + '.md', text)
    return text

  def save_figure(self, fig: Any, suffix: str = '', dpi: int = 100) -> str:
    """Saves a matplotlib figure as {out}{suffix}.png (atomically) and closes it."""
    path = f'{self.out}{suffix}.png'
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=dpi)
    pyplot().close(fig)
    run_dir.write_atomic(path, buf.getvalue())
    return path
