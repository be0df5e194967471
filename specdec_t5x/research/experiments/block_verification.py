"""Block verification against token-wise verification: a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (DECODE_COUNTS, SPEEDUP_VS_AR, Check,
                                                     Experiment, Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'block_verification', order=90,
    steps=(Step(
        'block_verification', 'compare_decodes.py', ('--experiment=block_verification',),
        check=Check(exact=DECODE_COUNTS + ('results/*/tpc_precise',), timing=SPEEDUP_VS_AR),
        headline=headlines.block),),
    preset=Preset(
        'Block verification against token-wise verification',
        'Both verifiers are exact, so each run is a different exact sample and timed rows '
        'differ in length; the precise tokens per call averages enough runs to resolve the '
        'few-percent gain block verification promises (Sun et al. 2025).',
        'g2,g2+block,g4,g4+block', tasks='ende,summarize', temperatures=(1.0,), rows=12,
        repeats=3, precise=64))
