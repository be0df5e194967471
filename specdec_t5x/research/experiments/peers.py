"""Against Hugging Face and CTranslate2 on the same weights (research/measure/peers.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment('peers', order=80, measure='specdec_t5x.research.measure.peers', steps=(
    Step('peers', 'compare_decodes.py',
         ('--experiment=peers', '--num_examples', '20', '--repeats', '5'),
         headline=headlines.peers),))
