"""The packed CPU matmul against XLA's dot on the demo family: call costs and decodes
(research/measure/cpu_kernel_bench.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'cpu_kernels', order=40, measure='specdec_t5x.research.measure.cpu_kernel_bench',
    steps=(Step('cpu_kernels', 'compare_decodes.py', ('--experiment=cpu_kernels',),
                headline=headlines.cpu_kernels),))
