"""Against Hugging Face and CTranslate2 on the same weights (scripts/bench_peers.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment('peers', order=80, steps=(
    Step('peers', 'bench_peers.py', ('--num_examples', '20', '--repeats', '5'),
         headline=headlines.peers),))
