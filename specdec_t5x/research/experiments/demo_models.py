"""Each demo model's quality (BLEU / ROUGE) on the committed test samples, with the
drafts' alpha beside it (research/measure/model_quality.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'demo_models', order=20, measure='specdec_t5x.research.measure.model_quality',
    needs=('alpha_demo',),
    steps=(Step(
        'demo_models', 'compare_decodes.py', ('--experiment=demo_models',), timed=False,
        made_by='eval_demo_models.py',
        check=Check(exact=('scores/*',)), headline=headlines.models),))
