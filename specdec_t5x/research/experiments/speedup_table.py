"""Walltime speedup against gamma at batch 1 (the paper's Table 2 sweep) on the demo
family, with theory, ideal and efficiency (research/measure/speedup_table.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

_SPEC_ROWS = tuple('groups/*/rows' + p for p in (
    '*/tokens_per_target_call', '*/accepted_length_histogram/*', '*/same_tokens_as_ar',
    '*/generated_tokens'))
_CHECK = Check(exact=_SPEC_ROWS + ('groups/*/ar_tokens',),
               timing=('groups/*/best_measured_speedup',))

EXPERIMENT = Experiment(
    'speedup_table', order=60, measure='specdec_t5x.research.measure.speedup_table',
    needs=('alpha_demo',), steps=(
        Step('speedup_demo', 'compare_decodes.py', (
            '--experiment=speedup_table', '--num_examples', '10', '--gammas', '1,2,3,4,5',
            '--repeats', '3', '--drafts', 'demo_draft_m,demo_draft_s,bigram'),
             made_by='speedup_table.py', check=_CHECK, headline=headlines.speedup),
        Step('speedup_ende_t1_inverse_cdf', 'compare_decodes.py', (
            '--experiment=speedup_table', '--num_examples', '10', '--gammas', '2,3',
            '--repeats', '3', '--drafts', 'demo_draft_m', '--tasks', 'ende',
            '--temperatures', '1'),
             check=_CHECK),
        Step('speedup_table_ende12', 'compare_decodes.py', (
            '--experiment=speedup_table', '--num_examples', '12', '--tasks', 'ende',
            '--drafts', 'demo_draft_m', '--temperatures', '0,1', '--gammas', '2,3,4'),
             headline=headlines.efficiency_e2e),
    ))
