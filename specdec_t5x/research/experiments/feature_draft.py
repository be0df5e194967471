"""The feature-reading draft head against the small draft model: acceptance, call costs
and speedup by output length (research/measure/feature_draft_table.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'feature_draft', order=230, measure='specdec_t5x.research.measure.feature_draft_table',
    steps=(Step(
        'feature_draft', 'compare_decodes.py', ('--experiment=feature_draft',),
        quick=('--experiment=feature_draft', '--num_examples', '4', '--timed_examples', '3',
               '--gammas', '1,3', '--timed_gammas', '3', '--temperatures', '0'),
        check=Check(exact=('acceptance/*',)), headline=headlines.feature_draft),))
