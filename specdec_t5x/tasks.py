"""Stable public path of the seqio tasks (specdec_t5x.integration.tasks).

Importing it registers the tasks, so gin's MIXTURE_OR_TASK_MODULE may name it."""
from specdec_t5x.integration.tasks import TASK_NAMES, register_tasks

__all__ = ['register_tasks', 'TASK_NAMES']
