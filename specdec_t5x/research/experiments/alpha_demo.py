"""alpha of each demo draft for the demo target, the paper's way (Table 3), and the
empirical acceptance of real speculative runs (research/measure/alpha_table.py)."""

from specdec_t5x.research.experiments._base import Check, Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'alpha_demo', order=10, measure='specdec_t5x.research.measure.alpha_table',
    steps=(Step(
        'alpha_demo', 'compare_decodes.py',
        ('--experiment=alpha_demo', '--num_tokens', '2000', '--spec_examples', '32'),
        timed=False,
        quick=('--experiment=alpha_demo', '--num_tokens', '100', '--spec_examples', '2',
               '--tasks', 'ende', '--drafts', 'demo_draft_s,bigram'),
        check=Check(exact=('cells/*/alpha', 'cells/*/beta_histogram/counts/*',
                           'cells/*/num_sequences', 'cells/*/speculative/*')),
        headline=headlines.alpha),))
