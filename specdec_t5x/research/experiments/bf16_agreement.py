"""What holds exactly in bfloat16: agreement with float32, its diagnosis, and its cost
(scripts/bf16_agreement.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step

EXPERIMENT = Experiment('bf16_agreement', order=30, steps=(
    Step('bf16_agreement', 'bf16_agreement.py', ('--gammas', '1,2,3,4,5,6,7'), timed=False,
         check=Check(exact=('bfloat16/*', 'bfloat16_packed_bf16/*', 'ar_bf16_vs_ar_f32/*'))),
    Step('bf16_agreement_diagnosis', 'bf16_agreement.py', ('--diagnose',), timed=False,
         out='bf16_agreement', check=Check(exact=('cells/*',))),
    Step('bf16_cost', 'bf16_agreement.py', ('--gammas', '3', '--time')),
))
