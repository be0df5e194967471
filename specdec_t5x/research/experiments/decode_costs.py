"""Decode costs and implementation efficiency on random-weight T5 v1.1 shapes, float32 and
T5X's bfloat16 (scripts/bench_decode.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment('decode_costs', order=50, steps=(
    Step('decode_costs', 'bench_decode.py', (), headline=headlines.decode_costs),
    Step('decode_costs_bf16', 'bench_decode.py',
         ('--dtype', 'bfloat16', '--cpu_kernels', 'packed_bf16'),
         headline=headlines.decode_costs),
))
