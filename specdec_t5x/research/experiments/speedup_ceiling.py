"""The acceptance the demo would need on this machine for a speedup, from its real loops
(scripts/speedup_ceiling.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment('speedup_ceiling', order=250, steps=(
    Step('speedup_ceiling', 'speedup_ceiling.py', (),
         quick=('--num_examples', '3', '--gammas', '1', '--max_gamma', '2', '--repeats', '1'),
         headline=headlines.ceiling),))
