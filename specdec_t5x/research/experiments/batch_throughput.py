"""Batched throughput: speculative against AR at batch 1 to 64
(research/measure/batch_bench.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'batch_throughput', order=210, measure='specdec_t5x.research.measure.batch_bench',
    steps=(Step(
        'batch_throughput', 'compare_decodes.py',
        ('--experiment=batch_throughput', '--batches=1,4,16,64', '--gammas=2,4', '--repeats=1'),
        made_by='bench_batch.py',
        check=Check(exact=('rows/*/target_calls', 'rows/*/generated_tokens',
                           'rows/*/rows_equal_batch1')),
        headline=headlines.batch),))
