"""Trees against chains as the verified positions grow (8, 16, 32): a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'tree_budget', order=170,
    steps=(Step(
        'tree_budget', 'compare_decodes.py', ('--experiment=tree_budget',),
        quick=('--experiment=tree_budget', '--tasks=summarize', '--rows=1', '--max_len=8',
               '--decodes=g3,g2+w2+n1+c2,g2+w2+n3@demo_feature_head_kd'),
        check=Check(exact=DECODE_COUNTS + ('results/*/accepted_by_source/*',),
                    timing=SPEEDUP_VS_AR),
        headline=headlines.tree_budget),),
    preset=Preset(
        'Trees against chains as the verified positions grow: 8, 16 and 32',
        'g<gamma>: the chain (gamma + 1 positions); +w<W>+n<M>: the draft\'s dynamic tree '
        '(gamma levels of W, the M nodes of largest path probability verified: M + 1 '
        'positions after gamma draft calls); +c<n>: with a copy branch of n tokens grafted '
        'onto it (a mixed tree of M + n + 1 positions); @demo_feature_head_kd: the feature '
        'head drafts; @copy, @bigram: single-kind chains of prompt lookup and the n-gram '
        'table. Every tree makes at most as many draft calls as the chain of its positions.',
        'g7,g7+w4+n7,g7+w4+n5+c2,g15,g7+w4+n15,g7+w4+n11+c4,g15@copy,g15@bigram,'
        'g15@demo_feature_head_kd,g7+w4+n11+c4@demo_feature_head_kd,g31,g10+w6+n31,'
        'g10+w6+n27+c4',
        rows=64))  # a cell's programs stay within the JIT's mappings
