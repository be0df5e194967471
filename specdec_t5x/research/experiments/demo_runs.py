"""The demo command run fresh several times, as a new user sees it: the default draft,
demo_draft_m, and bfloat16 (research/measure/demo_runs.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

_CHECK = Check(exact=('runs/*/alpha', 'runs/*/acceptance_rate', 'runs/*/mean_tokens_per_target_call',
                      'runs/*/identical_predictions', 'runs/*/bleu/bleu',
                      'runs/*/baseline_bleu/bleu', 'runs/*/num_predictions'),
               timing=('runs/*/walltime_speedup_stats/pooled',))
_RUN = ('--experiment=demo_runs', '--runs', '3')
_KW = dict(check=_CHECK, headline=headlines.demo_runs)

EXPERIMENT = Experiment(
    'demo_runs', order=260, measure='specdec_t5x.research.measure.demo_runs', steps=(
        Step('demo_speedup_runs', 'compare_decodes.py', _RUN,
             quick=('--experiment=demo_runs', '--runs', '1'),
             box=(1, 'CPU, the demo command (measured)'), **_KW),
        Step('demo_draft_m_runs', 'compare_decodes.py',
             _RUN + ('--gin_file', 'configs/demo_draft_m.gin'), **_KW),
        Step('demo_bf16_runs', 'compare_decodes.py',
             _RUN + ('--gin_file', 'configs/demo_bf16.gin'), **_KW),
    ))
