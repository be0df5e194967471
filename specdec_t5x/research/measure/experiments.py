"""Named experiments of scripts/compare_decodes.py: decode variants against AR and the chain.

Every experiment decodes the same demo test rows with autoregressive decoding (AR, the
base) and with each of its decodes, timed interleaved after compilation (harness), and
reports per (task, temperature, decode) one row: alpha, tokens per target call, drafts per
step, accepted tokens by source, seconds, speedup over AR and over the best plain chain,
and whether the tokens equal AR's (greedy). A decode is named by a spec of
research/measure/decode_specs.py's grammar (g<gamma>[+c<n>][+w<W>]...[@<draft>]).

`EXPERIMENTS` holds the presets whose results/<name>.* files the repository keeps; any
flag of the script overrides a preset's value (--decodes included), so a new comparison
is a new preset or a command line, not a new script.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.drafts import CopyDraft
from specdec_t5x.research.measure import demo_data, evaluation, speed, timed_rows
from specdec_t5x.research.measure.decode_specs import (DEFAULT_DRAFT, is_chain,  # noqa: F401
                                               parse_decode)

BASE = 'AR'


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A preset of compare_decodes.py (every field is also a flag of the same name)."""
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


EXPERIMENTS: Dict[str, Experiment] = {
    'tree': Experiment(
        'Draft trees vs chains on the demo tasks',
        'g<gamma>: the chain; +c<n>: a copy branch of n tokens; +s<k1>.<k2>: the draft\'s '
        'k_t runner-up tokens at depth t, verified in the same target call.',
        'g2,g3,g5,g2+c3,g2+s1,g3+s2,g4+s1,g2+s2.1', temperatures=(0.0, 1.0), repeats=2),
    'dynamic_tree': Experiment(
        "The draft's dynamic tree vs chains at equal verified positions and draft calls",
        'g<gamma>: the chain; +w<W>: the draft grows gamma levels of W nodes, each level the '
        'W children of largest draft path probability (one draft call per level); +n<M>: '
        'of them the M of largest path probability are verified (else all), in one target '
        'call. g<k>+w<W>+n<k> verifies as many positions as g<k> after as many draft calls.',
        'g2,g3,g4,g6,g2+w2+n2,g3+w2+n3,g4+w2+n4,g6+w2+n6,g3+w3+n3,g3+w2',
        temperatures=(0.0, 1.0), repeats=2),
    'sampled_tree': Experiment(
        "The draft's dynamic tree at temperature 1: levels drawn from q against top-W "
        'guesses and chains',
        'g<gamma>: the chain; +w<W>: gamma levels of W nodes, the W children of largest '
        'draft path probability, verified as fixed guesses; +w<W>s: each level W tokens '
        "drawn without replacement from the draft's q after the likeliest node of the level "
        'above, verified by recursive rejection without replacement. A tree of gamma levels '
        'makes as many draft calls as g<gamma> and verifies 1 + W gamma positions.',
        'g2,g3,g4,g6,g2+w2,g3+w2,g2+w2s,g3+w2s,g1+w3s,g2+w3s', temperatures=(1.0,),
        repeats=2, precise=64),
    'head_tree': Experiment(
        "Draft trees whose chain the feature head drafts, against single-kind chains",
        '@demo_feature_head_kd: the feature head (one layer over the target\'s features) '
        'drafts the chain; +c<n>: a copy branch of n tokens; +s<k1>.<k2>: the head\'s '
        'k_t runner-up tokens at depth t; all verified in one target call. g5@copy, '
        'g5@bigram, g5@demo_feature_head_kd and g5 (the small draft model) are the '
        'single-kind chains of 6 positions, as many as each tree of 6.',
        'g3@demo_feature_head_kd,g2+s1@demo_feature_head_kd,g5@demo_feature_head_kd,'
        'g2+c3@demo_feature_head_kd,g3+c2@demo_feature_head_kd,g3+s1.1@demo_feature_head_kd,'
        'g2+c2+s1@demo_feature_head_kd,g5@copy,g5@bigram,g5', temperatures=(0.0, 1.0),
        repeats=2, precise=32),
    'head_dynamic_tree': Experiment(
        "The feature head's dynamic tree (EAGLE-2) against its chain",
        '@demo_feature_head_kd: the feature head drafts; g<gamma>: its chain; +w<W>: it '
        'grows gamma levels of W nodes, each level the W children of largest head path '
        'probability (one head tree call per level, each node reading its parent\'s '
        'predicted feature); +n<M>: of them the M of largest path probability are verified '
        '(else all), in one target call; +w<W>s (t = 1): each level W tokens drawn without '
        'replacement from the head\'s q. g<k>+w2+n<k> verifies as many positions as g<k> '
        'after as many head calls; g3+w2+n5 as many as g5 after 3. g3: the small draft '
        'model\'s chain.',
        'g2@demo_feature_head_kd,g3@demo_feature_head_kd,g5@demo_feature_head_kd,'
        'g2+w2+n2@demo_feature_head_kd,g3+w2+n3@demo_feature_head_kd,'
        'g5+w2+n5@demo_feature_head_kd,g3+w2+n5@demo_feature_head_kd,'
        'g3+w2@demo_feature_head_kd,g2+w3@demo_feature_head_kd,g2+w3s@demo_feature_head_kd,'
        'g3', temperatures=(0.0, 1.0), precise=32),
    'tree_budget': Experiment(
        'Trees against chains as the verified positions grow: 8, 16 and 32',
        'g<gamma>: the chain (gamma + 1 positions); +w<W>+n<M>: the draft\'s dynamic tree '
        '(gamma levels of W, the M nodes of largest path probability verified: M + 1 '
        'positions after gamma draft calls); +c<n>: with a copy branch of n tokens grafted '
        'onto it (a mixed tree of M + n + 1 positions); @demo_feature_head_kd: the feature '
        'head drafts; @copy, @bigram: single-kind chains of prompt lookup and the n-gram '
        'table. Every tree makes at most as many draft calls as the chain of its positions.',
        'g7,g7+w4+n7,g7+w4+n5+c2,g15,g7+w4+n15,g7+w4+n11+c4,g15@copy,g15@bigram,'
        'g15@demo_feature_head_kd,g7+w4+n11+c4@demo_feature_head_kd,g31,g10+w6+n31,'
        'g10+w6+n27+c4', rows=64),  # a cell's programs stay within the JIT's mappings
    'copy_draft': Experiment(
        'Copy (prompt-lookup) drafts against learned and n-gram drafts',
        'The same gamma with each draft; copy:<d> copies from the input and falls back '
        'to <d>; +conf stops drafting where the draft is unsure.',
        'g4,g4@bigram,g4@copy,g4+conf@copy,g4@copy:bigram,g4@copy:demo_draft_m', repeats=2),
    'adaptive_gamma': Experiment(
        'Adaptive draft length against fixed gamma',
        'Fixed gammas against the confidence policy (max gamma 6, thresholds) and the '
        'running-alpha policy (max gamma 6, cost ratios c).',
        'g1,g2,g3,g4,g6,g6+conf0.3,g6+conf0.5,g6+conf0.7,g6+ra0.2,g6+ra0.4',
        tasks='ende', rows=6, max_len=40),
    'lenience': Experiment(
        'Lenience: speed against quality (l < 1 is LOSSY)',
        'Token verifier at temperature 1, all rows of a task in one batch (one rng for '
        'every setting); quality against the references.',
        'g4,g4+l0.5,g4+l0.3,g4+l0.1', tasks='ende,summarize', temperatures=(1.0,),
        rows=16, batch=0, quality=True),
    'block_verification': Experiment(
        'Block verification against token-wise verification',
        'Both verifiers are exact, so each run is a different exact sample and timed rows '
        'differ in length; the precise tokens per call averages enough runs to resolve the '
        'few-percent gain block verification promises (Sun et al. 2025).',
        'g2,g2+block,g4,g4+block', tasks='ende,summarize', temperatures=(1.0,), rows=12,
        repeats=3, precise=64),
}

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


def decoders(target, enc: np.ndarray, exp: Experiment, task: str, temperature: float,
             drafts: Drafts) -> Dict[str, speed.Decoder]:
  """{name: speed.Decoder} for AR and each of exp.decodes, over the rows of `enc`."""
  batch = exp.batch or len(enc)
  out = {BASE: speed.Decoder(target, None, enc, exp.max_len,
                             DecodeConfig(gamma=1, temperature=temperature), batch=batch)}
  for spec in exp.decodes.split(','):
    settings, draft = parse_decode(spec)
    out[spec] = speed.Decoder(target, drafts[draft], enc, exp.max_len,
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


def precise_tokens_per_call(decoder: speed.Decoder, seeds: int) -> Tuple[float, float]:
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
