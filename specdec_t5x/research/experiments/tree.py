"""Draft trees (copy branches, the draft's runner-ups) against chains: a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'tree', order=120,
    steps=(Step(
        'tree', 'compare_decodes.py', ('--experiment=tree',),
        quick=('--experiment=tree', '--tasks=ende', '--rows=1', '--max_len=8',
               '--temperatures=0', '--decodes=g2,g2+s1', '--repeats=1'),
        check=Check(exact=DECODE_COUNTS + ('results/*/accepted_by_source/*',),
                    timing=SPEEDUP_VS_AR),
        headline=headlines.tree),),
    preset=Preset(
        'Draft trees vs chains on the demo tasks',
        'g<gamma>: the chain; +c<n>: a copy branch of n tokens; +s<k1>.<k2>: the draft\'s '
        'k_t runner-up tokens at depth t, verified in the same target call.',
        'g2,g3,g5,g2+c3,g2+s1,g3+s2,g4+s1,g2+s2.1', temperatures=(0.0, 1.0), repeats=2))
