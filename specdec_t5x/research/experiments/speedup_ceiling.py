"""The acceptance the demo would need on this machine for a speedup, from its real loops
(research/measure/ceiling_loops.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'speedup_ceiling', order=250, measure='specdec_t5x.research.measure.ceiling_loops',
    steps=(Step('speedup_ceiling', 'compare_decodes.py', ('--experiment=speedup_ceiling',),
                quick=('--experiment=speedup_ceiling', '--num_examples', '3', '--gammas', '1',
                       '--max_gamma', '2', '--repeats', '1'),
                headline=headlines.ceiling),))
