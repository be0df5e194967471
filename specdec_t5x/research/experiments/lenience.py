"""Lenience: speed against quality (lossy): a decode comparison of
scripts/compare_decodes.py."""

from specdec_t5x.research.experiments._base import (SPEEDUP_VS_AR, Check, Experiment,
                                                     Preset, Step)
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'lenience', order=220,
    steps=(Step(
        'lenience', 'compare_decodes.py', ('--experiment=lenience',),
        check=Check(exact=('results/*/target_calls', 'results/*/generated_tokens', 'results/*/bleu',
                           'results/*/rouge*'), timing=SPEEDUP_VS_AR),
        headline=headlines.best_of('speedup_vs_ar')),),
    preset=Preset(
        'Lenience: speed against quality (l < 1 is LOSSY)',
        'Token verifier at temperature 1, all rows of a task in one batch (one rng for '
        'every setting); quality against the references.',
        'g4,g4+l0.5,g4+l0.3,g4+l0.1', tasks='ende,summarize', temperatures=(1.0,),
        rows=16, batch=0, quality=True))
