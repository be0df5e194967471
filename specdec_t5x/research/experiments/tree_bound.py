"""The most tokens per target call any static draft tree could give a draft, greedy, from
teacher-forced ranks (research/measure/tree_bound_table.py)."""

from specdec_t5x.research.experiments._base import Experiment, Step
from specdec_t5x.research.results import headlines

EXPERIMENT = Experiment(
    'tree_bound', order=180, measure='specdec_t5x.research.measure.tree_bound_table',
    needs=('tree',),  # its greedy decodes, replayed
    steps=(Step(
        'tree_bound', 'compare_decodes.py', ('--experiment=tree_bound',), timed=False,
        quick=('--experiment=tree_bound', '--num_examples', '2', '--tasks', 'ende',
               '--drafts', 'demo_draft_s', '--max_nodes', '3'),
        made_by='tree_bound.py', headline=headlines.tree_bound),))
