"""The paper's Table 2 predicted from the compiled programs, with results/tree.json's
decodes at the paper's sizes (scripts/compiled_report.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'compiled_table2', order=190, needs=('tree',),
    steps=(Step('compiled_table2', 'compiled_report.py', (), timed=False,
                check=Check(exact=('models/*/flops', 'models/*/bytes', 'models/*/memory/*',
                                   'models/*/collectives/*')),
                headline=headlines.compiled, box=(3, 'TPU v4 / H200 (predicted, not measured)')),))
