"""The demo command run fresh several times, as a new user sees it: the default draft,
demo_draft_m, and bfloat16 (scripts/demo_runs.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

_CHECK = Check(exact=('runs/*/alpha_empirical', 'runs/*/mean_tokens_per_target_call',
                      'runs/*/identical_predictions', 'runs/*/bleu/bleu',
                      'runs/*/baseline_bleu/bleu', 'runs/*/num_predictions'),
               timing=('runs/*/walltime_speedup_stats/pooled',))

EXPERIMENT = Experiment('demo_runs', order=260, steps=(
    Step('demo_speedup_runs', 'demo_runs.py', ('--runs', '3'), quick=('--runs', '1'),
         check=_CHECK, headline=headlines.demo_runs,
         box=(1, 'CPU, the demo command (measured)')),
    Step('demo_draft_m_runs', 'demo_runs.py', (
        '--runs', '3', '--gin_file', 'configs/demo_draft_m.gin'),
         check=_CHECK, headline=headlines.demo_runs),
    Step('demo_bf16_runs', 'demo_runs.py', (
        '--runs', '3', '--gin_file', 'configs/demo_bf16.gin'),
         check=_CHECK, headline=headlines.demo_runs),
))
