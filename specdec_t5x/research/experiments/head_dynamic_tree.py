"""The feature head's dynamic tree (EAGLE-2) against its chain: a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'head_dynamic_tree', order=160,
    steps=(Step(
        'head_dynamic_tree', 'compare_decodes.py', ('--experiment=head_dynamic_tree',),
        quick=('--experiment=head_dynamic_tree', '--tasks=ende', '--rows=1', '--max_len=8',
               '--temperatures=0',
               '--decodes=g2@demo_feature_head_kd,g2+w2+n2@demo_feature_head_kd',
               '--repeats=1', '--precise=0'),
        check=Check(exact=DECODE_COUNTS + ('results/*/tpc_precise',), timing=SPEEDUP_VS_AR),
        headline=headlines.head_dynamic_tree),),
    preset=Preset(
        "The feature head's dynamic tree (EAGLE-2) against its chain",
        '@demo_feature_head_kd: the feature head drafts; g<gamma>: its chain; +w<W>: it '
        'grows gamma levels of W nodes, each level the W children of largest head path '
        'probability (one head tree call per level, each node reading its parent\'s '
        'predicted feature); +n<M>: of them the M of largest path probability are verified '
        '(else all), in one target call; +w<W>s (t = 1): each level W tokens drawn without '
        'replacement from the head\'s q. g<k>+w2+n<k> verifies as many positions as g<k> '
        'after as many head calls; g3+w2+n5 as many as g5 after 3. g3: the small draft '
        'model\'s chain.',
        'g2@demo_feature_head_kd,g3@demo_feature_head_kd,g5@demo_feature_head_kd,'
        'g2+w2+n2@demo_feature_head_kd,g3+w2+n3@demo_feature_head_kd,'
        'g5+w2+n5@demo_feature_head_kd,g3+w2+n5@demo_feature_head_kd,'
        'g3+w2@demo_feature_head_kd,g2+w3@demo_feature_head_kd,g2+w3s@demo_feature_head_kd,'
        'g3', temperatures=(0.0, 1.0), precise=32))
