"""What holds exactly in bfloat16: agreement with float32, its diagnosis, and its cost
(research/measure/bf16_agreement.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step

_RUN = ('--experiment=bf16_agreement',)

EXPERIMENT = Experiment(
    'bf16_agreement', order=30, measure='specdec_t5x.research.measure.bf16_agreement', steps=(
        Step('bf16_agreement', 'compare_decodes.py', _RUN + ('--gammas', '1,2,3,4,5,6,7'),
             timed=False, made_by='bf16_agreement.py',
             check=Check(exact=('bfloat16/*', 'bfloat16_packed_bf16/*',
                                'ar_bf16_vs_ar_f32/*'))),
        Step('bf16_agreement_diagnosis', 'compare_decodes.py', _RUN + ('--diagnose',),
             timed=False, out='bf16_agreement', made_by='bf16_agreement.py',
             check=Check(exact=('cells/*',))),
        Step('bf16_cost', 'compare_decodes.py', _RUN + ('--gammas', '3', '--time'),
             made_by='bf16_agreement.py'),
    ))
