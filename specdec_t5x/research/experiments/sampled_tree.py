"""The draft's dynamic tree with levels drawn from q (t = 1): a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'sampled_tree', order=140,
    steps=(Step(
        'sampled_tree', 'compare_decodes.py', ('--experiment=sampled_tree',),
        quick=('--experiment=sampled_tree', '--tasks=ende', '--rows=1', '--max_len=8',
               '--decodes=g2,g2+w2s', '--repeats=1', '--precise=0'),
        check=Check(exact=DECODE_COUNTS + ('results/*/tpc_precise',), timing=SPEEDUP_VS_AR),
        headline=headlines.sampled_tree),),
    preset=Preset(
        "The draft's dynamic tree at temperature 1: levels drawn from q against top-W "
        'guesses and chains',
        'g<gamma>: the chain; +w<W>: gamma levels of W nodes, the W children of largest '
        'draft path probability, verified as fixed guesses; +w<W>s: each level W tokens '
        "drawn without replacement from the draft's q after the likeliest node of the level "
        'above, verified by recursive rejection without replacement. A tree of gamma levels '
        'makes as many draft calls as g<gamma> and verifies 1 + W gamma positions.',
        'g2,g3,g4,g6,g2+w2,g3+w2,g2+w2s,g3+w2s,g1+w3s,g2+w3s', temperatures=(1.0,),
        repeats=2, precise=64))
