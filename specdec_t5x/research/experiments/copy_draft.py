"""Copy (prompt-lookup) drafts against learned and n-gram drafts: a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'copy_draft', order=110,
    steps=(Step(
        'copy_draft', 'compare_decodes.py', ('--experiment=copy_draft',),
        check=Check(exact=DECODE_COUNTS, timing=SPEEDUP_VS_AR),
        headline=headlines.best_of('speedup_vs_ar')),),
    preset=Preset(
        'Copy (prompt-lookup) drafts against learned and n-gram drafts',
        'The same gamma with each draft; copy:<d> copies from the input and falls back '
        'to <d>; +conf stops drafting where the draft is unsure.',
        'g4,g4@bigram,g4@copy,g4+conf@copy,g4@copy:bigram,g4@copy:demo_draft_m', repeats=2))
