"""Adaptive draft length against fixed gamma: a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'adaptive_gamma', order=100,
    steps=(Step(
        'adaptive_gamma', 'compare_decodes.py', ('--experiment=adaptive_gamma',),
        check=Check(exact=DECODE_COUNTS, timing=SPEEDUP_VS_AR),
        headline=headlines.best_of('speedup_vs_ar')),),
    preset=Preset(
        'Adaptive draft length against fixed gamma',
        'Fixed gammas against the confidence policy (max gamma 6, thresholds) and the '
        'running-alpha policy (max gamma 6, cost ratios c).',
        'g1,g2,g3,g4,g6,g6+conf0.3,g6+conf0.5,g6+conf0.7,g6+ra0.2,g6+ra0.4',
        tasks='ende', rows=6, max_len=40))
