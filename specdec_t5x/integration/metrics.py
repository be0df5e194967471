"""Text metrics matching T5's `t5.evaluation.metrics.bleu` and `.rouge`.

Both take `(targets, predictions)` lists of strings, the seqio `metric_fns` signature, and
return scores in [0, 100].

- `bleu`: sacrebleu corpus BLEU with exponential smoothing, the "intl" tokenizer, no
  lowercasing and no effective order, the settings of T5's `bleu`.
- `rouge`: rouge_score F-measures for rouge1, rouge2 and rougeLsum without stemming, with
  T5's sentence split for rougeLsum (" . " becomes " .\\n"). T5 reports the median of a
  random bootstrap of the mean; here the default is the exact mean (what the bootstrap
  estimates, and deterministic); `bootstrap=True` gives T5's procedure.
"""

from typing import Mapping, Sequence, Union

import sacrebleu
from rouge_score import rouge_scorer
from rouge_score import scoring

Text = Union[str, bytes]
ROUGE_KEYS = ('rouge1', 'rouge2', 'rougeLsum')


def _as_str(text: Text) -> str:
  return text.decode('utf-8') if isinstance(text, bytes) else text


def bleu(targets: Sequence[Text], predictions: Sequence[Text]) -> Mapping[str, float]:
  """Corpus BLEU of `predictions` against one reference each, as T5 computes it.

  Args:
    targets: reference strings, one per prediction.
    predictions: system outputs.

  Returns:
    {"bleu": score in [0, 100]}.
  """
  if len(targets) != len(predictions):
    raise ValueError(f'{len(targets)} targets but {len(predictions)} predictions.')
  score = sacrebleu.corpus_bleu(
      [_as_str(p) for p in predictions],
      [[_as_str(t) for t in targets]],
      smooth_method='exp',
      force=False,
      lowercase=False,
      tokenize='intl',
      use_effective_order=False,
  )
  return {'bleu': score.score}


def _split_sentences(summary: str) -> str:
  # rougeLsum splits summaries on newlines; T5 marks sentence ends this way.
  return summary.replace(' . ', ' .\n')


def rouge(
    targets: Sequence[Text],
    predictions: Sequence[Text],
    score_keys: Sequence[str] = ROUGE_KEYS,
    bootstrap: bool = False,
) -> Mapping[str, float]:
  """Mean ROUGE F-measures (x100) of `predictions` against `targets`.

  Args:
    targets: reference summaries, one per prediction.
    predictions: system summaries.
    score_keys: rouge_score types to report.
    bootstrap: if True, report the median of rouge_score's bootstrap resampling of
      the mean (T5's `rouge`, random); otherwise the exact mean (T5's `rouge_mean`).

  Returns:
    {key: F-measure x 100} for each of `score_keys`.
  """
  if len(targets) != len(predictions):
    raise ValueError(f'{len(targets)} targets but {len(predictions)} predictions.')
  if not targets:
    raise ValueError('ROUGE needs at least one (target, prediction) pair.')
  scorer = rouge_scorer.RougeScorer(rouge_types=list(score_keys))
  per_example = [
      scorer.score(target=_split_sentences(_as_str(t)),
                   prediction=_split_sentences(_as_str(p)))
      for t, p in zip(targets, predictions)
  ]
  if bootstrap:
    aggregator = scoring.BootstrapAggregator()
    for scores in per_example:
      aggregator.add_scores(scores)
    result = aggregator.aggregate()
    return {k: 100 * result[k].mid.fmeasure for k in score_keys}
  return {
      k: 100 * sum(s[k].fmeasure for s in per_example) / len(per_example)
      for k in score_keys
  }
