"""Greedy agreement of each draft with the demo target, by the target's top-1 probability
(research/measure/agreement_table.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

_DRAFTS = 'demo_feature_head_4k,demo_feature_head_kd,demo_feature_head_fused,demo_draft_m'

EXPERIMENT = Experiment(
    'agreement_by_confidence', order=240,
    measure='specdec_t5x.research.measure.agreement_table',
    steps=(Step(
        'agreement_by_confidence', 'compare_decodes.py',
        ('--experiment=agreement_by_confidence', '--drafts', _DRAFTS), timed=False,
        quick=('--experiment=agreement_by_confidence', '--num_examples', '2', '--tasks',
               'ende'),
        made_by='agreement_by_confidence.py',
        headline=headlines.confidence),))
