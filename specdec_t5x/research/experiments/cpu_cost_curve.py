"""Whether speculation pays on this CPU, by target size: verify-call costs and the
acceptance each speedup needs (research/measure/cost_curve.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'cpu_cost_curve', order=200, measure='specdec_t5x.research.measure.cost_curve', steps=(
        Step('cpu_cost_curve', 'compare_decodes.py', ('--experiment=cpu_cost_curve',),
             quick=('--experiment=cpu_cost_curve', '--sizes', 'demo', '--forms',
                    'float32:packed', '--ks', '1,2', '--repeats', '1'),
             headline=headlines.cost_curve,
             box=(2, 'CPU, by target size (call costs measured, speedup predicted)')),))
