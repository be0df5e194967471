"""The decode comparisons of scripts/compare_decodes.py: decode variants against AR and the chain.

Every comparison decodes the same demo test rows with autoregressive decoding (AR, the
base) and with each of its decodes, timed interleaved after compilation (harness), and
reports per (task, temperature, decode) one row: alpha, tokens per target call, drafts per
step, accepted tokens by source, seconds, speedup over AR and over the best plain chain,
and whether the tokens equal AR's (greedy). A decode is named by a spec of
research/measure/decode_specs.py's grammar (g<gamma>[+c<n>][+w<W>]...[@<draft>]).

A `Preset` names one comparison's settings; the presets whose results/<name>.* files the
repository keeps are declared by their experiments (research/experiments/); any flag of
the script overrides a preset's value (--decodes included), so a new comparison is a new
experiment file or a command line, not a new script.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.drafts import CopyDraft
from specdec_t5x.research.experiments import Preset
from specdec_t5x.research.measure import demo_data, evaluation, grid, timed_rows
from specdec_t5x.research.measure.decode_specs import (DEFAULT_DRAFT, is_chain,  # noqa: F401
                                               parse_decode)

BASE = 'AR'


class Drafts:
  """The drafts of one task by name, each loaded once."""

  def __init__(self, task: str, vocab_size: int):
    self.task, self.vocab_size, self._loaded = task, vocab_size, {}

  def __getitem__(self, name: str):
    if name not in self._loaded:
      if name.startswith('copy'):
        fallback = name.partition(':')[2]
        if fallback:
          module, params = self[fallback]
          self._loaded[name] = (CopyDraft(self.vocab_size, fallback=module),
                                {'fallback': params})
        else:
          self._loaded[name] = (CopyDraft(self.vocab_size), {})
      else:
        self._loaded[name] = evaluation.load_model(name, task=self.task)
    return self._loaded[name]


def decoders(target, enc: np.ndarray, exp: Preset, task: str, temperature: float,
             drafts: Drafts) -> Dict[str, grid.Decoder]:
  """{name: grid.Decoder} for AR and each of exp.decodes, over the rows of `enc`."""
  batch = exp.batch or len(enc)
  out = {BASE: grid.Decoder(target, None, enc, exp.max_len,
                             DecodeConfig(gamma=1, temperature=temperature), batch=batch)}
  for spec in exp.decodes.split(','):
    settings, draft = parse_decode(spec)
    out[spec] = grid.Decoder(target, drafts[draft], enc, exp.max_len,
                              DecodeConfig(temperature=temperature, **settings), batch=batch)
  return out


def _totals(outs: Sequence[Any]) -> Tuple[np.ndarray, Dict[str, Any]]:
  """-> (tokens of every row [N, max_len], stats_lib.summarize of the statistics summed
  over the rows and calls: timed_rows.row_totals' and the batch statistics)."""
  tokens, per_example = timed_rows.row_totals(outs)
  per_batch = {k: np.sum([np.asarray(o.stats[k]) for o in outs], axis=0)
               for k in stats_lib.BATCH_STATS}
  return tokens, stats_lib.summarize({**per_example, **per_batch})


def rows_of(timings: Any, task: str, temperature: float, vocab=None, refs=None
            ) -> List[Dict[str, Any]]:
  """One result row per decode of harness.interleaved over `decoders`' fns (AR first):
  the decode's shape, its statistics, median seconds, speedups over AR and over the best
  plain chain (is_chain), whether its tokens equal AR's and, given refs, its quality."""
  rows = []
  for t in timed_rows.timed(timings, BASE, _totals):
    name, tokens, summary = t.name, t.tokens, t.stats
    settings, draft = parse_decode(name) if name != BASE else (None, None)
    config = DecodeConfig(**settings) if settings else None
    row = dict(task=task, temperature=temperature, decode=name, draft=draft,
               verified_positions=1 + config.tree_nodes if config else 1,
               draft_calls=config.gamma if config else 0,
               lossy=bool(config and config.lenience < 1.0),
               **summary, drafts_per_step=summary['drafted_tokens'] / summary['target_calls'],
               seconds=t.seconds, speedup_vs_ar=t.speedup_vs_ar, equal_to_ar=t.equal_to_ar)
    if refs is not None:
      row.update(demo_data.quality(task, refs, demo_data.texts(vocab, tokens)))
    rows.append(row)
  chains = [r['seconds'] for r in rows if is_chain(r['decode'])]
  for r in rows:
    r['speedup_vs_best_chain'] = min(chains) / r['seconds'] if chains else None
  return rows


def precise_tokens_per_call(decoder: grid.Decoder, seeds: int) -> Tuple[float, float]:
  """(mean, standard error) of per-row tokens per target call over `seeds` runs of
  `decoder` (each seed a different rng), so that a few-percent difference between two
  exact samplers resolves. A greedy decoder runs once: its rows do not depend on the rng
  (repeating them would only shrink the standard error)."""
  per_row: List[float] = []
  for seed in range(1 if decoder.config.sampling.greedy else seeds):
    runner = dataclasses.replace(decoder, seed=1000 * seed)
    for o in runner():
      gen, calls = (np.asarray(o.stats[k]) for k in ('generated_tokens', 'target_calls'))
      per_row += list(gen / np.maximum(calls, 1))
  arr = np.asarray(per_row)
  return float(arr.mean()), float(arr.std(ddof=1) / np.sqrt(len(arr)))
