"""Demo-family inputs, texts, quality and row-by-row decodes shared by the result scripts.

The demo checkpoints load with evaluation.load_model; this module adds what several
scripts need around them: a task's encoder inputs with references and the tokenizer,
token ids back to text, the task's quality metric, and batch-1 decodes of many rows.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
import seqio

from specdec_t5x.algorithm import batching
from specdec_t5x.algorithm import stats as stats_lib
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration import infer_output, metrics
from specdec_t5x.research.measure import evaluation, grid, timed_rows
from specdec_t5x.research.results import harness



def load_task(task: str, num: int, input_len: int = 128) -> Tuple[np.ndarray, List[str], Any]:
  """-> (encoder inputs [num, input_len] int32, reference strings, the demo vocabulary as
  seqio.SentencePieceVocabulary) of the first `num` rows of the demo test sample of `task`."""
  examples = evaluation.load_examples(task, num, max_input_len=input_len)
  vocab = seqio.SentencePieceVocabulary(evaluation.DEMO_VOCAB)
  return (batching.pad_batch([e.inputs for e in examples], input_len, input_len),
          [e.reference for e in examples], vocab)


def texts(vocab: Any, tokens: Sequence[Sequence[int]], eos_id: int = 1) -> List[str]:
  """Decoded rows, exactly as the runner writes its predictions (infer_output.decode_text:
  each row cut at its first EOS, padding dropped)."""
  return [infer_output.decode_text(vocab, np.asarray(row), eos_id) for row in tokens]


def quality(task: str, refs: Sequence[str], preds: Sequence[str]) -> Dict[str, float]:
  """The task's metric: BLEU for 'ende', ROUGE (rouge1, rouge2, rougeLsum) otherwise."""
  return metrics.bleu(refs, preds) if task == 'ende' else dict(metrics.rouge(refs, preds))


def row_decoder(target, enc: np.ndarray, max_len: int, draft=None,
                **settings: Any) -> Callable[[], List[Any]]:
  """grid.Decoder over the rows of enc [N, L] (each alone, batch 1, at its length
  bucket) with DecodeConfig(**settings); calling it returns the N outputs. Time it with
  harness.interleaved."""
  return grid.Decoder(target, draft, enc, max_len, DecodeConfig(**settings))


def rates(stats: Dict[str, int]) -> Dict[str, Any]:
  """alpha and acceptance_rate (stats.summarize's; None when nothing was drafted), tokens
  per target call and drafts per target call."""
  s = stats_lib.summarize(stats)
  return {**stats_lib.rates(s),
          'mean_tokens_per_target_call': s['mean_tokens_per_target_call'],
          'drafts_per_step': s['drafted_tokens'] / s['target_calls']}


def row_results(timings: Any, base: str = 'AR') -> Dict[str, Dict[str, Any]]:
  """Per name of harness.interleaved over row_decoder fns (timed_rows.timed): median seconds,
  speedup_vs_ar (over `base`), rates, equal_to_ar and the summed statistics."""
  return {t.name: dict(seconds=t.seconds, speedup_vs_ar=t.speedup_vs_ar, **rates(t.stats),
                       equal_to_ar=t.equal_to_ar, **t.stats) for t in timed_rows.timed(timings, base)}


def alpha_cells(path: str) -> List[Dict[str, Any]]:
  """The alpha cells of results/alpha_demo.json (compare_decodes.py --experiment=alpha_demo;
  [] when it is missing)."""
  if not path or not os.path.exists(path):
    return []
  with open(path, encoding='utf-8') as f:
    return json.load(f)['cells']


def throughput_table(rows: Sequence[Dict[str, Any]]) -> List[str]:
  """Markdown table of speed.batch_throughput's rows."""
  return harness.table(
      ['batch', 'method', 'tokens/s', 'speedup vs AR', 'alpha', 'acceptance rate',
       'tokens/call', 'rows == batch-1'],
      [[r['batch'], r['method'], f"{r['tokens_per_s']:.1f}", f"{r['speedup_vs_ar']:.2f}x",
        harness.fmt(r['alpha']), harness.fmt(r['acceptance_rate']),
        f"{r['mean_tokens_per_target_call']:.2f}",
        f"{r['rows_equal_batch1']} ({r['rows_checked']} rows)"] for r in rows], 'rlrrrrrl')


def throughput_plot(ax, rows: Sequence[Dict[str, Any]]) -> None:
  """Tokens/s against batch size (log-log), a line per method, on a matplotlib axis."""
  for method in dict.fromkeys(r['method'] for r in rows):
    ax.plot(*zip(*[(r['batch'], r['tokens_per_s']) for r in rows if r['method'] == method]),
            marker='o', label=method)
  ax.set_xscale('log', base=2)
  ax.set_yscale('log')
  ax.set_xlabel('batch')
  ax.set_ylabel('tokens/s')
  ax.legend()
  ax.grid(alpha=0.3)
