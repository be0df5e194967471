"""The draft's dynamic tree against chains: a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'dynamic_tree', order=130,
    steps=(Step(
        'dynamic_tree', 'compare_decodes.py', ('--experiment=dynamic_tree',),
        quick=('--experiment=dynamic_tree', '--tasks=ende', '--rows=1', '--max_len=8',
               '--temperatures=0', '--decodes=g2,g2+w2+n2', '--repeats=1'),
        check=Check(exact=DECODE_COUNTS, timing=SPEEDUP_VS_AR),
        headline=headlines.dynamic_tree),),
    preset=Preset(
        "The draft's dynamic tree vs chains at equal verified positions and draft calls",
        'g<gamma>: the chain; +w<W>: the draft grows gamma levels of W nodes, each level the '
        'W children of largest draft path probability (one draft call per level); +n<M>: '
        'of them the M of largest path probability are verified (else all), in one target '
        'call. g<k>+w<W>+n<k> verifies as many positions as g<k> after as many draft calls.',
        'g2,g3,g4,g6,g2+w2+n2,g3+w2+n3,g4+w2+n4,g6+w2+n6,g3+w3+n3,g3+w2',
        temperatures=(0.0, 1.0), repeats=2))
