"""Trees whose chain the feature head drafts, against single-kind chains: a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'head_tree', order=150,
    steps=(Step(
        'head_tree', 'compare_decodes.py', ('--experiment=head_tree',),
        quick=('--experiment=head_tree', '--tasks=summarize', '--rows=1', '--max_len=8',
               '--temperatures=0', '--decodes=g2@demo_feature_head_kd,g2+c2@demo_feature_head_kd',
               '--repeats=1', '--precise=0'),
        check=Check(exact=DECODE_COUNTS + ('results/*/accepted_by_source/*',
                                           'results/*/tpc_precise'),
                    timing=SPEEDUP_VS_AR),
        headline=headlines.head_tree),),
    preset=Preset(
        "Draft trees whose chain the feature head drafts, against single-kind chains",
        '@demo_feature_head_kd: the feature head (one layer over the target\'s features) '
        'drafts the chain; +c<n>: a copy branch of n tokens; +s<k1>.<k2>: the head\'s '
        'k_t runner-up tokens at depth t; all verified in one target call. g5@copy, '
        'g5@bigram, g5@demo_feature_head_kd and g5 (the small draft model) are the '
        'single-kind chains of 6 positions, as many as each tree of 6.',
        'g3@demo_feature_head_kd,g2+s1@demo_feature_head_kd,g5@demo_feature_head_kd,'
        'g2+c3@demo_feature_head_kd,g3+c2@demo_feature_head_kd,g3+s1.1@demo_feature_head_kd,'
        'g2+c2+s1@demo_feature_head_kd,g5@copy,g5@bigram,g5', temperatures=(0.0, 1.0),
        repeats=2, precise=32))
