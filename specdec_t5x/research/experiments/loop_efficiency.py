"""The speculative loop against its ideal, and where an iteration's time goes: the demo
family, batch 8, random-weight T5 v1.1 targets, and the demo's own configuration (its
feature head, gamma 1, float32 and bfloat16) (research/measure/loop_efficiency.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

_RUN = ('--experiment=loop_efficiency',)
_RANDOM = ('--num_examples', '4', '--max_len', '32', '--gammas', '3', '--temperatures', '0',
           '--matmuls', 'packed')
_KW = dict(made_by='loop_efficiency.py', headline=headlines.loop_efficiency)

EXPERIMENT = Experiment(
    'loop_efficiency', order=70, measure='specdec_t5x.research.measure.loop_efficiency', steps=(
        Step('loop_efficiency', 'compare_decodes.py', _RUN + (
            '--num_examples', '12', '--gammas', '2,3,4', '--temperatures', '0,1', '--repeats',
            '5'), quick=_RUN + ('--num_examples', '2', '--gammas', '3', '--temperatures', '0',
                                '--repeats', '1', '--matmuls', 'packed'), **_KW),
        Step('loop_efficiency_batch8', 'compare_decodes.py', _RUN + (
            '--num_examples', '16', '--batch', '8', '--matmuls', 'packed'), **_KW),
        Step('loop_efficiency_t5_1_1_small', 'compare_decodes.py',
             _RUN + ('--random_target', 'small') + _RANDOM, **_KW),
        Step('loop_efficiency_t5_1_1_base', 'compare_decodes.py',
             _RUN + ('--random_target', 'base') + _RANDOM, **_KW),
        Step('loop_efficiency_demo', 'compare_decodes.py', _RUN + (
            '--drafts', 'demo_feature_head_kd', '--gammas', '1', '--temperatures', '0',
            '--matmuls', 'packed,packed_bf16', '--num_examples', '24', '--repeats', '9'),
             headline=headlines.loop_efficiency),
    ))
