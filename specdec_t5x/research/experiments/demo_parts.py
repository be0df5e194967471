"""A demo batch's time itemized (prefill, decoder calls, the loop's own work, the work
outside the compiled program), for the demo's run files (research/measure/call_parts.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'demo_parts', order=75, measure='specdec_t5x.research.measure.call_parts',
    steps=(Step(
        'demo_parts', 'compare_decodes.py', ('--experiment=demo_parts', '--repeats', '5'),
        quick=('--experiment=demo_parts', '--num_examples=2', '--repeats=1',
               '--gin_files=configs/demo.gin'),
        check=Check(exact=('files/*/rows/*/target_calls', 'files/*/rows/*/drafted_tokens',
                           'files/*/rows/*/generated_tokens')),
        headline=headlines.demo_parts),))
