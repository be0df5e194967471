"""Decode costs and implementation efficiency on random-weight T5 v1.1 shapes, float32 and
T5X's bfloat16 (research/measure/decode_costs.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

_RUN = ('--experiment=decode_costs',)

EXPERIMENT = Experiment(
    'decode_costs', order=50, measure='specdec_t5x.research.measure.decode_costs', steps=(
        Step('decode_costs', 'compare_decodes.py', _RUN, headline=headlines.decode_costs),
        Step('decode_costs_bf16', 'compare_decodes.py',
             _RUN + ('--dtype', 'bfloat16', '--cpu_kernels', 'packed_bf16'),
             headline=headlines.decode_costs),
    ))
