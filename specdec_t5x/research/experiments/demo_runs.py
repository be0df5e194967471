"""The demo command run fresh several times, as a new user sees it: the default draft,
demo_draft_m, and bfloat16 (research/measure/demo_runs.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

_CHECK = Check(exact=('runs/*/alpha_empirical', 'runs/*/mean_tokens_per_target_call',
                      'runs/*/identical_predictions', 'runs/*/bleu/bleu',
                      'runs/*/baseline_bleu/bleu', 'runs/*/num_predictions'),
               timing=('runs/*/walltime_speedup_stats/pooled',))
_RUN = ('--experiment=demo_runs',)


def _step(name: str, flags: tuple, **kw) -> Step:
  """compare_decodes.py --experiment=demo_runs with `flags`; the committed file was made by
  scripts/demo_runs.py, since folded into it, with the same flags."""
  return Step(name, 'compare_decodes.py', _RUN + flags,
              made_with=' '.join(('python scripts/demo_runs.py',) + flags), check=_CHECK,
              headline=headlines.demo_runs, **kw)


EXPERIMENT = Experiment(
    'demo_runs', order=260, measure='specdec_t5x.research.measure.demo_runs', steps=(
        _step('demo_speedup_runs', ('--runs', '3'), quick=_RUN + ('--runs', '1'),
              box=(1, 'CPU, the demo command (measured)')),
        _step('demo_draft_m_runs', ('--runs', '3', '--gin_file', 'configs/demo_draft_m.gin')),
        _step('demo_bf16_runs', ('--runs', '3', '--gin_file', 'configs/demo_bf16.gin')),
    ))
