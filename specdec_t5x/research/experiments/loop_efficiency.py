"""The speculative loop against its ideal, and where an iteration's time goes: the demo
family, batch 8, and random-weight T5 v1.1 targets (scripts/loop_efficiency.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

_RANDOM = ('--num_examples', '4', '--max_len', '32', '--gammas', '3', '--temperatures', '0',
           '--matmuls', 'packed')

EXPERIMENT = Experiment('loop_efficiency', order=70, steps=(
    Step('loop_efficiency', 'loop_efficiency.py', (
        '--num_examples', '12', '--gammas', '2,3,4', '--temperatures', '0,1', '--repeats', '5'),
         quick=('--num_examples', '2', '--gammas', '3', '--temperatures', '0', '--repeats', '1',
                '--matmuls', 'packed'), headline=headlines.loop_efficiency),
    Step('loop_efficiency_batch8', 'loop_efficiency.py', (
        '--num_examples', '16', '--batch', '8', '--matmuls', 'packed'),
         headline=headlines.loop_efficiency),
    Step('loop_efficiency_t5_1_1_small', 'loop_efficiency.py',
         ('--random_target', 'small') + _RANDOM, headline=headlines.loop_efficiency),
    Step('loop_efficiency_t5_1_1_base', 'loop_efficiency.py',
         ('--random_target', 'base') + _RANDOM, headline=headlines.loop_efficiency),
))
